"""What a sweep keeps on disk, and how each run's state is read back from it.

    DIR/plan.csv                  the plan of the latest `loopscale sweep` (sweep/plan_table.py PLAN_COLUMNS)
    DIR/sweep.lock                held (flock) by the one runner working on DIR
    DIR/jax_cache/                JAX's persistent compilation cache, shared by every run
    DIR/runs/RUN_ID/              the run directory `loopscale train` writes (run.py)
        run.json                  the run's plan row, so collect needs no plan.csv
        command.sh                the exact command that trains it (runnable by hand)
        attempts.jsonl            one line per finished launch: rc, status, outcome, times
        train.log                 the launches' stdout and stderr, appended
        run.lock                  held (flock) by the process training the run

A run's status is its summary.json's (status.RunStatus; PENDING without one). A run is *done*
when completed or diverged, and *given up* when its failed launches exceed the retry limit (or
one was bad input, which no retry can fix).
"""

from __future__ import annotations

import fcntl
import os

from etils import epath

from loopscale.files import append_jsonl, read_jsonl
from loopscale.rundir.run import CONFIG, SUMMARY, read_summary
from loopscale.rundir.status import ExitCode, LaunchOutcome, RunStatus

RUN_ROW = "run.json"
COMMAND = "command.sh"
ATTEMPTS = "attempts.jsonl"
LOG = "train.log"
RUN_LOCK = "run.lock"


def try_lock_run(rundir: str) -> int | None:
    """An fd holding an exclusive flock on the run's run.lock, or None if another process
    (a training process, a worker, an orphan of a killed runner) holds it. The kernel drops
    the lock when its holder dies."""
    fd = os.open(os.path.join(rundir, RUN_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def run_dir(workdir: str, run_id: str) -> str:
    return os.path.join(workdir, "runs", run_id)


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether `path` holds a run: trained (summary, config) or only planned (run.json)."""
    path = epath.Path(path)
    return any((path / name).exists() for name in (SUMMARY, CONFIG, RUN_ROW))


def status(rundir: str) -> RunStatus:
    return RunStatus.of(read_summary(rundir))


def attempts(rundir: str) -> list[dict]:
    return read_jsonl(os.path.join(rundir, ATTEMPTS))


def record_attempt(rundir: str, attempt: dict) -> None:
    append_jsonl(os.path.join(rundir, ATTEMPTS), attempt)


def failures(rundir: str) -> tuple[int, bool]:
    """(failed launches, whether one of them was bad input, which no retry can fix)."""
    failed = [a for a in attempts(rundir) if a.get("outcome") == LaunchOutcome.FAILED]
    return len(failed), any(a.get("rc") == ExitCode.USAGE for a in failed)


def given_up(rundir: str, max_retries: int) -> bool:
    n, bad_input = failures(rundir)
    return bad_input or n > max_retries
