"""A sweep trained on this machine: the plan written to DIR/plan.csv under the sweep's lock,
then every run not done yet trained by the local runner (runner.py) with a progress report
(progress.py). `loopscale sweep`, `loopscale demo` and the bench's sweep-share figure all run
this one function; `outcome_lines` is what each then prints.
"""

from __future__ import annotations

import os
import sys

from etils import epath

from loopscale.errors import UsageError
from loopscale.files import is_local
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import check_writable
from loopscale.rundir.status import RunStatus
from loopscale.sweep.plan_table import Plan, read_csv, write_csv
from loopscale.sweep.progress import Progress
from loopscale.sweep.runner import Options, Outcome, SweepLock, run_sweep


def check_workdir(workdir: str) -> None:
    """The local runner's processes share a POSIX directory (locks, claims): not gs://."""
    if not is_local(workdir):
        raise UsageError(f"the local runner needs a local --workdir, not {workdir}; "
                         "use --launcher=tpu-pod or --launcher=slurm")


def run_local(plan: Plan, workdir: str, options: Options) -> Outcome:
    """Trains `plan`'s runs under `workdir` (resumably: run it again to go on)."""
    check_workdir(workdir)
    workdir = os.path.abspath(workdir)
    check_writable(epath.Path(workdir))  # under a file, read-only: one line, not a traceback
    with SweepLock(workdir):
        plan_path = os.path.join(workdir, "plan.csv")
        if os.path.exists(plan_path):
            old = {r["run_id"] for r in read_csv(plan_path)}
            dropped = old - {r.run_id for r in plan.runs}
            if dropped:
                sys.stderr.write(f"loopscale sweep: note: the plan changed; {len(dropped)} runs "
                                 "of the previous plan are not in it (kept under runs/, and "
                                 "collected)\n")
        write_csv(plan.runs, plan_path)
        return run_sweep(plan.runs, workdir, options, Progress())


def outcome_lines(outcome: Outcome, plan: Plan, workdir: str) -> list[str]:
    """How the sweep in `workdir` (as the user named it) stands, and where to look next."""
    diverged = sum(1 for s in outcome.done.values() if s is RunStatus.DIVERGED)
    lines = [f"{len(outcome.done)}/{len(plan.runs)} runs done ({diverged} diverged), "
             f"{len(outcome.failed)} failed, {len(outcome.interrupted)} interrupted; "
             f"`loopscale collect {workdir} --out=results.csv` tabulates them"]
    for run_id in outcome.failed:
        log = os.path.join(rundirs.run_dir(os.path.abspath(workdir), run_id), rundirs.LOG)
        lines.append(f"failed: {run_id} (log: {log})")
    return lines
