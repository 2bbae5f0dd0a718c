"""How much of a sweep's wall time goes to train steps: a small slice of the demo sweep
(sweeps/isoflop_cpu.py) run by `loopscale sweep` in a scratch directory, then read back.

The share is (sum over runs of their train steps' seconds, `step_time_s` in metrics.jsonl) /
(concurrency x the sweep's wall time): the fraction of the runner's slot-seconds spent inside
jitted train steps. The rest is process start, JAX import, data set-up, tracing and compiling,
evaluation, checkpoints and the runner's polling.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence

from loopscale.files import read_jsonl
from loopscale.rundir.run import METRICS, read_summary


def run_subsweep(sweep_file: str, workdir: str, overrides: Sequence[str],
                 concurrency: int) -> float:
    """Runs the sweep as `loopscale sweep --concurrency=N` (and the demo) runs it, in this
    process, and returns its seconds (planning included, as the command's wall time would)."""
    from loopscale.sweep.local import run_local
    from loopscale.sweep.plan import plan_file
    from loopscale.sweep.runner import Options

    start = time.perf_counter()
    outcome = run_local(plan_file(sweep_file, overrides), workdir, Options.standard(concurrency))
    wall = time.perf_counter() - start
    if not outcome.ok:
        raise RuntimeError(f"the sweep {sweep_file} {' '.join(overrides)} in {workdir}: "
                           f"{len(outcome.failed)} runs failed, "
                           f"{len(outcome.interrupted)} interrupted")
    return wall


def step_seconds(rundir: str) -> tuple[float, int]:
    """(seconds in train steps, steps) of one run. Every step's time is logged when
    log_every is 1; otherwise the logged steps' mean stands for the others."""
    rows = [r for r in read_jsonl(os.path.join(rundir, METRICS)) if "step_time_s" in r]
    summary = read_summary(rundir) or {}
    steps = int(summary.get("steps") or len(rows))
    if not rows:
        return 0.0, steps
    return sum(r["step_time_s"] for r in rows) * steps / len(rows), steps


def share(workdir: str, wall_s: float, concurrency: int) -> dict:
    """The sweep's time budget, read from its run directories (workdir/runs/*)."""
    rundirs = sorted(d for d in glob.glob(os.path.join(workdir, "runs", "*")) if os.path.isdir(d))
    step_s = steps = run_wall_s = compile_s = 0.0
    for rundir in rundirs:
        s, n = step_seconds(rundir)
        step_s, steps = step_s + s, steps + n
        summary = read_summary(rundir) or {}
        run_wall_s += summary.get("wall_time_s") or 0.0
        compile_s += summary.get("compile_time_s") or 0.0
    slots = concurrency * wall_s
    return {
        "runs": len(rundirs), "steps": int(steps), "concurrency": concurrency,
        "sweep_wall_s": wall_s, "step_s": step_s, "compile_s": compile_s,
        "runs_wall_s": run_wall_s,
        "share_of_sweep": step_s / slots if slots else 0.0,
        # the issue's accounting: steps over the runs' own wall time (summary.json), which
        # leaves out process start, JAX import and the runner
        "share_of_runs": step_s / run_wall_s if run_wall_s else 0.0,
        "compile_share_of_sweep": compile_s / slots if slots else 0.0,
    }
