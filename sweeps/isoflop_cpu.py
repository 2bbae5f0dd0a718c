"""The IsoFLOP sweep of sweeps/isoflop_paper.py shrunk to a 2-core CPU (`make demo`).

    loopscale plan --sweep=sweeps/isoflop_cpu.py --out=plan.csv
    loopscale sweep --sweep=sweeps/isoflop_cpu.py --workdir=runs/isoflop_cpu --concurrency=2
    loopscale collect runs/isoflop_cpu --out=results.csv
    loopscale fit results.csv --out=fit.json

The same four families (Base, Looped, MoE, Looped-MoE) at 4 effective layers (the `tiny`
presets: Base and MoE 4 layers, Looped and Looped-MoE 2 x 2), the study's muP variant with
base width 32 and its LR 1.2e-2 (sweeps/lr_transfer.py: best at d 8 and d 32 alike), byte-level
KJV text, sequence 64, batch 64, one attention head. Budgets 1e10, 2e10 and 4e10 FLOPs counted
as in the study (`6n_emb`); per budget the 5 widths (of 2..24) around the expected optimum:
60 runs of 20 to 620 steps.

Where the optimum sits at this scale was measured here, not assumed: byte-level models this
small keep improving far beyond the study's 3-6 tokens per parameter (at 1e11 FLOPs, Base at
d 8 with 130 tokens/param beat d 12, 16, 24 and 32; at 2e10, d 2/4/6/8/12 gave eval losses
2.64/2.30/2.18/2.62/2.72), so the widths are centred at 100 tokens per parameter.
MoE layers use capacity dispatch (capacity factor 2) because dropless dispatch computes every
expert densely on a CPU; the planned FLOPs still count the active experts only.

What it should show: per budget and family a loss-vs-width curve with its minimum inside the
grid, the optimum moving to larger widths as the budget grows, and `loopscale fit` giving a
per-family exponent (noisy at this scale; the study's grid is sweeps/isoflop_paper.py).
Time: the runs' fixed cost (start-up, compiles, evaluation: about 10 CPU-seconds each) is
most of it; `--sweep.budgets='(1e10,4e10)'` keeps 40 of the 60 runs.
"""

from ml_collections import ConfigDict

FAMILIES = {
    "base": "experiments/base.py:tiny",
    "looped": "experiments/looped.py:tiny",
    "moe": "experiments/moe.py:tiny",
    "looped_moe": "experiments/looped_moe.py:tiny",
}
CPU_MOE = {"model": {"moe_dispatch": "capacity", "capacity_factor": 2.0}}


def get_config(arg: str | None = None) -> ConfigDict:
    s = ConfigDict()
    s.name = "isoflop_cpu"
    s.families = {name: {"experiment": exp, "overrides": CPU_MOE if "moe" in name else {}}
                  for name, exp in FAMILIES.items()}
    s.select = ",".join(FAMILIES)
    s.overrides = {"model": {"base_d_model": 32}, "train": {"eval_batches": 4}}
    s.flop_convention = "6n_emb"
    s.budgets = (1e10, 2e10, 4e10)
    s.budget_tolerance = 0.05
    s.shape = {
        "kind": "width",
        "widths": (2, 4, 6, 8, 12, 16, 24),
        "head_dim": 0,
        "n_heads": 1,
        "shapes": (),
        "sizes": 5,
        "tokens_per_param": 100.0,
        "params": "params_active",
    }
    s.batch_size, s.seq_len = 64, 64
    s.seeds = (0,)
    s.lrs = (1.2e-2,)  # the base-width LR of sweeps/lr_transfer.py, held across widths
    s.grid = {}
    s.steps = 0
    s.min_steps, s.max_steps = 20, 0
    s.warmup_frac = 0.05
    # One evaluation (the final one) and one checkpoint half-way: at this size a run's fixed
    # costs dominate its time.
    s.evals, s.checkpoints = 1, 2
    # 2 AVX2 cores (~190 GFLOP/s fp32 peak) at 25%: what larger models reach; these tiny runs
    # are dominated by per-run and per-step overheads this estimate leaves out.
    s.peak_flops, s.mfu = 1.9e11, 0.25
    return s
