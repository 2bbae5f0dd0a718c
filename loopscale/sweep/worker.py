"""A warm worker: one process that trains the local runner's runs one after another.

A run in a fresh process pays the interpreter's start, JAX's import and backend start, and the
tracing and compiling of its steps (the persistent cache saves only the XLA compile); at the
CPU demo's scale that is most of a run. A worker pays them once per slot and keeps each step
shape's compiled functions (train/sharded_state.py `_shared`), so the next run of that shape starts
training at once.

Protocol (processes.py is the other side): one JSON request per line on stdin,
`{"job": {...loopscale/job.py TrainJob fields...}, "rundir": DIR, "log": FILE}`; one JSON reply
per request on the file descriptor named by `--reply-fd`, `{"rc": CODE}` or `{"locked": true}`.
End of stdin ends the worker. A job runs as `loopscale train` runs it (the same library call,
job.run), and bad input is the same one line on the run's log and exit code 2.

Isolation, as with one process per run:
- the worker holds the run's run.lock while it trains it (an orphaned worker still guards its
  run against a second runner), and refuses a run whose lock is held;
- the run's stdout and stderr (file descriptors 1 and 2, so also what C code prints, a crash's
  last words included) go to the run's train.log;
- a run that ends in anything but completed or diverged may have left the process in a bad
  state (a Python exception mid-step, memory), so the worker exits after replying and the
  runner starts a fresh one; a run that kills the process (a segfault, the kernel's OOM
  killer, the runner's SIGKILL of a hung run) takes only this worker down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator

from loopscale import job as jobs
from loopscale.errors import UsageError
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.status import ExitCode

KEEP_GOING = (ExitCode.OK, ExitCode.DIVERGED)


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """File descriptors 1 and 2 appended to `path` for the duration, then restored."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def train_one(job: jobs.TrainJob, rundir: str, log: str) -> dict:
    """Trains one run in this process; the reply to send."""
    lock = rundirs.try_lock_run(rundir)
    if lock is None:
        return {"locked": True}
    try:
        with _output_to(log):
            try:
                rc = jobs.run(job)
            except UsageError as e:  # as `loopscale train` says it
                sys.stderr.write(f"loopscale train: error: {e}\n")
                rc = ExitCode.USAGE
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else ExitCode.FAILED
            except BaseException:  # a bug below the job: its traceback to the run's log
                traceback.print_exc()
                rc = ExitCode.FAILED
    finally:
        os.close(lock)
    return {"rc": int(rc)}


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loopscale.sweep.worker")
    parser.add_argument("--reply-fd", type=int, required=True)
    reply_fd = parser.parse_args(args).reply_fd
    from loopscale.aot.topology import quiet_libtpu

    quiet_libtpu()  # before JAX starts a backend, as the command line does
    for line in sys.stdin:
        request = json.loads(line)
        job = jobs.TrainJob(**{**request["job"], "overrides": tuple(request["job"]["overrides"])})
        reply = train_one(job, request["rundir"], request["log"])
        os.write(reply_fd, (json.dumps(reply) + "\n").encode())
        if reply.get("rc", ExitCode.OK) not in KEEP_GOING:
            return 0  # a fresh worker for the next run (see the module docstring)
    return 0


if __name__ == "__main__":
    sys.exit(main())
