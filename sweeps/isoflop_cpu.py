"""The IsoFLOP sweep of sweeps/isoflop_paper.py shrunk to a 2-core CPU (`make demo`).

    loopscale demo                                   # pilot, gate, this sweep, collect, report
    loopscale sweep --sweep=sweeps/isoflop_cpu.py:pilot --workdir=runs/pilot --concurrency=2
    loopscale sweep --sweep=sweeps/isoflop_cpu.py --workdir=runs/isoflop_cpu --concurrency=2
    loopscale collect runs/isoflop_cpu --out=results.csv
    loopscale fit results.csv --params-column=params_active --out=fit.json

ARG (default) Base and Looped-MoE, the sparse-layers study's headline comparison; `full` all
four families (Base, Looped, MoE, Looped-MoE: `loopscale demo --full`); `pilot` the pilot that
runs first: Base at two widths of the middle budget (d 20 and 28 at 1.5e11 FLOPs), three seeds
each, trained as the sweep trains them but as standalone runs, whose seed-to-seed spread of
the eval loss is the noise the sweep's fits inherit (scaling/pilot.py). What it should show:
each family's loss against width at each budget as a curve with an interior minimum, the
approach-3 exponents with trunk-bootstrap intervals, the IsoFLOP parabola and spline as checks,
and the largest budget predicted from the two smaller ones.

The design (issue #21), for this scale's noise:
- one model shape along the ladder: 4 effective layers (Base 4, Looped-MoE 2 x 2), head size 4
  (heads grow with the width), d_ff = round(8/3 d) at every width (the family rule's rounding
  to 64 froze d_ff for every d <= 24), MoE experts d_ff // top_k (8 experts, top 2);
- muP (`mup_sparse`) with the base width the smallest width, 8, so no width trains above its
  base LR; the base LR 2.4e-2 from one LR sweep at one width (Base d 24 at 1.5e11 FLOPs, 1,223
  steps, this setting; eval loss 1.696 / 1.586 / 1.542 / 1.655 at 6e-3 / 1.2e-2 / 2.4e-2 /
  4.8e-2, 2026-12-04; the same optimum as at batch 16), made with
      loopscale sweep --sweep=sweeps/isoflop_cpu.py --workdir=runs/lr_cpu \\
          --sweep.select=base --sweep.budgets='(1.5e11,)' --sweep.shape.widths='(24,)' \\
          --sweep.lrs='(6e-3,1.2e-2,2.4e-2,4.8e-2)' --sweep.branches=False;
- batch 8 x 64 tokens, so every point trains at least 300 steps (`min_steps`; a shape that
  would train fewer is left out). Smaller batches are also faster per token here: a Base step
  at d 32 took 6.0 / 11.4 / 14.0 / 36.3 ms at batch 4 / 8 / 12 / 16 (one process, 2026-12-04);
- budgets 5e10, 1.5e11 and 5e11 FLOPs (a 10x span; 1e11-1e12 would spend twice the FLOPs,
  past the 15 minutes `make demo` has), 5 widths per budget centred at 30 tokens per parameter,
  as WSD cooldown branches of one trunk per width. The centring is the one choice made after a run:
  at the study's 20 the 5e11 grid (d 24-48) had its minimum at its lower edge (Looped-MoE) or
  nearly (Base, centring 0.11), the minima lying at 30-50 tokens per parameter;
- a fixed held-out set of whole chapters drawn across the whole text (`data.val_split=spread`,
  2% of the characters: 24 chapters from 22 books) of which every evaluation reads the same
  65,536 tokens (128 batches), so evaluation noise is far below the seed noise;
- MoE layers dispatch with capacity factor 2 (see MOE): dropless dispatch (`ragged_dot`) runs
  2.8x slower on this CPU (Looped-MoE d 32: 29.5 against 10.7-12.2 ms a step), and at factor 2
  0.56% of token-expert assignments are dropped (runs/demo/checks.json; 12% at factor 1.25).

Measured (2026-12-04, `loopscale demo`, install excluded: 11 min 12 s; pilot 2 min 50 s): the
pilot's seed noise sigma_L = 0.021 nats (Base d 20: 1.530 +- 0.013, d 28: 1.601 +- 0.027 over 3
seeds), below the 0.05 gate; it predicts +-0.095 on a from seed noise alone (at curvature
0.12). Every (family, budget) curve has its minimum inside the grid. Base a = 0.520 [0.267,
0.656] (approach 3), IsoFLOP parabola 0.491 (spline 0.466) whose interval is not identified (16%
of the trunk-bootstrap refits failed: with one trunk per width, a resample of trunks often keeps
fewer than three widths of a budget); Looped-MoE a = 0.425 [0.210, 0.564], parabola 0.430. The
largest budget's optimal loss predicted from the two smaller: Base 1.347 against 1.360
observed (approach 3, -0.013), Looped-MoE 1.391 against 1.354 (+0.037). Of issue #21's targets:
interior minima and Base's held-out prediction met; Base's a interval (0.39 wide, target 0.3),
the parametric alpha and beta intervals (0.67-1.2 wide, target 0.5) and Looped-MoE's held-out
prediction missed. Two runs of the demo gave the same losses to the last digit.
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep

FAMILIES = {
    "base": "experiments/base.py:tiny",
    "looped": "experiments/looped.py:tiny",
    "moe": "experiments/moe.py:tiny",
    "looped_moe": "experiments/looped_moe.py:tiny",
}
DEFAULT = ("base", "looped_moe")
MOE = {"model": {"moe_dispatch": "capacity", "capacity_factor": 2.0}}
PILOT_BUDGET, PILOT_WIDTHS, PILOT_SEEDS = 1.5e11, (20, 28), (0, 1, 2)
EVAL_BATCHES = 128  # x 8 sequences x 64 tokens = 65,536 held-out tokens per evaluation


def get_config(arg: str | None = None) -> ConfigDict:
    if arg not in (None, "", "full", "pilot"):
        raise ValueError(f"sweeps/isoflop_cpu.py takes no ARG, 'full' or 'pilot', not {arg!r}")
    s = base_sweep()
    s.name = "isoflop_cpu"
    s.families = {name: {"experiment": exp, "overrides": MOE if "moe" in name else {}}
                  for name, exp in FAMILIES.items()}
    s.select = ",".join(FAMILIES if arg == "full" else DEFAULT)
    # Python loops instead of nested scans (same numbers, tests/test_model.py): at 4 effective
    # layers a CPU runs the unrolled step faster and compiles it as fast.
    s.overrides = {
        "model": {"base_d_model": 8, "scan": False},
        "train": {"eval_batches": EVAL_BATCHES},
        "data": {"val_fraction": 0.02, "val_split": "spread"},
    }
    s.flop_convention = "6n_emb"
    s.budgets = (5e10, 1.5e11, 5e11)
    s.shape.kind = "width"
    s.shape.widths = (8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
    s.shape.head_dim = 4
    s.shape.ffn_ratio = 8 / 3
    s.shape.sizes = 5
    s.shape.tokens_per_param = 30.0
    s.batch_size, s.seq_len = 8, 64
    s.lrs = (2.4e-2,)
    s.min_steps = 300
    s.warmup_frac = 0.05
    # One evaluation (the final one) and one checkpoint half-way: at this size a run's fixed
    # costs weigh on its time.
    s.evals, s.checkpoints = 1, 2
    s.branches = True
    # 2 AVX2 cores (~190 GFLOP/s fp32 peak) at 5%, an assumption for est_device_hours only:
    # `make bench`'s demo row measured 5.97 GFLOP/s (3%) on the 5e10 Base slice, two at a time.
    s.peak_flops, s.mfu = 1.9e11, 0.05
    if arg == "pilot":
        s.name = "isoflop_cpu_pilot"
        s.select = "base"
        s.budgets = (PILOT_BUDGET,)
        s.shape.widths, s.shape.sizes = PILOT_WIDTHS, 0
        s.seeds = PILOT_SEEDS
        s.branches = False
    return s
