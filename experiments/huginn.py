"""Huginn's recurrent-depth model (Geiping et al. 2025, arXiv 2502.05171): prelude 2 -> core 4
looped -> coda 2, at a CPU size and a ~100M one.

    loopscale flops --config=experiments/huginn.py:tiny
    loopscale train --config=experiments/huginn.py:tiny --workdir=runs/huginn_tiny
    loopscale eval runs/huginn_tiny --what=loops --loops=1,2,4,8,16,32
    loopscale flops --config=experiments/huginn.py:small   # d 576: 108.0M stored

Each loop, the first from a zero state (Huginn draws a random one), starts from Huginn's
adapter [x_prev; e] W (`injection=concat`, e the prelude's output). The loop count is drawn per
step from Huginn's log-normal Poisson (tau ~ LogNormal(log m - s^2/2, s), r = Poisson(tau) + 1,
s = 1/2), capped at `loop_max`, with backpropagation through the last `bptt_loops` loops only;
the model is evaluated at n_loops = E[r]. `small`: Huginn's head size 96, vocabulary 65,536,
mean recurrence 32 (m = 31, cap 64) and backpropagation depth 8, 20 tokens per stored
parameter at 256 x 1024 tokens a step, bfloat16. `tiny`: byte-level text, d 64, E[r] = 4 (cap
8), the last 2 loops backpropagated. What it should show: `eval --what=loops` past the trained
count, the loss flat or falling (Huginn's test-time depth), with a saturating-exponential fit.
Not Huginn's: its sandwich norms (loopscale's layers are pre-norm), its random initial state.
"""

from ml_collections import ConfigDict

from loopscale import flops
from loopscale.config.presets import MIDDLE_TOKENS_PER_PARAM, middle_looped


def get_config(arg: str | None = "tiny") -> ConfigDict:
    c = middle_looped(arg, "huginn", "concat")
    if arg == "small":
        c.train.steps = flops.steps_at_tokens_per_param_of(c, MIDDLE_TOKENS_PER_PARAM)
    return c
