"""What a train step costs the host: the bench's `host_overhead` figure.

The trainer's real loop (`trainer.train`: the next batch, dispatch, the metrics read back,
the row, its log line and TensorBoard event) on a model whose device step is trivial, at a
given `log_every`: the accelerator presets' 10 (the device read and rows written every 10
steps) and the CPU presets' 1, side by side. It runs N and 3N steps in one process after a
first run that compiles what both reuse; start-up and the final evaluation are in both runs and
cancel, so the difference per extra step is the loop's. The pair runs three times in turn and
each length keeps its least time: a run's fixed cost (a quarter of a second on this CPU) moves
by tens of milliseconds from run to run, only ever upwards (a collection, a page fault, another
process), which at the tiny scale once made a 25-step run cost more than a 75-step one, and
in CI (2026-12-07) made the loop's CPU time for 75 steps less than for 25 (a per-step figure
of -0.48 ms): measured here, one length's thread time moves by 0.1 s between runs, while 50
steps add about 0.05 s. So the tiny scale runs 100 and 300 steps (0.16 s of CPU time apart
here, the least of four runs of each), and each run starts after a garbage collection, so the
previous run's garbage is not collected inside the next one's timing.

The figure is the CPU time of the trainer's own thread a step (`time.thread_time`): the work an
accelerator's host does for each step, which must stay below the device step for the device
never to wait. On this CPU the device is the same two cores, so the wall time a step (reported
beside it, less the compiled step timed alone) also holds XLA's threads competing with the
loop's for them, and moves by a millisecond from run to run.
"""

from __future__ import annotations

import contextlib
import gc
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
    """(config, wall seconds, this thread's CPU seconds) of a whole trivial run of `count`
    steps (its output swallowed)."""
    config = steps.load("base.py:tiny", [*TRIVIAL, f"--config.train.steps={count}",
                                         f"--config.train.log_every={log_every}"])
    with tempfile.TemporaryDirectory() as workdir, \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        gc.collect()
        start, cpu = time.perf_counter(), time.thread_time()
        code = trainer.train(config, workdir, steps.one_device())
        seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
    if code != 0:
        raise RuntimeError(f"the trivial run of {count} steps exited {code}")
    return config, seconds, cpu


PAIRS = 3


def measure(n: int, reps: int, warmup: int, log_every: int) -> dict:
    """host_ms (the figure: the loop thread's CPU time a step), per_step_ms (wall), wall_ms
    (wall less the device step), the device step's timing, and wall_s and cpu_s by step count
    (the least of PAIRS runs each)."""
    _train_seconds(n, log_every)  # compiles what the timed runs reuse; not counted
    walls, cpus = {n: [], 3 * n: []}, {n: [], 3 * n: []}
    for _ in range(PAIRS):
        for count in (n, 3 * n):
            config, wall, cpu = _train_seconds(count, log_every)
            walls[count].append(wall)
            cpus[count].append(cpu)
    walls, cpus = ({k: min(v) for k, v in d.items()} for d in (walls, cpus))
    per_step = (walls[3 * n] - walls[n]) / (2 * n)
    # At least 5 calls after a warm-up one: a first call carries set-up that would swamp a
    # step of this size.
    device = timing.interleaved({"step": steps.TrainStep(config)}, max(reps, 5),
                                max(warmup, 1))["step"]
    return {"host_ms": 1e3 * (cpus[3 * n] - cpus[n]) / (2 * n), "per_step_ms": 1e3 * per_step,
            "wall_ms": 1e3 * (per_step - device.median), "device_step": device.to_json(),
            "wall_s": walls, "cpu_s": cpus}
