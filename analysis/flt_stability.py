"""The FLT stability study's figures and tables (PAPERS.md section 1) from a finished sweep.

Inputs, made by:

    loopscale sweep --sweep=sweeps/flt_stability.py --workdir=runs/flt_stability --concurrency=2
    for r in runs/flt_stability/runs/*/; do loopscale eval --workdir=$r --what=loops,act_grads; done
    .venv/bin/python analysis/flt_stability.py --workdir=runs/flt_stability [--out=DIR]

(`loopscale plan --sweep=sweeps/flt_stability.py --out=plan.csv` shows the 15 runs first;
`s.measure = "loops,act_grads"` in the sweep file measures each run as it completes.)

Writes DIR/report.md (default runs/flt_stability/analysis) and PNGs: training loss curves per
injection mode and loop count, the gradient norm and its oscillation (standard deviation and
coefficient of variation over windows of logged steps, the cosine between consecutive
gradients), the last loop's residual norm over the
first steps, which runs collapsed (summary.json `collapsed`, by the rule it records),
perplexity against the inference loop count (eval/loops.json) and activation-gradient norms per
loop (eval/act_grads.json, else the logged `act_grad_norm`). What a run lacks is listed in the
report (a run without `train.log_grad_cosine` has no cosine column values, and is named).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import common
import numpy as np

from loopscale.config import Injection
from loopscale.scaling.report import Section, Table

ORDER = tuple(i.value for i in (Injection.NONE, Injection.INPUT, Injection.ATTN_FIRST,
                                Injection.FLA, Injection.FLT))
WINDOW = 50  # logged steps per window: the trainer's own grad_norm_std window


def injection(run: common.Run) -> str:
    return run.config.model.injection.value


def loops(run: common.Run) -> int:
    return run.config.model.n_loops


def named(run: common.Run) -> str:
    return f"{injection(run)} x{loops(run)} ({run.run_id})"


def ordered(runs: Sequence[common.Run]) -> list[common.Run]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted((r for r in runs if r.config is not None),
                  key=lambda r: (loops(r), rank.get(injection(r), len(rank)), r.run_id))


def window_spread(norms: np.ndarray, window: int) -> tuple[int, float, float, float]:
    """(window used, mean std, mean CV, max CV) of the gradient norm over consecutive
    non-overlapping windows of logged steps. A run logged for fewer than two windows of
    WINDOW gets two windows of half its length, so short runs are still compared."""
    w = min(window, max(2, len(norms) // 2))
    parts = [norms[i:i + w] for i in range(0, len(norms) - w + 1, w)]
    if not parts:
        return w, float("nan"), float("nan"), float("nan")
    std = np.array([p.std() for p in parts])
    cv = std / np.maximum(np.array([p.mean() for p in parts]), 1e-30)
    return w, float(std.mean()), float(cv.mean()), float(cv.max())


def panels(runs: Sequence[common.Run], draw: Callable, ylabel: str, xlabel: str = "step",
           log: bool = True):
    """One panel per trained loop count, one line per run (drawn by `draw(ax, run)`)."""
    import matplotlib.pyplot as plt

    counts = sorted({loops(r) for r in runs})
    fig, axes = plt.subplots(1, len(counts), figsize=(3.2 * len(counts) + 0.8, 3.0),
                             squeeze=False, sharey=True)
    for ax, k in zip(axes[0], counts):
        for run in (r for r in runs if loops(r) == k):
            draw(ax, run)
        ax.set(title=f"{k} loops", xlabel=xlabel, yscale="log" if log else "linear")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel(ylabel)
    axes[0, -1].legend(fontsize="x-small")
    fig.tight_layout()
    return fig


def curve(key: str, first_steps: int | None = None, pick=lambda v: v):
    def draw(ax, run):
        rows = [r for r in run.train_rows() if key in r
                and (first_steps is None or r["step"] <= first_steps)]
        ax.plot([r["step"] for r in rows], [pick(r[key]) for r in rows], label=injection(run),
                lw=1)
    return draw


def act_grad_norms(run: common.Run) -> tuple[list[float] | None, str]:
    """Per-loop activation-gradient norms: eval/act_grads.json (held-out), else the last
    logged training row's `act_grad_norm`."""
    result = run.eval("act_grads")
    if result is not None:
        return result["per_loop"], f"eval/act_grads.json (step {result['checkpoint_step']})"
    rows = [r for r in run.metrics() if "act_grad_norm" in r]
    if rows:
        return rows[-1]["act_grad_norm"], f"metrics act_grad_norm (step {rows[-1]['step']})"
    return None, ""


def analyse(all_runs: list[common.Run], args: argparse.Namespace) -> common.Analysis:
    runs = ordered(all_runs)
    untrained = [r for r in all_runs if r.config is None]
    figures, sections = [], []

    # --- runs, losses, collapse
    rows, collapsed = [], []
    for r in runs:
        train = r.train_rows()
        s = r.summary
        if s.get("collapsed"):
            collapsed.append(named(r))
        rows.append((injection(r), str(loops(r)), r.status, common.num(s.get("steps")),
                     common.num(train[-1]["ce"] if train else None),
                     common.num(s.get("final_eval_loss")), common.num(s.get("unigram_entropy")),
                     "unknown" if s.get("collapsed") is None else common.num(s["collapsed"])))
    rule = next((r.summary["collapse_rule"] for r in runs if r.summary.get("collapse_rule")),
                "no run recorded its collapse rule")
    overview = [(f"{len(runs)} trained run(s) of {len(all_runs)} in the sweep; {len(collapsed)} "
                f"collapsed ({', '.join(collapsed) or 'none'}). Rule, as summary.json records "
                f"it: {rule}."),
                Table(("injection", "loops", "status", "steps", "final train CE",
                       "final eval loss", "unigram entropy", "collapsed"), tuple(rows))]
    if untrained:
        overview.append(common.missing(untrained, "not trained yet, no config.json"))
    sections.append(Section("Runs and collapse", "runs", tuple(overview)))

    fig = common.Figure("loss_curves", "Training loss",
                        "Training cross-entropy (nats) per step, one panel per loop count.",
                        common.png(panels(runs, curve("ce"), "train CE (nats)")))
    figures.append(fig)

    # --- gradient oscillation
    grad_rows, no_cosine = [], []
    for r in runs:
        rows_ = [x for x in r.train_rows() if x["step"] <= args.first_steps]
        norms = np.array([x["grad_norm"] for x in rows_ if "grad_norm" in x], float)
        w, std, cv, cv_max = window_spread(norms, WINDOW)
        loop_rows = [x for x in r.train_rows() if "grad_norm_loop" in x]
        share = (loop_rows[-1]["grad_norm_loop"][0] / loop_rows[-1]["grad_norm_loop"][-1]
                 if loop_rows and loop_rows[-1]["grad_norm_loop"][-1] else None)
        # grad_cosine is 0 on step 1 (no previous gradient): read from step 2.
        cos = np.array([x["grad_cosine"] for x in rows_ if "grad_cosine" in x and x["step"] > 1],
                       float)
        if not len(cos):
            no_cosine.append(named(r))
        grad_rows.append((injection(r), str(loops(r)), str(len(norms)), str(w), common.num(std),
                          common.num(cv), common.num(cv_max),
                          common.num(float(norms.max()) if len(norms) else None),
                          common.num(share),
                          common.num(float(cos.mean()) if len(cos) else None),
                          common.num(float((cos < 0).mean()) if len(cos) else None)))
    fig_g = common.Figure("grad_norm", "Gradient norm",
                          f"Global gradient L2 norm before clipping, first {args.first_steps} "
                          "steps.", common.png(panels(runs, curve("grad_norm", args.first_steps),
                                                      "grad norm")))
    figures.append(fig_g)
    sections.append(Section("Gradient oscillation", "gradients", (
        (f"Over the logged steps up to step {args.first_steps}, cut into consecutive windows of "
        f"{WINDOW} logged steps (shorter runs: two windows of half their length): the gradient "
        "norm's standard deviation and coefficient of variation (std / mean) per window, their "
        "mean over windows and the largest CV; the first loop's share of the shared gradient over "
        "the last loop's (grad_norm_loop, last logged); the cosine between consecutive steps' raw "
        "gradients (grad_cosine, logged with train.log_grad_cosine), its mean from step 2 and the "
        "share of steps where it is negative (the gradient turning back on itself)."),
        Table(("injection", "loops", "logged steps", "window", "mean std", "mean CV", "max CV",
               "max grad norm", "loop 1 / loop K grad", "mean cos", "cos < 0"),
              tuple(grad_rows)),
        common.image(fig_g),
        *((common.missing(no_cosine, "no grad_cosine logged (train.log_grad_cosine off)"),)
          if no_cosine else ()))))

    # --- residual norms
    res_rows = []
    for r in runs:
        rows_ = [x for x in r.train_rows() if "residual_norm" in x and x["step"] <= args.first_steps]
        if not rows_:
            res_rows.append((injection(r), str(loops(r)), "–", "–", "–", "–", "–", "–"))
            continue
        a, b = rows_[0], rows_[-1]
        res_rows.append((injection(r), str(loops(r)), str(a["step"]), common.num(a["residual_norm"][-1]),
                         str(b["step"]), common.num(b["residual_norm"][-1]),
                         common.num(b["residual_norm"][-1] / a["residual_norm"][-1]),
                         " ".join(common.num(v, 3) for v in b["residual_norm"])))
    fig_r = common.Figure("residual_norm", "Residual norm of the last loop",
                          "Mean over tokens of ||x_L^(K)|| at the end of the last loop, before "
                          f"the final norm, first {args.first_steps} steps.",
                          common.png(panels(runs, curve("residual_norm", args.first_steps,
                                                        lambda v: v[-1]), "residual norm")))
    figures.append(fig_r)
    sections.append(Section("Residual norms", "residual", (
        ("The last loop's residual norm at the first and last logged step (up to step "
        f"{args.first_steps}) and its growth."),
        Table(("injection", "loops", "first step", "norm", "last step", "norm", "growth",
               "every loop at the last step"),
              tuple(res_rows)), common.image(fig_r))))

    sections.append(_loop_counts(runs, figures))
    sections.append(_act_grads(runs, figures))
    sections.insert(1, Section("Loss curves", "loss", (common.image(fig),)))
    return common.Analysis("FLT stability: " + args.workdir, tuple(sections), tuple(figures))


def _loop_counts(runs: list[common.Run], figures: list) -> Section:
    measured = [(r, r.eval("loops")) for r in runs]
    have = [(r, x) for r, x in measured if x is not None]
    blocks: list = [("Held-out perplexity at inference loop counts 1 .. 2K of the same weights "
                    "(eval/loops.json), K the trained count.")]
    if have:
        rows = []
        for r, x in have:
            ppl = x["ppl"]
            best = int(np.argmin(ppl))
            rows.append((injection(r), str(loops(r)), common.num(ppl[0]),
                         common.num(ppl[x["trained_loops"] - 1]), common.num(ppl[-1]),
                         f"{x['loop_counts'][best]} ({common.num(ppl[best])})"))
        blocks.append(Table(("injection", "trained loops", "ppl at 1 loop", "ppl at K",
                             "ppl at 2K", "best count (ppl)"), tuple(rows)))

        def draw(ax, run):
            x = dict(have).get(run)
            if x is not None:
                ax.plot(x["loop_counts"], x["ppl"], marker=".", label=injection(run), lw=1)
                ax.axvline(x["trained_loops"], color="grey", ls=":", lw=0.8)

        fig = common.Figure("ppl_vs_loops", "Perplexity against inference loop count",
                            "Held-out perplexity at each inference loop count; dotted: trained.",
                            common.png(panels([r for r, _ in have], draw, "held-out ppl",
                                              "inference loops")))
        figures.append(fig)
        blocks.append(common.image(fig))
    gap = common.missing([r for r, x in measured if x is None],
                         "no eval/loops.json: loopscale eval --what=loops not run", named)
    if gap:
        blocks.append(gap)
    return Section("Perplexity against inference loop count", "loops", tuple(blocks))


def _act_grads(runs: list[common.Run], figures: list) -> Section:
    found = [(r, *act_grad_norms(r)) for r in runs]
    have = {r: norms for r, norms, _ in found if norms is not None}
    blocks: list = [("||dL/dx|| at each loop boundary: from eval/act_grads.json (held-out, the "
                    "FLT authors' per-loop block-output gradient) where measured, else the "
                    "last training row's act_grad_norm (train.log_act_grads).")]
    rows = [(injection(r), str(loops(r)), src, common.num(n[0]), common.num(n[-1]),
             common.num(n[0] / n[-1] if n[-1] else None))
            for r, n, src in found if n is not None]
    if rows:
        blocks.append(Table(("injection", "loops", "source", "loop 1", "loop K",
                             "loop 1 / loop K"), tuple(rows)))

        def draw(ax, run):
            if run in have:
                ax.plot(range(1, len(have[run]) + 1), have[run], marker=".", lw=1,
                        label=injection(run))

        fig = common.Figure("act_grads", "Activation-gradient norm per loop",
                            "||dL/dx|| at each loop boundary, per trained loop count.",
                            common.png(panels(list(have), draw, "||dL/dx||", "loop")))
        figures.append(fig)
        blocks.append(common.image(fig))
    gap = common.missing([r for r, n, _ in found if n is None],
                         "no eval/act_grads.json and no act_grad_norm logged", named)
    if gap:
        blocks.append(gap)
    return Section("Activation gradients per loop", "act-grads", tuple(blocks))


def extra_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--first-steps", type=int, default=2000,
                        help="the early-training span of the gradient and residual diagnostics "
                             "(the study's 2,000 steps)")


main = common.entry(__doc__.split("\n\n")[0], analyse, extra_args)

if __name__ == "__main__":
    raise SystemExit(main())
