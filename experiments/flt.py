"""The FLT stability study: a looped block with one of the five injection modes.

    loopscale flops --config=experiments/flt.py:tiny --config.model.injection=none
    loopscale flops --config=experiments/flt.py:paper   # Base, 12 layers x 6 loops, 317.9M

ARG is `tiny` (CPU), `small` or `paper`, optionally followed by `,LOOPS`, e.g. `tiny,12`.
Default injection `flt` (FLA + attention injection at every layer); compare with
`--config.model.injection=none|input|attn_first|fla`. At 12 loops on CPU the original LT
(`none`) should stall at the byte-unigram loss with a growing residual norm while `flt` trains.
"""

from ml_collections import ConfigDict

from loopscale.config.presets import flt_study


def get_config(arg: str | None = "tiny") -> ConfigDict:
    size, _, loops = (arg or "tiny").partition(",")
    c = flt_study(size, injection="flt", n_loops=int(loops) if loops else 6 if size != "tiny" else 4)
    c.name = "flt"
    return c
