"""The recurrence sweep (issue #24): one middle-looped backbone at r = 1, 2, 4 and a unique-layer
baseline, across three budgets, planned for the iso-depth law (scaling/recurrence.py).

    loopscale plan --sweep=sweeps/recurrence.py --out=plan.csv
    loopscale sweep --sweep=sweeps/recurrence.py --workdir=runs/recurrence --concurrency=2
    loopscale collect runs/recurrence --out=results.csv
    loopscale fit results.csv --out=fit.json --report=report.md
    loopscale plan --sweep=sweeps/recurrence.py:paper --topology=v5p-128 --out=paper_plan.csv

The backbone (Huginn's shape shrunk, experiments/huginn.py): prelude 1 -> core 2 looped r times
-> coda 1, Huginn's concatenation adapter, the loop count fixed per run (no schedule, full
backpropagation). Families `r1`, `r2`, `r4`, and `unique`: prelude 1, 8 unique core layers run
once, coda 1 (the depth of r = 4, every layer its own). Each at two widths and three budgets, so
the law's N term sees four (N_once, N_rec, r) per width and its D term three budgets. What it
should show: at equal compute, loss falling from r = 1 to r = 4 less than from r = 1 to the
unique baseline; the law's phi (a loop pass's worth as new parameters, 0 to 1) with its
bootstrap interval. The study (Schwethelm et al. 2026) measured phi = 0.46 from 116 runs at
up to ~1e19 FLOPs; at this scale the interval decides how much is resolved.

ARG `cpu` (default): widths 32 and 48 (head size 8, d_ff = 8/3 d), byte-level KJV at 8 x 64
tokens a step, budgets 3e10, 1e11 and 3e11 FLOPs (6n_emb), muP (`mup_sparse`, base width 8)
with the LR of sweeps/isoflop_cpu.py's LR sweep (2.4e-2, Base d 24 at 4 layers: not re-tuned for
these depths), held-out loss on 65,536 tokens of whole chapters; every run trained from
scratch (no cooldown branches: each run is its own cluster for the law's bootstrap, which
resamples runs within their loop count). ARG `paper`: the backbone at d 1024 (16 heads of 64)
on the GPT-2 vocabulary, 1024 x 256 tokens a step, budgets 1e18, 3e18 and 1e19 FLOPs, bfloat16,
for an accelerator (`--launcher=tpu-pod|slurm`).
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep

LOOPS = (1, 2, 4)
BACKBONE = {"n_prelude": 1, "n_unique": 2, "n_coda": 1}
FIXED = {"loop_dist": "fixed", "loop_max": 0, "bptt_loops": 0}
EVAL_BATCHES = 256  # x 4 sequences x 64 tokens = 65,536 held-out tokens per evaluation


def families(size: str) -> dict:
    exp = f"experiments/huginn.py:{'small' if size == 'paper' else 'tiny'}"
    out = {f"r{r}": {"experiment": exp, "overrides": {"model": {**BACKBONE, "n_loops": r},
                                                      "train": FIXED}} for r in LOOPS}
    out["unique"] = {"experiment": exp, "overrides": {
        "model": {**BACKBONE, "n_unique": BACKBONE["n_unique"] * max(LOOPS), "n_loops": 1},
        "train": FIXED}}
    return out


def get_config(arg: str | None = "cpu") -> ConfigDict:
    size = arg or "cpu"
    if size not in ("cpu", "paper"):
        raise ValueError(f"sweeps/recurrence.py takes cpu or paper, not {size!r}")
    s = base_sweep()
    s.name = f"recurrence_{size}"
    s.families = families(size)
    s.select = "r1,r2,r4,unique"
    s.flop_convention = "6n_emb"
    s.shape.kind = "width"
    s.shape.ffn_ratio = 8 / 3
    s.shape.sizes = 0  # every width at every budget
    s.shape.params = "params_total"
    s.warmup_frac = 0.05
    s.evals, s.checkpoints = 1, 2
    if size == "cpu":
        s.overrides = {
            "model": {"param": "mup_sparse", "base_d_model": 8, "scan": False},
            "train": {"eval_batches": EVAL_BATCHES, "schedule": "wsd"},
            "data": {"val_fraction": 0.02, "val_split": "spread"},
        }
        s.budgets = (6e10, 2e11, 6e11)
        s.shape.widths = (24, 32)
        s.shape.head_dim = 8
        s.batch_size, s.seq_len = 4, 64
        s.lrs = (2.4e-2,)
        s.min_steps = 300
        s.peak_flops, s.mfu = 1.9e11, 0.05
    else:
        s.overrides = {"model": {"vocab_size": 50257}}
        s.budgets = (1e18, 3e18, 1e19)
        s.shape.widths = (1024,)
        s.shape.head_dim = 64
        s.batch_size, s.seq_len = 256, 1024
    return s
