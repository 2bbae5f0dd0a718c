"""A small slice of the demo sweep (sweeps/isoflop_cpu.py) run by `loopscale sweep` in a
scratch directory, then read back: how much of its wall time went to train steps, and how
fast those steps computed.

The share is (sum over runs of their train steps' seconds, `step_time_s` in metrics.jsonl) /
(concurrency x the sweep's wall time): the fraction of the runner's slot-seconds spent inside
jitted train steps. The rest is process start, JAX import, data set-up, tracing and compiling,
evaluation, checkpoints and the runner's polling.

The FLOP rate is (sum over runs of the FLOPs their own train steps computed) / (sum of those
steps' seconds): tokens trained x FLOPs per token, under the run's `flop_convention` (what
summary.json's `flops_per_token_train` says) and, beside it, under the count of what the
compiled step executes (`flops_per_token_computed`, flops.computed_flops_per_token).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Sequence

from loopscale.config import Config
from loopscale.files import read_json
from loopscale.rundir.run import CONFIG, read_config, read_summary
from loopscale.sweep import time_budget


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


def share(workdir: str, wall_s: float, concurrency: int) -> dict:
    """The sweep's time budget, read from its run directories (workdir/runs/*): the runs'
    own (sweep/time_budget.py), and the same step seconds over the runner's slot-seconds."""
    runs = time_budget.runs_share(workdir)
    slots = concurrency * wall_s
    # `share_of_runs` (in `runs`) is the issue's accounting: steps over the runs' own wall time
    # (summary.json), which leaves out process start, JAX import and the runner.
    return {
        **runs, "concurrency": concurrency, "sweep_wall_s": wall_s,
        "share_of_sweep": runs["step_s"] / slots if slots else 0.0,
        "compile_share_of_sweep": runs["compile_s"] / slots if slots else 0.0,
    }


def run_flops(rundir: str) -> dict:
    """One run's own train steps: tokens, FLOPs under its convention and as computed, and
    their seconds. Tokens are own steps x batch_size x seq_len of config.json."""
    summary = read_summary(rundir) or {}
    train = time_budget.train_config(rundir)
    step_s, steps = time_budget.step_seconds(rundir)
    tokens = steps * int(train["batch_size"]) * int(train["seq_len"])
    model = (read_json(os.path.join(rundir, CONFIG)) or {}).get("model") or {}
    return {"run": os.path.basename(rundir), "d_model": model.get("d_model"), "steps": steps,
            "tokens": tokens, "step_s": step_s,
            "flop_convention": summary.get("flop_convention"),
            "flops": tokens * float(summary["flops_per_token_train"]),
            "flops_computed": tokens * float(summary["flops_per_token_computed"])}


def flop_rate(workdir: str) -> dict:
    """The sweep's train-step FLOP rate: its runs' FLOPs summed over their step seconds
    summed, under the runs' convention and as computed; and its median width by run (the
    lower median when the runs are even in number, so it is a width that ran)."""
    runs = [run_flops(d) for d in time_budget.run_dirs(workdir)]
    if not runs:
        raise ValueError(f"{workdir}: no run directories under runs/")
    step_s = sum(r["step_s"] for r in runs)
    flops = sum(r["flops"] for r in runs)
    computed = sum(r["flops_computed"] for r in runs)
    conventions = sorted({str(r["flop_convention"]) for r in runs})
    return {"runs": len(runs), "tokens": sum(r["tokens"] for r in runs), "step_s": step_s,
            "flops": flops, "flops_computed": computed,
            "flop_convention": ",".join(conventions),
            "flops_per_s": flops / step_s if step_s else 0.0,
            "computed_flops_per_s": computed / step_s if step_s else 0.0,
            "median_d_model": statistics.median_low(r["d_model"] for r in runs),
            "per_run": runs}


@dataclasses.dataclass(frozen=True)
class Subsweep:
    """What the bench's sweep rows read from one run of the slice, kept after its scratch
    directory is gone: the wall time, `share`, `flop_rate`, and the config of the run at the
    median width (the shape the lean step is timed at)."""

    sweep_file: str
    overrides: tuple[str, ...]
    concurrency: int
    wall_s: float
    share: dict
    flops: dict
    median_config: Config


def measure(sweep_file: str, overrides: Sequence[str], concurrency: int) -> Subsweep:
    """Runs the slice once in a fresh scratch directory and reads everything back."""
    with tempfile.TemporaryDirectory(prefix="loopscale-bench-sweep-") as workdir:
        wall = run_subsweep(sweep_file, workdir, overrides, concurrency)
        rate = flop_rate(workdir)
        median = next(r["run"] for r in rate["per_run"]
                      if r["d_model"] == rate["median_d_model"])
        return Subsweep(sweep_file, tuple(overrides), concurrency, wall,
                        share(workdir, wall, concurrency), rate,
                        read_config(os.path.join(workdir, "runs", median)))
