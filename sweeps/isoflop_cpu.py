"""The IsoFLOP sweep of sweeps/isoflop_paper.py shrunk to a 2-core CPU (`make demo`).

    loopscale plan --sweep=sweeps/isoflop_cpu.py --out=plan.csv
    loopscale sweep --sweep=sweeps/isoflop_cpu.py --workdir=runs/isoflop_cpu --concurrency=2
    loopscale collect runs/isoflop_cpu --out=results.csv
    loopscale fit results.csv --out=fit.json

The same four families (Base, Looped, MoE, Looped-MoE) at 4 effective layers (the `tiny`
presets: Base and MoE 4 layers, Looped and Looped-MoE 2 x 2), the study's muP variant with
base width 32 and its LR 1.2e-2 (sweeps/lr_transfer.py: best at d 8 and d 32 alike), byte-level
KJV text, sequence 64, batch 64, one attention head. Budgets 1e10, 2e10 and 4e10 FLOPs counted
as in the study (`6n_emb`); per budget the 4 widths (of 2..24) around the expected optimum:
48 runs of 35 to 310 steps (6,660 in all).

Where the optimum sits at this scale was measured here, not assumed: byte-level models this
small keep improving far beyond the study's 3-6 tokens per parameter (at 1e11 FLOPs, Base at
d 8 with 130 tokens/param beat d 12, 16, 24 and 32; at 2e10, d 2/4/6/8/12 gave eval losses
2.64/2.28/2.19/2.21/2.73, the minimum at d 6, 49 tokens/param), so the widths are centred at
50 tokens per parameter. MoE layers use capacity dispatch (capacity factor 2) because dropless
dispatch computes every expert densely on a CPU; the planned FLOPs still count the active
experts only.

What it should show: per budget and family a loss-vs-width curve with its minimum inside the
grid (measured: Base and Looped at all three budgets, MoE and Looped-MoE at two of three),
the optimum moving to larger widths as the budget grows, and `loopscale fit` giving a
per-family exponent with wide intervals: at this scale seed noise is ~0.1 nats (d 12 at 2e10
with batch 32: 2.30, 2.17, 2.14 for seeds 0, 1, 2), as large as the differences between
widths. The study's grid is sweeps/isoflop_paper.py.
Time: 8 min 46 s for sweep + collect + report on this 2-core machine (2 runs at a time); a
run's fixed cost (start-up, tracing, compiles the first time a width is seen, evaluation) is
about 5 CPU-seconds, a step 40-60 ms.
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
    s.budgets = (1e10, 2e10, 4e10)
    s.shape.kind = "width"
    s.shape.widths = (2, 4, 6, 8, 12, 16, 24)
    s.shape.n_heads = 1
    s.shape.sizes = 4
    s.shape.tokens_per_param = 50.0
    s.batch_size, s.seq_len = 64, 64
    s.lrs = (1.2e-2,)  # the base-width LR of sweeps/lr_transfer.py, held across widths
    s.min_steps = 20
    s.warmup_frac = 0.05
    # One evaluation (the final one) and one checkpoint half-way: at this size a run's fixed
    # costs dominate its time.
    s.evals, s.checkpoints = 1, 2
    # 2 AVX2 cores (~190 GFLOP/s fp32 peak) at 25%: what larger models reach; these tiny runs
    # are dominated by per-run and per-step overheads this estimate leaves out.
    s.peak_flops, s.mfu = 1.9e11, 0.25
    return s
