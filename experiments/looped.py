"""Looped family of the sparse-layers study: 8 unique dense layers x 2 loops (16 effective).

    loopscale flops --config=experiments/looped.py:tiny
    loopscale flops --config=experiments/looped.py:paper

Plain repetition (`injection=repeat`): the same 8 layers applied twice, the residual stream
running on. Parameters are stored once; FLOPs count both passes. `tiny` is 2 x 2 at d 64.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import sparse_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    c = sparse_study(arg, n_unique=8, n_loops=2, ffn="dense", paper_d_model=768)
    c.name = "looped"
    return c
