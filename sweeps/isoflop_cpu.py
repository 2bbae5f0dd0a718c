"""The IsoFLOP sweep of sweeps/isoflop_paper.py shrunk to a 2-core CPU (`make demo`).

    loopscale plan --sweep=sweeps/isoflop_cpu.py --out=plan.csv
    loopscale sweep --sweep=sweeps/isoflop_cpu.py --workdir=runs/isoflop_cpu --concurrency=2
    loopscale collect runs/isoflop_cpu --out=results.csv
    loopscale fit results.csv --params-column=params_active --out=fit.json

The same four families (Base, Looped, MoE, Looped-MoE) at 4 effective layers (the `tiny`
presets: Base and MoE 4 layers, Looped and Looped-MoE 2 x 2), the study's muP variant with
base width 32 and its LR 1.2e-2 (sweeps/lr_transfer.py: best at d 8 and d 32 alike), byte-level
KJV text, sequence 64, batch 64, one attention head. Budgets 1e10, 3e10 and 1e11 FLOPs (a 10x
span) counted as in the study (`6n_emb`); per budget the 5 widths (of 2..32) around the expected
optimum, as cooldown branches: each width trains once at constant LR to its largest budget's
branch point and each budget is a WSD cooldown (the presets' last 10%) from there. 80 runs: 20
trunks, 48 branches, 12 widths planned at one budget only and trained on their own; 6,892
steps, 83% of the FLOPs the 60 points would spend as runs of their own (the widths shift with
the budget, so a width meets at most two or three budgets).

Where the optimum sits at this scale was measured here, not assumed: byte-level models this
small keep improving far beyond the study's 3-6 tokens per parameter (at 1e11 FLOPs, Base at
d 8 with 130 tokens/param beat d 12, 16, 24 and 32; at 2e10, d 2/4/6/8/12 gave eval losses
2.64/2.28/2.19/2.21/2.73, the minimum at d 6, 49 tokens/param), so the widths are centred at
50 tokens per parameter. MoE layers use capacity dispatch (capacity factor 2) because dropless
dispatch computes every expert densely on a CPU; the planned FLOPs still count the active
experts only.

What it shows, measured (one seed): loss falls with the budget for every family (Base's best
2.65, 2.16, 1.88 nats at 1e10, 3e10, 1e11), but the curves across widths are not yet
resolved: seed noise here is 0.1-0.17 nats (std over 4 seeds: Base d 4, 8, 16 at their 3e10 or
1e11 step counts, 0.11, 0.17, 0.17 at LR 1.2e-2; a lower LR does not remove it: 0.15 at 6e-3),
as large as the differences between neighbouring widths, so 5 of the 12 (family, budget)
curves have their minimum on an edge (Base at 1e10) or are not convex (Base, Looped and MoE at
1e11, Looped-MoE at 3e10) and `loopscale fit` leaves them out: Base gets no IsoFLOP fit, the
other families' a and b have intervals spanning most of (-0.1, 1.1), and the parametric
exponents' intervals are wider than 1. Resolving a 0.05-nat difference between widths at this
noise takes about (2 x 0.15 / 0.05)^2 = 36 seeds a point (this sweep's 9 minutes x 36), or
models and budgets large enough that a run's loss settles; the compute that branches save buys
seeds. The study's grid is sweeps/isoflop_paper.py.

Time: 9 min 8 s for sweep + collect + report (`loopscale demo`, 2 warm workers) on this 2-core
machine; train steps are 58% of the runs' wall time (567 of 984 s), compiling (a width's first
run on each worker) 13%, the rest start-up, evaluation and checkpoints.
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep

FAMILIES = {
    "base": "experiments/base.py:tiny",
    "looped": "experiments/looped.py:tiny",
    "moe": "experiments/moe.py:tiny",
    "looped_moe": "experiments/looped_moe.py:tiny",
}
CPU_MOE = {"model": {"moe_dispatch": "capacity", "capacity_factor": 2.0}}


def get_config(arg: str | None = None) -> ConfigDict:
    s = base_sweep()
    s.name = "isoflop_cpu"
    s.families = {name: {"experiment": exp, "overrides": CPU_MOE if "moe" in name else {}}
                  for name, exp in FAMILIES.items()}
    s.select = ",".join(FAMILIES)
    # Python loops instead of nested scans (same numbers, tests/test_model.py): at 4 effective
    # layers a CPU runs the unrolled step faster (d 2: Looped 60 -> 41 ms, Looped-MoE 103 ->
    # 72 ms per step) and compiles it as fast.
    s.overrides = {"model": {"base_d_model": 32, "scan": False}, "train": {"eval_batches": 4}}
    s.flop_convention = "6n_emb"
    s.budgets = (1e10, 3e10, 1e11)
    s.shape.kind = "width"
    s.shape.widths = (2, 4, 6, 8, 10, 12, 16, 20, 24, 32)
    s.shape.n_heads = 1
    s.shape.sizes = 5
    s.shape.tokens_per_param = 50.0
    s.batch_size, s.seq_len = 64, 64
    s.lrs = (1.2e-2,)  # the base-width LR of sweeps/lr_transfer.py, held across widths
    s.min_steps = 20
    s.warmup_frac = 0.05
    # One evaluation (the final one) and one checkpoint half-way: at this size a run's fixed
    # costs dominate its time.
    s.evals, s.checkpoints = 1, 2
    s.branches = True
    # 2 AVX2 cores (~190 GFLOP/s fp32 peak) at 25%: what larger models reach; these tiny runs
    # are dominated by per-run and per-step overheads this estimate leaves out.
    s.peak_flops, s.mfu = 1.9e11, 0.25
    return s
