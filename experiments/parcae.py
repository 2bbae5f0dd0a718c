"""Parcae (Prairie et al. 2026, arXiv 2604.12946): the middle-looped model of experiments/huginn.py
with Parcae's stability-constrained injection, at a CPU size and a ~100M one.

    loopscale flops --config=experiments/parcae.py:tiny
    loopscale train --config=experiments/parcae.py:tiny --workdir=runs/parcae_tiny
    loopscale eval runs/parcae_tiny --what=loops --loops=1,2,4,8,16,32
    loopscale flops --config=experiments/parcae.py:small   # d 576: 107.7M stored

Every loop, the first from a zero state, starts from A_bar x_prev + B_bar e (`injection=parcae`:
A_bar = exp(-dt exp(log_a)) per channel, in (0, 1) by construction, so the injection's linear
recurrence has spectral radius below 1 however it trains; B_bar = dt B; initialised as the
authors' code, A_bar = sqrt(1/5) and B = I). Shape, loop-count schedule, truncated
backpropagation and sizes are experiments/huginn.py's (prelude 2, core 4, coda 2; `small`: d 576,
mean recurrence 32, depth 8; `tiny`: d 64, E[r] = 4), so the two files differ in the injection
alone. What it should show: as Huginn, a loss that stays flat or falls past the trained loop
count (`eval --what=loops`), the state's residual norm bounded; Parcae fits quality against
the loop count with the saturating exponential `--what=loops` reports.
"""

from ml_collections import ConfigDict

from loopscale import flops
from loopscale.config.presets import MIDDLE_TOKENS_PER_PARAM, middle_looped


def get_config(arg: str | None = "tiny") -> ConfigDict:
    c = middle_looped(arg, "parcae", "parcae")
    if arg == "small":
        c.train.steps = flops.steps_at_tokens_per_param_of(c, MIDDLE_TOKENS_PER_PARAM)
    return c
