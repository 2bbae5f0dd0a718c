"""Base family of the sparse-layers study: 16 unique dense layers, no loops.

    loopscale flops --config=experiments/base.py:tiny
    loopscale flops --config=experiments/base.py:paper   # d 896, 16 layers: 246.0M params

Backbone of arXiv 2605.09165 (PAPERS.md section 2): rotary, head size 64, SwiGLU with
d_ff = 64*ceil(8d/3/64), gain-free pre-norm RMSNorm, no biases, untied embeddings, GPT-2
vocabulary, the study's muP variant (`mup_sparse`, base width 128). `paper` is the study's
compute-optimal Base model at 1e18 FLOPs; `paper,BUDGET` another of its budgets, where the study
gives the width (the table in loopscale/config/presets.py). `tiny` runs on a CPU in seconds on
byte-level text.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import sparse_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    return sparse_study(arg, "base")
