"""Looped family of the sparse-layers study: 8 unique dense layers x 2 loops (16 effective).

    loopscale flops --config=experiments/looped.py:tiny
    loopscale flops --config=experiments/looped.py:paper   # d 896: 168.0M stored, 246.0M active

Plain repetition (`injection=repeat`): the same 8 layers applied twice, the residual stream
running on. Parameters are stored once; FLOPs count both passes. `paper` is the study's
compute-optimal Looped model at 1e18 FLOPs (168M; `paper,BUDGET` for another budget where the
study gives one: loopscale/config/presets.py). `tiny` is 2 x 2 at d 64.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import sparse_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    return sparse_study(arg, "looped")
