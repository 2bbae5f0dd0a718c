"""Looped-MoE family of the sparse-layers study: 8 unique MoE layers x 2 loops (16 effective).

    loopscale flops --config=experiments/looped_moe.py:tiny
    loopscale flops --config=experiments/looped_moe.py:paper   # d 704: 216.4M stored, 167.4M active

Top-2 of 8 experts: the router may pick different experts for the same physical layer on each
pass, which is the study's explanation of why sparse layers rescue looping. `paper` is the
compute-optimal model at 1e18 FLOPs (d 704; the study: 216M stored, 167M active, routers not
counted). `tiny` is 2 x 2 at d 64.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import sparse_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    return sparse_study(arg, "looped_moe")
