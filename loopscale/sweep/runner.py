"""The local sweep runner's scheduling: every planned run trained in a process of its own
(processes.py starts, polls and signals them), resumably.

Why processes: a run that crashes, diverges or runs out of memory cannot take the runner or
the other runs with it. They share JAX's persistent compilation cache (DIR/jax_cache), so a
resumed run, or a width trained again at another budget, does not recompile what was compiled
before. With `warm` (the CLI's default) each slot is a warm worker (worker.py) that trains run
after run: JAX is imported once per slot and a shape's compiled steps are reused by its next
runs; a worker whose run fails, or which dies, is replaced by a fresh one, so the guarantees
below hold as for a process per run. `stall_s` kills (and so retries) a run whose metrics have
not grown for that long: a hung run does not hold its slot forever.

Resuming: the state of a run is what its directory says (loopscale/rundir/), never what the runner
remembers, so killing the runner at any moment loses nothing:
- completed and diverged runs are skipped;
- interrupted runs (summary `running`, or no summary) are launched again and `loopscale train`
  resumes them from their last checkpoint (it trims metrics.jsonl to that step, so every step
  is logged once);
- failed launches are recorded in attempts.jsonl and retried up to `max_retries` times in all,
  across invocations (bad input, exit 2, is never retried: it would fail the same way).
No run is trained twice at once: the runner holds DIR/sweep.lock, and each training process
holds its run's run.lock (the file descriptor is inherited), which outlives a runner killed with
SIGKILL; such orphans get SIGTERM from the kernel (PR_SET_PDEATHSIG), checkpoint and exit, and
a new runner waits for their lock before relaunching the run.

Stopping: SIGINT/SIGTERM to the runner sends SIGTERM to every training process (each saves a
checkpoint at the end of its step and exits) and waits for them; a second signal kills them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import time
from collections.abc import Sequence

from loopscale.errors import UsageError
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import CHECKPOINTS, branch_source, checkpoint_steps
from loopscale.rundir.status import LaunchOutcome, RunStatus
from loopscale.sweep.plan_table import PlannedRun
from loopscale.sweep.processes import (
    DEFAULT_TRAIN_COMMAND, Active, Signals, Workers, kill_stalled, launch,
)
from loopscale.sweep.worker import KEEP_GOING

# `loopscale sweep`'s own defaults (its --max-retries and --stall-timeout)
MAX_RETRIES = 2
STALL_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Options:
    concurrency: int = 1
    max_retries: int = MAX_RETRIES
    train_command: tuple[str, ...] = DEFAULT_TRAIN_COMMAND
    env: tuple[tuple[str, str], ...] = ()  # extra environment for every run
    poll_s: float = 0.5
    # Warm workers (worker.py): each slot trains run after run in one process. Only with the
    # default train command (a worker runs loopscale's own training job, loopscale/job.py).
    warm: bool = False
    # A run whose metrics.jsonl has not grown for this long is killed (and retried); 0: never.
    stall_s: float = 0.0

    @classmethod
    def standard(cls, concurrency: int) -> Options:
        """What `loopscale sweep --concurrency=N` runs with: warm workers, a stall timeout."""
        return cls(concurrency=concurrency, warm=True, stall_s=STALL_S)

    @property
    def uses_workers(self) -> bool:
        return self.warm and tuple(self.train_command) == DEFAULT_TRAIN_COMMAND


@dataclasses.dataclass
class Outcome:
    """How the sweep stands when the runner returns."""

    done: dict[str, RunStatus] = dataclasses.field(default_factory=dict)  # completed/diverged
    failed: list[str] = dataclasses.field(default_factory=list)  # given up
    interrupted: list[str] = dataclasses.field(default_factory=list)  # stopped by a signal

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted


# ---------------------------------------------------------------- locks


class SweepLock:
    """An exclusive flock on DIR/sweep.lock; the kernel drops it when the holder dies."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, "sweep.lock")
        self.fd: int | None = None

    def __enter__(self) -> "SweepLock":
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UsageError(f"another sweep runner (pid {holder}) is working on "
                             f"{os.path.dirname(self.path)}; wait for it or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _finish(active: Active, workdir: str, stopping: bool) -> LaunchOutcome:
    """Records a finished launch and returns its outcome."""
    rc = active.returncode
    active.log.write(f"==> exit {rc}\n")
    active.log.close()
    rundir = rundirs.run_dir(workdir, active.run.run_id)
    status = rundirs.status(rundir)
    if status.done:
        outcome = LaunchOutcome.DONE
    elif stopping:
        outcome = LaunchOutcome.INTERRUPTED  # our own SIGTERM: not the run's fault, not counted
    else:
        outcome = LaunchOutcome.FAILED
    rundirs.record_attempt(rundir, {"rc": rc, "status": status, "outcome": outcome,
                                    "started": active.started, "ended": time.time()})
    return outcome



def _triage(runs: Sequence[PlannedRun], workdir: str, options: Options,
            outcome: Outcome) -> list[PlannedRun]:
    """Sorts runs by what their directories say: done, given up, or to run (in plan order)."""
    todo = []
    for run in runs:
        rundir = rundirs.run_dir(workdir, run.run_id)
        status = rundirs.status(rundir)
        if status.done:
            outcome.done[run.run_id] = status
        elif rundirs.given_up(rundir, options.max_retries):
            outcome.failed.append(run.run_id)
        else:
            todo.append(run)
    return todo


def _trunk_ready(run: PlannedRun, workdir: str) -> bool:
    """A cooldown branch can start once its trunk has the checkpoint it branches from (orbax
    writes a step under a temporary name and renames it when whole); other runs always can."""
    t = run.config.train
    if not t.branch_from:
        return True
    trunk = branch_source(rundirs.run_dir(workdir, run.run_id), t.branch_from)
    return t.branch_step in checkpoint_steps(trunk / CHECKPOINTS)


def _unreachable(todo: list[PlannedRun], workdir: str, outcome: Outcome,
                 active: list[Active]) -> list[PlannedRun]:
    """Branches that can never start: their trunk is given up, or finished (or not running
    and not to be run) without the checkpoint they need."""
    waiting = {r.run_id for r in todo} | {a.run.run_id for a in active}
    stuck = []
    for run in todo:
        trunk = run.config.train.branch_from
        if not trunk or _trunk_ready(run, workdir):
            continue
        if trunk in outcome.failed or trunk in outcome.done or trunk not in waiting:
            stuck.append(run)
    return stuck


def _launch_next(todo: list[PlannedRun], workdir: str, options: Options,
                 workers: Workers | None) -> Active | None:
    """Launches the first run that can start and whose run.lock is free (a held one: an
    orphan is exiting)."""
    order = list(enumerate(todo))
    if workers is not None:  # a run an idle worker has compiled the shape of, first
        order.sort(key=lambda item: not workers.knows(item[1].config.step_shape))
    for i, run in order:
        if not _trunk_ready(run, workdir):
            continue
        rundir = rundirs.run_dir(workdir, run.run_id)
        os.makedirs(rundir, exist_ok=True)
        fd = rundirs.try_lock_run(rundir)
        if fd is not None:
            todo.pop(i)
            return launch(run, workdir, options.train_command, options.env, fd, workers)
    return None


# ---------------------------------------------------------------- the loop


def _collect_finished(active: list[Active], todo: list[PlannedRun], workdir: str,
                      options: Options, outcome: Outcome, workers: Workers | None,
                      stopping: bool, progress) -> None:
    """Takes every run whose process has ended off `active`: recorded, put back to retry, or
    given up."""
    for a in [a for a in active if a.poll() is not None]:
        active.remove(a)
        if a.worker is not None:
            workers.give_back(a.worker, reusable=a.locked or a.returncode in KEEP_GOING)
        if a.locked:  # an orphan still holds it: try again later, nothing recorded
            a.log.close()
            todo.append(a.run)
            continue
        result = _finish(a, workdir, stopping)
        rundir = rundirs.run_dir(workdir, a.run.run_id)
        gave_up = False
        if result is LaunchOutcome.DONE:
            outcome.done[a.run.run_id] = rundirs.status(rundir)
        elif result is LaunchOutcome.INTERRUPTED:
            outcome.interrupted.append(a.run.run_id)
        elif rundirs.given_up(rundir, options.max_retries):
            outcome.failed.append(a.run.run_id)
            gave_up = True
        else:
            todo.insert(0, a.run)  # retry it next
        if progress:
            progress.finished(a.run, result, rundir, gave_up)


def run_sweep(runs: Sequence[PlannedRun], workdir: str, options: Options,
              progress=None) -> Outcome:
    """Runs every planned run that is not done yet, `options.concurrency` at a time;
    `progress` (progress.py's Progress, or None) hears of every launch and finish."""
    if options.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {options.concurrency}")
    if options.max_retries < 0:
        raise UsageError(f"--max-retries must be >= 0, got {options.max_retries}")
    outcome = Outcome()
    todo = _triage(runs, workdir, options, outcome)
    if progress:
        progress.start(runs, outcome.done, outcome.failed)
    active: list[Active] = []
    workers = Workers(workdir) if options.uses_workers else None
    with Signals() as signals, contextlib.ExitStack() as cleanup:
        if workers is not None:
            cleanup.callback(workers.close)
        while todo or active:
            stopping = signals.count > 0
            signals.escalate(active)
            while not stopping and todo and len(active) < options.concurrency:
                launched = _launch_next(todo, workdir, options, workers)
                if launched is None:
                    break
                active.append(launched)
                if progress:
                    progress.launched(launched.run)
            if stopping and not active:
                outcome.interrupted.extend(r.run_id for r in todo)
                break
            time.sleep(options.poll_s)
            if options.stall_s and not stopping:
                kill_stalled(active, workdir, options.stall_s)
            _collect_finished(active, todo, workdir, options, outcome, workers, stopping,
                              progress)
            for run in _unreachable(todo, workdir, outcome, active):
                todo.remove(run)
                outcome.failed.append(run.run_id)
                if progress:
                    progress.unreachable(run)
            if progress:
                progress.tick([a.run for a in active], workdir)
    if progress:
        progress.close()
    return outcome
