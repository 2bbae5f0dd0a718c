"""The sparse-layers study's figures and tables (PAPERS.md section 2) from a finished sweep.

Inputs, made by:

    loopscale sweep --sweep=sweeps/isoflop_cpu.py:full --sweep.seeds=0,1 --workdir=runs/frontiers --concurrency=2
    for r in runs/frontiers/runs/*/; do loopscale eval --workdir=$r --what=early_exit,jsd; done
    for r in runs/frontiers/runs/*/; do loopscale eval --workdir=$r --what=routing; done  # Looped-MoE
    .venv/bin/python analysis/frontiers.py --workdir=runs/frontiers --params-column=params_active

(`sweeps/isoflop_paper.py` is the study's grid; `s.measure = "early_exit,jsd"` in a sweep file
measures each run as it completes; `routing` refuses a dense run and one without loops,
exit 2.)

Writes DIR/report.md (default WORKDIR/analysis), fit.json and PNGs: the four families' IsoFLOP
curves, compute frontiers and L_opt against N_opt with exponents and bootstrap intervals (the fit
and report functions of `loopscale fit` / `loopscale report`, on the table `loopscale collect`
makes, so the exponents are `loopscale fit`'s with the same flags), unique against effective and
active parameters per family and width, routing divergence across loop passes (eval/routing.json),
the early-exit table in the layout of the study's Table 7 (perplexity at full depth and at
5/10/20/30% of forward FLOPs saved; eval/early_exit.json) and the JSD after each layer from the
final one (eval/jsd.json). Where a figure's input is missing the report names the runs that lack it.
"""

from __future__ import annotations

import argparse
import json
import math

import common
import numpy as np

from loopscale.commands.common import add_fit_args, fit_options_args
from loopscale.config import FFNKind
from loopscale.errors import UsageError
from loopscale.evaluate.early_exit import SAVED_TARGETS
from loopscale.scaling import report as rep
from loopscale.scaling.report import Section, Table

FIT_SECTIONS = ("warnings", "exponents", "estimators", "comparison", "holdout", "recurrence",
                "minima")
FIT_FIGURES = ("isoflop", "frontiers", "loss_vs_params", "holdout")


def fit(args: argparse.Namespace) -> tuple[dict | None, list, str | None]:
    """(fit.json document, figures, why there is no fit) of the sweep, as `loopscale report`
    fits it (its flags: --params-column, --bootstrap, --seed, --level, --spline, --grid,
    --holdout, --fit.E_min/--fit.E_max)."""
    import matplotlib

    from loopscale.scaling import FitError, plots
    from loopscale.scaling import fit as fitting
    from loopscale.scaling.table import Columns
    from loopscale.sweep.collect import results_table

    columns = Columns(params=args.params_column, tokens=args.tokens_column,
                      loss=args.loss_column, flops=args.flops_column)
    try:
        result = fitting.fit_results(results_table(args.workdir, columns),
                                     fitting.FitOptions(**fit_options_args(args)))
        doc = fitting.fit_document(result, args.workdir)
    except (UsageError, FitError) as e:  # a sweep not yet fittable still gets the rest
        return None, [], str(e)
    figures = []
    with matplotlib.rc_context(plots.STYLE):
        for stem, title, caption, draw in plots.figures_for(result):
            if stem in FIT_FIGURES:
                figures.append(common.Figure(stem, title, caption, common.png(draw(result))))
    return doc, figures, None


def budget(run: common.Run) -> float:
    value = run.row.get("budget")
    try:
        return float(value) if value not in (None, "") else 0.0
    except ValueError:
        return 0.0


def chosen(runs: list[common.Run], name: str) -> list[tuple[common.Run, dict]]:
    """Per family, the measured run (eval/NAME.json) at the largest budget with the lowest
    final eval loss: the budget's best size, the study's compute-optimal model."""
    best: dict[str, tuple] = {}
    for run in runs:
        result = run.eval(name)
        if result is None:
            continue
        loss = run.row.get("final_eval_loss")
        key = (-budget(run), loss if isinstance(loss, float) else math.inf)
        if run.family not in best or key < best[run.family][0]:
            best[run.family] = (key, run, result)
    return [(run, result) for _, run, result in best.values()]


def width(run: common.Run) -> str:
    return str(run.config.model.d_model) if run.config else "?"


def params_section(runs: list[common.Run]) -> Section:
    shapes: dict[tuple, common.Run] = {}
    for run in runs:
        if run.config is not None:
            m = run.config.model
            shapes.setdefault((run.family, m.d_model, m.n_unique, m.n_loops), run)
    rows = []
    for (family, d, n_unique, n_loops), run in sorted(shapes.items()):
        p = {k: run.row.get(k) for k in ("params_unique", "params_effective", "params_active")}
        p = {k: float(v) if v not in (None, "") else None for k, v in p.items()}
        u = p["params_unique"]
        rows.append((family, str(d), f"{n_unique} x {n_loops}", common.num(u),
                     common.num(p["params_effective"]), common.num(p["params_active"]),
                     common.num(p["params_effective"] / u if u and p["params_effective"] else None),
                     common.num(p["params_active"] / u if u and p["params_active"] else None)))
    return Section("Unique, effective and active parameters", "params", (
        ("Per family and width (flops.py's counts, as the plan records them): unique = stored "
        "without embeddings, effective = unique once per loop pass, active = per pass with the "
        "top-k experts only, embeddings included (the study's N)."),
        Table(("family", "d_model", "layers x loops", "unique", "effective", "active",
               "effective / unique", "active / unique"), tuple(rows))))


def routing_section(runs: list[common.Run], figures: list) -> Section:
    # Routing is compared across loop passes: only looped MoE runs have any.
    moe = [r for r in runs if r.config is not None and r.config.model.ffn is FFNKind.MOE
           and r.config.model.n_loops > 1]
    have = [(r, r.eval("routing")) for r in moe]
    blocks: list = [("Per physical layer, a token's top-k experts on consecutive loop passes: "
                    "shares identical / partly shared / disjoint (eval/routing.json), mean over "
                    "layers; the figure shows each layer of the chosen run per family.")]
    rows = [(r.family, r.run_id, width(r), common.num(budget(r) or None),
             common.num(x["identical_mean"]), common.num(1 - x["identical_mean"]
                                                         - x["disjoint_mean"]),
             common.num(x["disjoint_mean"]), common.num(x["unique_experts_mean"]))
            for r, x in have if x is not None]
    if rows:
        blocks.append(Table(("family", "run", "d_model", "budget", "identical", "partial",
                             "disjoint", "distinct experts"), tuple(rows)))
        import matplotlib.pyplot as plt

        picks = chosen(moe, "routing")
        fig, axes = plt.subplots(1, len(picks), figsize=(3.4 * len(picks) + 0.6, 3.0),
                                 squeeze=False)
        for ax, (run, x) in zip(axes[0], picks):
            bottom = np.zeros(len(x["layers"]))
            for key in ("identical", "partial", "disjoint"):
                ax.bar(x["layers"], x[key], bottom=bottom, label=key)
                bottom += np.asarray(x[key])
            ax.set(title=f"{run.family} d {width(run)}", xlabel="physical layer", ylim=(0, 1))
        axes[0, 0].set_ylabel("share of tokens")
        axes[0, -1].legend(fontsize="x-small")
        fig.tight_layout()
        figure = common.Figure("routing", "Routing across loop passes",
                               "Top-k sets on consecutive passes, per physical layer.",
                               common.png(fig))
        figures.append(figure)
        blocks.append(common.image(figure))
    elif not moe:
        blocks.append("No looped MoE run in the sweep.")
    gap = common.missing([r for r, x in have if x is None], "no eval/routing.json")
    if gap:
        blocks.append(gap)
    return Section("Routing divergence", "routing", tuple(blocks))


def lines_figure(stem: str, title: str, caption: str, lines, **axes) -> common.Figure:
    """One line per (x, y, label), on one pair of axes set with `axes`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    for x, y, name in lines:
        ax.plot(x, y, marker=".", lw=1, label=name)
    ax.set(**axes)
    ax.legend(fontsize="x-small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return common.Figure(stem, title, caption, common.png(fig))


def unmeasured(runs: list[common.Run], name: str) -> list[str]:
    """The sentence naming the trained runs without eval/NAME.json, if any."""
    gap = common.missing([r for r in runs if r.config is not None and r.eval(name) is None],
                         f"no eval/{name}.json")
    return [gap] if gap else []


def early_exit_section(runs: list[common.Run], figures: list) -> Section:
    picks = chosen(runs, "early_exit")
    header = ("family", "run", "d_model", "budget", "full depth",
              *(f"{p}% saved" for p in SAVED_TARGETS))

    def row(run, x):
        return (run.family, run.run_id, width(run), common.num(budget(run) or None),
                common.num(x["ppl_full"]), *(common.num(x[f"ppl_at_{p}"]) for p in SAVED_TARGETS))

    blocks: list = [
        ("Held-out perplexity under the training-free entropy-threshold early exit "
        "(eval/early_exit.json): at full depth and at 5/10/20/30% of forward FLOPs saved, the "
        "study's Table 7 (– : the saving is out of reach even with every token at the first "
        "exit). One run per family: the measured run at the largest budget with the lowest "
        "loss. Exits are simulated on one full pass (an upper bound, early_exit.py).")]
    if picks:
        blocks.append(Table(header, tuple(row(r, x) for r, x in picks)))
        figure = lines_figure(
            "early_exit", "Early exit", "Perplexity against FLOPs saved.",
            [(100 * np.asarray(x["flops_saved"]), x["ppl"], run.family) for run, x in picks],
            xlabel="forward FLOPs saved (%)", ylabel="held-out perplexity", yscale="log")
        figures.append(figure)
        blocks.append(common.image(figure))
        measured = [(r, r.eval("early_exit")) for r in runs if r.eval("early_exit") is not None]
        if len(measured) > len(picks):
            blocks += ["Every measured run:", Table(header, tuple(row(*m) for m in measured))]
    blocks += unmeasured(runs, "early_exit")
    return Section("Early exit (Table 7)", "early-exit", tuple(blocks))


def jsd_section(runs: list[common.Run], figures: list) -> Section:
    picks = chosen(runs, "jsd")
    blocks: list = [("Jensen-Shannon divergence (bits) of the next-token distribution after "
                    "each layer (read through the final norm and unembedding) from the final "
                    "one (eval/jsd.json), for looped and unlooped models alike: mean over "
                    "held-out tokens and the share of tokens below 0.5 bits at each depth, the "
                    "fraction of the depth at which a token first converges (mean), and the "
                    "loop boundaries; the run chosen per family as for Table 7. The study's "
                    "claim is that looped models converge earlier in depth.")]

    def row(r, x):
        return (r.family, r.run_id, width(r),
                ", ".join(map(str, x["loop_boundaries"])),
                ", ".join(common.num(v, 3) for v in x["depth_mean"]),
                ", ".join(common.num(v, 3) for v in x["depth_share_below"]),
                common.num(x["first_converged_fraction_mean"], 3))

    # A jsd.json from before every depth was measured holds loop exits only: left out, named.
    old = [r for r, x in picks if "depth_mean" not in x]
    picks = [(r, x) for r, x in picks if "depth_mean" in x]
    if picks:
        blocks.append(Table(("family", "run", "d_model", "loop boundaries", "mean JSD by depth",
                             "share below 0.5 by depth", "first converged (depth fraction)"),
                            tuple(row(r, x) for r, x in picks)))
        figure = lines_figure("jsd", "JSD by depth", "Mean JSD to the final layer's "
                              "distribution after each layer.",
                              [(x["depths"], x["depth_mean"], run.family) for run, x in picks],
                              xlabel="depth (layers applied)",
                              ylabel="JSD to the final layer (bits)", ylim=(0, 1))
        figures.append(figure)
        blocks.append(common.image(figure))
    if old:
        blocks.append(common.missing(old, "eval/jsd.json holds loop exits only (re-run "
                                          "`loopscale eval --what=jsd`)"))
    blocks += unmeasured(runs, "jsd")
    return Section("Convergence in depth (JSD)", "jsd", tuple(blocks))


def analyse(runs: list[common.Run], args: argparse.Namespace) -> common.Analysis:
    doc, figures, why = fit(args)
    if doc is None:
        fit_sections = [Section("IsoFLOP frontiers", "fit", (f"No fit: {why}",))]
    else:
        refs = [common.image(f) for f in figures]
        fit_sections = [s for s in rep.outline(doc, []) if s.anchor in FIT_SECTIONS]
        fit_sections.insert(1, Section("Frontier figures", "figures", tuple(refs)))
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = (f"{len(runs)} runs ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}), "
               f"families: {', '.join(sorted({r.family for r in runs}))}. Fit: N = "
               f"{args.params_column}, {args.bootstrap} bootstrap resamples (seed {args.seed}).")
    sections = [Section("Summary", "summary", (summary,)), *fit_sections,
                params_section(runs), routing_section(runs, figures),
                early_exit_section(runs, figures), jsd_section(runs, figures)]
    files = (("fit.json", json.dumps(doc, indent=2, allow_nan=False) + "\n"),) if doc else ()
    return common.Analysis("IsoFLOP frontiers of the four families: " + args.workdir,
                           tuple(sections), tuple(figures), files)


def extra_args(parser: argparse.ArgumentParser) -> None:
    add_fit_args(parser, bootstrap_default=200)


main = common.entry(__doc__.split("\n\n")[0], analyse, extra_args)

if __name__ == "__main__":
    raise SystemExit(main())
