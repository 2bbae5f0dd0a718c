"""Learning-rate transfer under the sparse-layers study's muP (PAPERS.md section 2).

    loopscale sweep --sweep=sweeps/lr_transfer.py --workdir=runs/lr_transfer --concurrency=2
    loopscale collect runs/lr_transfer --out=lr.csv

The study validated its parametrisation by LR transfer at 4 effective layers, widths 128..1024:
under `mup_sparse` the loss-minimising base learning rate (`train.lr`, the LR at the base width;
a width d trains its hidden and output weights at lr * base/d) should stay put as the width
grows. The IsoFLOP sweeps hold the optimum found here across all their widths (their `lrs`),
so run this first. What it should show: in lr.csv, grouped by d_model, the lowest loss at the
same lr for every width.

ARG `tiny` (default, CPU): the Base family at 4 layers in the setting sweeps/isoflop_cpu.py had
until 2026-12-04 (base width 32, one head, byte-level KJV, batch 64 x 64), widths 4..32, 4
learning rates, 150 steps: 16 runs. Measured on the 1e11-FLOP IsoFLOP of that setting, lr 6e-3 /
1.2e-2 / 2.4e-2 / 4.8e-2 gave eval losses 1.81 / 1.77 / 1.82 / 2.06 at d 8 (722 steps) and 2.13
/ 2.09 / 2.17 / 2.41 at d 32 (99 steps): the same optimum, 1.2e-2, which isoflop_cpu used then.
Its present design (head size 4, d_ff a fixed multiple of d, base width 8, batch 8 x 64) takes
its LR from the one-width sweep its docstring gives. ARG `paper`: widths
128..1024 at 4 layers, 2,000 steps of 256 x 1024 tokens, 5 learning rates around the study's
1e-2 (sweeps/isoflop_paper.py).
"""

from ml_collections import ConfigDict

from loopscale.sweep import base_sweep


def get_config(arg: str | None = "tiny") -> ConfigDict:
    paper = arg == "paper"
    s = base_sweep()
    s.name = "lr_transfer"
    s.families = {"base": {"experiment": f"experiments/base.py:{'paper' if paper else 'tiny'}",
                           "overrides": {"model": {"n_unique": 4}}}}
    s.flop_convention = "6n_emb"
    s.shape.kind = "width"
    if paper:
        s.shape.widths, s.shape.head_dim = (128, 256, 512, 1024), 64
        s.batch_size, s.seq_len = 256, 1024
        s.lrs = (3e-3, 6e-3, 1e-2, 2e-2, 4e-2)
        s.steps, s.warmup_frac = 2000, 0.02
        s.evals, s.checkpoints = 4, 2
    else:
        s.overrides = {"model": {"base_d_model": 32}}
        s.shape.widths, s.shape.n_heads = (4, 8, 16, 32), 1
        s.batch_size, s.seq_len = 64, 64
        s.lrs = (6e-3, 1.2e-2, 2.4e-2, 4.8e-2)
        s.steps, s.warmup_frac = 150, 0.05
        s.evals, s.checkpoints = 1, 1
        s.peak_flops, s.mfu = 1.9e11, 0.25
    return s
