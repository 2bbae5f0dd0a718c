"""IsoFLOP grid of the sparse-layers study (arXiv 2605.09165; PAPERS.md section 2), at its scale.

    loopscale plan --sweep=sweeps/isoflop_paper.py --out=plan.csv
    loopscale sweep --sweep=sweeps/isoflop_paper.py --launcher=tpu-pod --workdir=gs://B/isoflop
    loopscale collect gs://B/isoflop --out=results.csv && loopscale fit results.csv --out=fit.json

Four families at 16 effective layers (Base 16 dense, Looped 8x2 dense, MoE 16 top-2 of 8,
Looped-MoE 8x2), the study's muP variant (base width 128), at its budgets 5e16, 2e17, 5e17 and
1e18 FLOPs counted as C = 6 * N_active * D (`6n_emb`: loop-aware, active experts, embedding
and unembedding, no attention). Widths follow the study's ladder, d 128..1024 in steps of 64
(head size 64); per budget the 7 widths around the expected optimum are trained. The study's
optima sit at 3-6 tokens per active parameter (Base d 896 at 1e18: 2.8; Looped-MoE d 704: 5.9),
so the ladder is centred at 4. What it should show: an interior loss minimum per budget and
family, L_opt = A * N_opt^-alpha with alpha near 0.076 (Base) and 0.077 (Looped-MoE), and
Looped-MoE below Looped at every budget.

Not reported by the study, chosen here: sequence 1024 and batch 256 (the presets'), 1% warmup,
peak LR 1e-2 (read off its figure; under muP the base-width LR of sweeps/lr_transfer.py:paper,
held across widths). ARG `small` keeps the two smallest budgets (a first look).

Branched (the families train on WSD): each width trains once at constant LR to its largest
budget's cooldown start, and each budget is a cooldown branch from there, bit for bit the WSD run
of that budget but for the warmup, which is the smallest budget's for all. `loopscale plan`
says what it saves: 152 runs (40 trunks, 92 branches, 20 standalone), 3.8e19 FLOPs, 78% of the
4.9e19 the points cost one run each (planned 2026-12-06). `--sweep.branches=false`: one run a
point.
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep

FAMILIES = {
    "base": "experiments/base.py:paper",
    "looped": "experiments/looped.py:paper",
    "moe": "experiments/moe.py:paper",
    "looped_moe": "experiments/looped_moe.py:paper",
}


def get_config(arg: str | None = None) -> ConfigDict:
    s = base_sweep()
    s.name = "isoflop_paper"
    s.families = {name: {"experiment": exp, "overrides": {}} for name, exp in FAMILIES.items()}
    s.select = ",".join(FAMILIES)
    s.flop_convention = "6n_emb"
    s.budgets = (5e16, 2e17) if arg == "small" else (5e16, 2e17, 5e17, 1e18)
    s.shape.kind = "width"
    s.shape.widths = tuple(range(128, 1025, 64))
    s.shape.head_dim = 64
    s.shape.sizes = 7
    s.shape.tokens_per_param = 4.0
    s.batch_size, s.seq_len = 256, 1024
    s.lrs = (1e-2,)
    s.min_steps = 200
    s.warmup_frac = 0.01
    s.evals, s.checkpoints = 10, 10
    s.branches = True
    # est_device_hours: base_sweep's TPU v5p chip at 40% MFU (override with --peak-flops/--mfu).
    return s
