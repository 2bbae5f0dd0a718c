"""Where a finished sweep's time went, read back from its run directories: the seconds its
runs spent inside jitted train steps against their own wall time.

A run's train-step seconds are the `step_time_s` of its metrics.jsonl rows (every step's when
log_every is 1; otherwise the logged steps' mean stands for the others) over the steps it
trained itself: a cooldown branch starts at its trunk's branch_step, and the steps before it
are the trunk's. Its wall time is summary.json's `wall_time_s`, from the trainer's start to
summary.json: set-up, compiles, data, evaluations and checkpoints, not the process start or
JAX's import (a warm worker pays those once for many runs). `make demo` reports this share
for its own runs (runs/demo/checks.json), and `loopscale bench`'s sweep rows for a slice of
the demo sweep (bench/sweep_share.py).
"""

from __future__ import annotations

import glob
import os

from loopscale.files import read_json, read_jsonl
from loopscale.rundir.run import CONFIG, METRICS, read_summary


def run_dirs(workdir: str) -> list[str]:
    """The sweep's run directories (workdir/runs/*), sorted."""
    return sorted(d for d in glob.glob(os.path.join(workdir, "runs", "*")) if os.path.isdir(d))


def train_config(rundir: str) -> dict:
    """config.json's `train` section as written (no parsing: a fake run in a test, or one
    from an older loopscale, may hold only a few fields)."""
    return (read_json(os.path.join(rundir, CONFIG)) or {}).get("train") or {}


def own_steps(rundir: str) -> int:
    """The steps this run trained itself. summary.json's `steps` is the step it reached; a
    cooldown branch started at its trunk's branch_step, whose steps (and their times) are the
    trunk's, not its own metrics.jsonl's."""
    summary = read_summary(rundir) or {}
    steps = int(summary.get("steps") or 0)
    train = train_config(rundir)
    start = int(train.get("branch_step") or 0) if train.get("branch_from") else 0
    return max(steps - start, 0)


def step_seconds(rundir: str) -> tuple[float, int]:
    """(seconds in train steps, steps) of one run's own steps."""
    rows = [r for r in read_jsonl(os.path.join(rundir, METRICS)) if "step_time_s" in r]
    steps = own_steps(rundir) or len(rows)
    if not rows:
        return 0.0, steps
    return sum(r["step_time_s"] for r in rows) * steps / len(rows), steps


def runs_share(workdir: str) -> dict:
    """The runs' train-step seconds, their own wall time and compile time summed over the
    sweep's run directories, and `share_of_runs`: steps over wall (0 with no runs)."""
    step_s = steps = run_wall_s = compile_s = 0.0
    rundirs = run_dirs(workdir)
    for rundir in rundirs:
        s, n = step_seconds(rundir)
        step_s, steps = step_s + s, steps + n
        summary = read_summary(rundir) or {}
        run_wall_s += summary.get("wall_time_s") or 0.0
        compile_s += summary.get("compile_time_s") or 0.0
    return {"runs": len(rundirs), "steps": int(steps), "step_s": step_s,
            "runs_wall_s": run_wall_s, "compile_s": compile_s,
            "share_of_runs": step_s / run_wall_s if run_wall_s else 0.0}
