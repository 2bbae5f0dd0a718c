"""MoE family of the sparse-layers study: 16 unique layers, top-2 of 8 SwiGLU experts.

    loopscale flops --config=experiments/moe.py:tiny
    loopscale flops --config=experiments/moe.py:paper

Each expert is a SwiGLU of width d_ff/2, so active FFN parameters equal the dense FFN's;
bias-free router, combine weights = softmax over the two selected logits, dropless dispatch,
load-balancing and router z-loss weights 0.01 and 0.001. `tiny` is 4 layers at d 64.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import sparse_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    c = sparse_study(arg, n_unique=16, n_loops=1, ffn="moe", paper_d_model=768)
    c.name = "moe"
    return c
