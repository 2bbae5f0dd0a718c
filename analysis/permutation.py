"""The permutation-traversal study's tables and figures (PAPERS.md section 3) from a finished sweep.

Inputs, made by:

    loopscale sweep --sweep=sweeps/permutation.py:paper --workdir=runs/permutation
    for r in runs/permutation/runs/*/; do loopscale eval --workdir=$r --what=accuracy; done
    for r in runs/permutation/runs/*/; do
        loopscale eval --workdir=$r --what=lens,probes,patching --batches=64; done  # or chosen runs
    .venv/bin/python analysis/permutation.py --workdir=runs/permutation [--threshold=0.9]

(`loopscale plan --sweep=sweeps/permutation.py:paper --out=plan.csv` lists the 36 runs; the
default `tiny` sweep is a CPU smoke test whose runs stay at chance.)

Writes DIR/report.md (default WORKDIR/analysis) and PNGs: the per-seed success table of looped
4x8 against unshared 32 layers across learning rates, with and without intermediate supervision
(success: final held-out answer accuracy at least --threshold, from eval/accuracy.json or else
summary.json `final_eval_accuracy`, beside the shortcut accuracy of answering the start node);
then, for one run per family (the most accurate one measured, or --runs=ID,...), the ladder of
the logit lens and the linear probes (eval/lens.json, probes.json) and the activation-patching
maps (eval/patching.json). Runs lacking a measurement are named in the report.
"""

from __future__ import annotations

import argparse

import common

from loopscale.config import DataSource
from loopscale.data.permutation import shortcut_probability
from loopscale.errors import UsageError
from loopscale.scaling.report import Section, Table

LADDER = ("lens", "probes")


def accuracy(run: common.Run) -> tuple[float | None, float | None, str]:
    """(final answer accuracy, shortcut accuracy, where they come from)."""
    result = run.eval("accuracy")
    if result is not None:
        return result["accuracy"], result["shortcut"], "eval/accuracy.json"
    acc = run.summary.get("final_eval_accuracy")
    if acc is None:
        return None, None, "not measured"
    rows = [r for r in run.metrics() if "eval_shortcut" in r]
    return acc, rows[-1]["eval_shortcut"] if rows else None, "summary.json"


def setting(run: common.Run) -> tuple[str, str, float, bool]:
    c = run.config
    return run.family, f"{c.model.n_unique} x {c.model.n_loops}", c.train.lr, \
        c.train.intermediate_supervision


def success_sections(runs: list[common.Run], threshold: float) -> list[Section]:
    rows, groups, unmeasured = [], {}, []
    for run in runs:
        c = run.config
        acc, shortcut, source = accuracy(run)
        ok = None if acc is None else acc >= threshold
        expected = shortcut_probability(c.data.n_nodes, c.data.hops_min, c.data.hops_max)
        family, shape, lr, sup = setting(run)
        rows.append((run.run_id, family, shape, common.num(lr), common.num(sup), str(c.seed),
                     run.status,
                     common.num(acc), common.num(shortcut), common.num(expected), source,
                     "?" if ok is None else common.num(ok)))
        group = groups.setdefault((family, shape, lr, sup), [0, 0, 0])
        if ok is None:
            group[2] += 1
            unmeasured.append(run)
        else:
            group[0] += ok
            group[1] += 1
    summary = [(f, s, common.num(lr), common.num(sup), f"{n_ok} / {n}",
                str(n_missing)) for (f, s, lr, sup), (n_ok, n, n_missing) in sorted(groups.items())]
    total_ok = sum(g[0] for g in groups.values())
    blocks: list = [
        (f"Success: final held-out answer accuracy at least {threshold:g} (eval/accuracy.json "
        "where measured, else summary.json final_eval_accuracy, the trainer's last "
        "evaluation). Shortcut: the accuracy of answering the start node on the same "
        "examples; expected: its value for uniform permutations over the run's hop range. "
        f"{total_ok} of {sum(g[1] for g in groups.values())} measured runs succeed."),
        Table(("family", "layers x loops", "lr", "intermediate supervision", ("succeeded / "
               "measured seeds"), "not measured"), tuple(summary)),
        Table(("run", "family", "layers x loops", "lr", "intermediate supervision", "seed", "status",
               "accuracy", "shortcut", "shortcut expected", "source", "success"), tuple(rows))]
    gap = common.missing(unmeasured, "no accuracy: neither eval/accuracy.json nor "
                                     "final_eval_accuracy")
    if gap:
        blocks.append(gap)
    return [Section("Success per seed", "success", tuple(blocks))]


def pick(runs: list[common.Run], names: tuple[str, ...], wanted: list[str]) -> list[common.Run]:
    """The runs named by --runs, else per family the most accurate one measured by `names`."""
    if wanted:
        return [r for r in runs if r.run_id in wanted]
    best: dict[str, tuple[float, common.Run]] = {}
    for run in runs:
        if all(run.eval(n) is None for n in names):
            continue
        acc = accuracy(run)[0]
        score = -1.0 if acc is None else acc
        if run.family not in best or score > best[run.family][0]:
            best[run.family] = (score, run)
    return [run for _, run in best.values()]


def supervised(run: common.Run) -> bool:
    return bool(run.config.train.intermediate_supervision)


def pick_ladder(runs: list[common.Run], wanted: list[str]) -> tuple[list[common.Run], list[str]]:
    """The runs whose ladder to show, and notes on them. A ladder is read from a run trained
    without intermediate supervision (its loss puts hop j's node at loop boundary j, so a
    supervised run's ladder is the one it was taught): per family the most accurate such run
    measured, else, noted, the most accurate supervised one. --runs names them instead."""
    if wanted:
        chosen = [r for r in runs if r.run_id in wanted]
        return chosen, [f"{common.label(r)} was trained with intermediate supervision: its "
                        "ladder was taught, not found." for r in chosen if supervised(r)]
    measured = [r for r in runs if any(r.eval(n) is not None for n in LADDER)]
    chosen, notes = [], []
    for family in sorted({r.family for r in measured}):
        of_family = [r for r in measured if r.family == family]
        free = [r for r in of_family if not supervised(r)]
        if not free:
            notes.append(f"Family {family}: only runs trained with intermediate supervision are "
                         "measured, so its ladder below was taught, not found; measure an "
                         "unsupervised run for the study's ladder.")
        chosen += pick(free or of_family, LADDER, [])
    return chosen, notes


def partner_every(run: common.Run, chosen: list[common.Run]) -> int | None:
    """For an unshared run, the n_unique of a chosen looped run of the same effective depth
    (its loop boundary k is the unshared run's layer k * n_unique); None otherwise."""
    m = run.config.model
    if m.n_loops > 1:
        return None
    for other in chosen:
        o = other.config.model
        if o.n_loops > 1 and o.n_unique * o.n_loops == m.n_unique * m.n_loops:
            return o.n_unique
    return None


def matched_view(run: common.Run, x: dict, chosen: list[common.Run]) -> dict | None:
    """The result's matched points, at the looped partner's unit for an unshared run; None for a
    result measured before matched points were (re-measure it)."""
    from loopscale.evaluate import ladder

    if "matched" not in x:
        return None
    every = partner_every(run, chosen)
    return x["matched"] if every is None else ladder.rematched(x, every)


def deviations(view: dict) -> str:
    walks = view.get("walks") or {}
    return " ".join(f"H={h}: {common.num(w['deviation'], 3)}" for h, w in walks.items())


def ladder_row(run: common.Run, name: str, x: dict | None) -> tuple[str, ...]:
    """One row of the ladder table: a run's readout `name` (lens.json or probes.json as `x`)."""
    sup = common.num(supervised(run))
    if x is None:
        return (run.family, run.run_id, name, "not measured", "", "", "", "", sup, "", "", "")
    return (run.family, run.run_id, name, common.num(x["ladder_match"]),
            common.num(x["diagonal"]),
            " ".join(map(str, x["best_hop"])) if x.get("best_hop") else "–",
            common.num(x.get("final_answer")), common.num(x.get("chance")), sup,
            common.num(x.get("rank_correlation")), common.num(x.get("uniform_deviation")),
            common.num(x.get("at_chance")))


def matched_blocks(rows: list[tuple], panels: list[tuple[str, dict]], figures: list) -> list:
    """The matched points' explanation, table and figure (appended to `figures`)."""
    from loopscale.evaluate import ladder

    fig = common.Figure("ladder_matched", "Ladders at matched points",
                        "Matched point x hop: share naming the node, best hop in red.",
                        common.png(ladder.plot_matched(panels, "ladders at matched points")))
    figures.append(fig)
    return ["Matched points: a looped model's loop boundary k beside an unshared stack's layer "
            "k x n_unique (the looped model's n_unique), so both ladders read on one axis.",
            Table(("family", "run", "readout", "layers per point", "best hop per matched point",
                   "rank correlation", "deviation per walk length"), tuple(rows)),
            common.image(fig)]


def ladder_section(runs: list[common.Run], wanted: list[str], figures: list) -> Section:
    from loopscale.evaluate import ladder

    blocks: list = [
        ("Per loop iteration, the share of held-out examples whose stream at the answer "
        "position names the node after hop j: by the logit lens (eval/lens.json) and by linear "
        "probes fitted on generated examples (L2 strength cross-validated) and scored on the "
        "held-out ones (eval/probes.json). ladder_match: share of iterations k whose best hop "
        "is k (1 = one hop per iteration); diagonal: mean share of iteration k naming hop k; "
        "rank correlation: Spearman's rho of matched point k with its best hop; deviation: mean "
        "|best hop - k H / K| (K matched points), per walk length H, 0 for a ladder that "
        "spreads every walk evenly over its iterations. Ladders are read from runs trained "
        "without intermediate supervision; a run whose final answers are not clearly above "
        "chance and the shortcut (95% interval) is at chance: nothing of its ladder is scored "
        "or drawn.")]
    rows, matched_rows, matched_panels, at_chance = [], [], [], []
    chosen, notes = pick_ladder(runs, wanted)
    for run in chosen:
        results = [(n, run.eval(n)) for n in LADDER]
        for name, x in results:
            rows.append(ladder_row(run, name, x))
            if x is None:
                continue
            if x.get("at_chance"):
                at_chance.append(f"{common.label(run)} {name}: {x['at_chance_reason']}")
                continue
            view = matched_view(run, x, chosen)
            if view is not None:
                matched_rows.append((run.family, run.run_id, name, str(view["every"]),
                                     " ".join(map(str, view["best_hop"])),
                                     common.num(view["rank_correlation"]), deviations(view)))
                matched_panels.append((f"{run.family} {name}", view))
        present = [(f"{run.family} {n}", x) for n, x in results
                   if x is not None and not x.get("at_chance")]
        if present:
            fig = common.Figure(f"ladder_{run.run_id}", f"Ladder of {run.family} ({run.run_id})",
                                "Iteration x hop and depth x hop: share naming the node.",
                                common.png(ladder.plot(present, f"{run.family} ({run.run_id})")))
            figures.append(fig)
            blocks.append(common.image(fig))
    if rows:
        blocks.insert(1, Table(("family", "run", "readout", "ladder_match", "diagonal",
                                "best hop per iteration", "final answer", "chance",
                                "intermediate supervision", "rank correlation", "deviation",
                                "at chance"), tuple(rows)))
    blocks[2:2] = notes
    if at_chance:
        blocks.append("No ladder drawn or scored (at chance): " + "; ".join(at_chance) + ".")
    if matched_rows:
        blocks += matched_blocks(matched_rows, matched_panels, figures)
    gap = common.missing([r for r in runs if all(r.eval(n) is None for n in LADDER)],
                         "no eval/lens.json or probes.json")
    if gap:
        blocks.append(gap)
    return Section("The ladder", "ladder", tuple(blocks))


def per_iteration(flips: list | None, position: int) -> str:
    if flips is None:
        return "undefined (no answers differ)"
    return " ".join(common.num(row[position], 3) for row in flips)


def patching_section(runs: list[common.Run], wanted: list[str], figures: list) -> Section:
    from loopscale.evaluate.patching import plot_patching

    blocks: list = [
        ("The clean run's stream at one (iteration, position) replaced by a corrupted twin's "
        "(another start node; eval/patching.json). Flip share: examples whose answer becomes "
        "the corrupted run's, among those where the two answer differently; per iteration at "
        "the start node's position and at the answer position.")]
    rows = []
    for run in pick(runs, ("patching",), wanted):
        x = run.eval("patching")
        if x is None:
            rows.append((run.family, run.run_id, "not measured", "", "", "", ""))
            continue
        start = x["positions"].index("start")
        flips = x["iteration_flip_share"]
        rows.append((run.family, run.run_id, common.num(x["clean_accuracy"]),
                     common.num(x["answers_differ"]), per_iteration(flips, start),
                     per_iteration(flips, x["answer_pos"]),
                     str(x["examples"])))
        fig = common.Figure(f"patching_{run.run_id}", f"Patching of {run.family} ({run.run_id})",
                            "Flip share and normalised logit difference, iteration x position.",
                            common.png(plot_patching(x, f"{run.family} ({run.run_id})")))
        figures.append(fig)
        blocks.append(common.image(fig))
    if rows:
        blocks.insert(1, Table(("family", "run", "clean accuracy", "answers differ",
                                "flip share at start, per iteration",
                                "flip share at answer position, per iteration", "examples"),
                               tuple(rows)))
    gap = common.missing([r for r in runs if r.eval("patching") is None],
                         "no eval/patching.json")
    if gap:
        blocks.append(gap)
    return Section("Activation patching", "patching", tuple(blocks))


def analyse(all_runs: list[common.Run], args: argparse.Namespace) -> common.Analysis:
    runs = [r for r in all_runs if r.config is not None]
    wrong = [r for r in runs if r.config.data.source is not DataSource.PERMUTATION]
    if wrong:
        raise UsageError(f"--workdir {args.workdir}: run {wrong[0].run_id} does not train on "
                         "the permutation task")
    runs.sort(key=lambda r: (setting(r), r.config.seed, r.run_id))
    wanted = [w.strip() for w in (args.runs or "").split(",") if w.strip()]
    unknown = sorted(set(wanted) - {r.run_id for r in runs})
    if unknown:
        raise UsageError(f"--runs: no trained run {unknown[0]} in {args.workdir}")
    if not 0.0 <= args.threshold <= 1.0:
        raise UsageError(f"--threshold must be between 0 and 1, got {args.threshold}")
    figures: list = []
    sections = [*success_sections(runs, args.threshold),
                ladder_section(runs, wanted, figures), patching_section(runs, wanted, figures)]
    untrained = common.missing([r for r in all_runs if r.config is None], "not trained yet")
    if untrained:
        sections.insert(0, Section("Not trained", "untrained", (untrained,)))
    return common.Analysis("Permutation traversal: " + args.workdir, tuple(sections),
                           tuple(figures))


def extra_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threshold", type=float, default=0.9,
                        help="a run succeeds when its final answer accuracy is at least this")
    parser.add_argument("--runs", default=None,
                        help="comma-separated run ids whose ladder and patching maps to draw "
                             "(default: per family the most accurate one measured)")


main = common.entry(__doc__.split("\n\n")[0], analyse, extra_args)

if __name__ == "__main__":
    raise SystemExit(main())
