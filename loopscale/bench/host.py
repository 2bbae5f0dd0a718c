"""What a train step costs the host: the bench's `host_overhead` figure.

The trainer's real loop (`trainer.train`: the next batch, dispatch, the metrics read back,
the row, its log line and TensorBoard event) on a model whose device step is trivial, so a
step's wall time is the host's, at a given `log_every`: the accelerator presets' 10 (the
device read and rows written every 10 steps) and the CPU presets' 1, side by side. It runs N
and 3N steps in one process after a first run that compiles what both reuse; the extra wall
time per extra step, less the compiled step's own time (timed alone), is the loop's own.
Start-up and the final evaluation are in both runs and cancel.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import time

from loopscale.bench import steps, timing
from loopscale.train import trainer

# d_model 8, one layer, one sequence of 8 tokens: a device step of well under a millisecond.
TRIVIAL = ("--config.model.d_model=8", "--config.model.n_heads=1", "--config.model.head_dim=8",
           "--config.model.n_unique=1", "--config.train.seq_len=8", "--config.train.batch_size=1",
           "--config.train.eval_every=0", "--config.train.checkpoint_every=0")


def _train_seconds(count: int, log_every: int):
    """Wall seconds of a whole trivial run of `count` steps (its output swallowed)."""
    config = steps.load("base.py:tiny", [*TRIVIAL, f"--config.train.steps={count}",
                                         f"--config.train.log_every={log_every}"])
    with tempfile.TemporaryDirectory() as workdir, \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        start = time.perf_counter()
        code = trainer.train(config, workdir, steps.one_device())
        seconds = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"the trivial run of {count} steps exited {code}")
    return config, seconds


def measure(n: int, reps: int, warmup: int, log_every: int) -> dict:
    """host_ms (the figure), per_step_ms, the device step's timing, wall_s by step count."""
    walls = {}
    for count in (n, n, 3 * n):  # the first run compiles (the others reuse it) and is dropped
        config, walls[count] = _train_seconds(count, log_every)
    per_step = (walls[3 * n] - walls[n]) / (2 * n)
    # At least 5 calls after a warm-up one: a first call carries set-up that would swamp a
    # step of this size.
    device = timing.interleaved({"step": steps.TrainStep(config)}, max(reps, 5),
                                max(warmup, 1))["step"]
    return {"host_ms": 1e3 * (per_step - device.median), "per_step_ms": 1e3 * per_step,
            "device_step": device.to_json(), "wall_s": walls}
