"""MoE family of the sparse-layers study: 16 unique layers, top-2 of 8 SwiGLU experts.

    loopscale flops --config=experiments/moe.py:tiny
    loopscale flops --config=experiments/moe.py:paper   # d 704: 362.1M stored, 167.4M active

Each expert is a SwiGLU of width d_ff/2, so active FFN parameters equal the dense FFN's;
bias-free router, combine weights = softmax over the two selected logits, dropless dispatch,
load-balancing and router z-loss weights 0.01 and 0.001. `paper` is the study's compute-optimal
MoE at 1e18 FLOPs, 366M stored there: d 704 (362.1M) is the nearest width of its grid (d 768
has 417.0M). `tiny` is 4 layers at d 64.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import sparse_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    return sparse_study(arg, "moe")
