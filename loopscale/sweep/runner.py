"""The local sweep runner: every planned run trained in a process of its own, resumably.

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
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from loopscale.errors import UsageError
from loopscale.files import write_atomic
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import CHECKPOINTS, METRICS, branch_source, checkpoint_steps
from loopscale.rundir.status import ExitCode, LaunchOutcome, RunStatus
from loopscale.sweep.plan import PlannedRun
from loopscale.sweep.worker import KEEP_GOING

if TYPE_CHECKING:
    from loopscale.sweep.progress import Progress

DEFAULT_TRAIN_COMMAND = (sys.executable, "-m", "loopscale.cli", "train")


@dataclasses.dataclass(frozen=True)
class Options:
    concurrency: int = 1
    max_retries: int = 2
    train_command: tuple[str, ...] = DEFAULT_TRAIN_COMMAND
    env: tuple[tuple[str, str], ...] = ()  # extra environment for every run
    poll_s: float = 0.5
    # Warm workers (worker.py): each slot trains run after run in one process. Only with the
    # default train command (a worker calls loopscale's own `train`).
    warm: bool = False
    # A run whose metrics.jsonl has not grown for this long is killed (and retried); 0: never.
    stall_s: float = 0.0

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


def _die_with_parent(parent: int) -> Callable[[], None]:
    """preexec_fn: the child gets SIGTERM when the runner dies, even by SIGKILL (Linux)."""

    def preexec() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: orphans run on, guarded by run.lock
            return
        if os.getppid() != parent:  # the runner died before prctl took effect
            os._exit(143)

    return preexec


# ---------------------------------------------------------------- one run


def command(run: PlannedRun, workdir: str, train_command: Sequence[str]) -> list[str]:
    return [*train_command, *run.train_args(rundirs.run_dir(workdir, run.run_id))]


def cache_env(workdir: str) -> dict[str, str]:
    """JAX's persistent compilation cache, shared by all runs of the sweep. Tiny CPU steps
    compile in under a second, below JAX's default threshold for caching, hence the zero."""
    return {"JAX_COMPILATION_CACHE_DIR": os.path.join(workdir, "jax_cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def command_script(argv: Sequence[str], env: dict[str, str], cwd: str) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    return ("#!/usr/bin/env bash\n# Trains this run (resumes from its last checkpoint); written "
            "by `loopscale sweep`.\nset -euo pipefail\n"
            f"cd {shlex.quote(cwd)}\n{exports}exec {shlex.join(argv)}\n")


def run_env(workdir: str, options: Options) -> dict[str, str]:
    """Variables set for every run: the shared cache (unless the caller's environment already
    names one, e.g. a machine-wide cache), then the options' own."""
    env = {k: v for k, v in cache_env(workdir).items() if k not in os.environ}
    return {**env, **dict(options.env)}


def prepare(run: PlannedRun, workdir: str, options: Options) -> tuple[list[str], dict[str, str]]:
    """Writes run.json and command.sh into the run directory; returns (argv, extra env)."""
    rundir = rundirs.run_dir(workdir, run.run_id)
    os.makedirs(rundir, exist_ok=True)
    argv = command(run, workdir, options.train_command)
    env = run_env(workdir, options)
    row = {k: v for k, v in run.row.items()}
    write_atomic(os.path.join(rundir, rundirs.RUN_ROW), json.dumps(row, indent=2) + "\n")
    script = os.path.join(rundir, rundirs.COMMAND)
    write_atomic(script, command_script(argv, env, os.getcwd()))
    os.chmod(script, 0o755)
    return argv, env


class _Worker:
    """A warm worker process (worker.py) and the pipe its replies come back on."""

    def __init__(self, env: dict[str, str], log_path: str):
        read, write = os.pipe()
        with open(log_path, "a") as log:  # what a worker says outside any run
            # New session, as for a run's own process (see _launch).
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loopscale.sweep.worker", f"--reply-fd={write}"],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, text=True,
                start_new_session=True, pass_fds=(write,), preexec_fn=_die_with_parent(os.getpid()))
        os.close(write)
        os.set_blocking(read, False)
        self.replies, self._pending = read, b""
        self.shapes: set[tuple] = set()  # Config.step_shape of the runs it has trained

    def submit(self, argv: Sequence[str], rundir: str, log: str) -> None:
        self.proc.stdin.write(json.dumps({"argv": list(argv), "rundir": rundir, "log": log}) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict | None:
        try:
            self._pending += os.read(self.replies, 65536)
        except BlockingIOError:
            pass
        line, newline, rest = self._pending.partition(b"\n")
        if not newline:
            return None
        self._pending = rest
        return json.loads(line)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 30.0) -> None:
        try:
            self.proc.stdin.close()  # end of requests: the worker exits
            self.proc.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        os.close(self.replies)


@dataclasses.dataclass
class _Active:
    """A run being trained, by its own process (`proc`) or by a warm worker (`worker`)."""

    run: PlannedRun
    started: float
    log: object
    proc: subprocess.Popen | None = None
    worker: _Worker | None = None
    locked: bool = False  # the worker found run.lock held: not launched after all
    returncode: int | None = None
    last_growth: float = 0.0  # when metrics.jsonl last grew (stall_s)
    metrics_size: int = -1
    killed: bool = False  # by _kill_stalled

    @property
    def pid(self) -> int:  # the leader of the process group that trains the run
        return (self.proc or self.worker.proc).pid

    def poll(self) -> int | None:
        """The run's exit status once it has ended, else None."""
        if self.proc is not None:
            self.returncode = self.proc.poll()
            return self.returncode
        reply = self.worker.reply()
        if reply is None and not self.worker.alive:
            # Died mid-run (a crash, the OOM killer, our SIGKILL), or replied as it exited.
            reply = self.worker.reply() or {"rc": self.worker.proc.returncode}
        if reply is not None:
            self.locked = bool(reply.get("locked"))
            self.returncode = reply.get("rc")
            return self.returncode if not self.locked else ExitCode.OK
        return None


def _launch(run: PlannedRun, workdir: str, options: Options, lock_fd: int,
            workers: "_Workers | None" = None) -> _Active:
    argv, extra = prepare(run, workdir, options)
    rundir = rundirs.run_dir(workdir, run.run_id)
    log_path = os.path.join(rundir, rundirs.LOG)
    log = open(log_path, "a")
    log.write(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} launch: {shlex.join(argv)}\n")
    log.flush()
    if workers is not None:
        os.close(lock_fd)  # the worker takes run.lock itself, for as long as it trains the run
        request = (argv[len(DEFAULT_TRAIN_COMMAND) - 1:], rundir, log_path)  # from `train` on
        worker = workers.take({**os.environ, **extra}, run.config.step_shape)
        worker.shapes.add(run.config.step_shape)
        try:
            worker.submit(*request)
        except OSError:  # it died since it last replied: a fresh one
            worker.close()
            worker = _Worker({**os.environ, **extra}, workers.log_path)
            worker.submit(*request)
        return _Active(run, time.time(), log, worker=worker)
    try:
        # New session: a Ctrl-C in the terminal reaches the runner only, which then stops the
        # runs cleanly with SIGTERM. pass_fds: the child holds run.lock for as long as it lives.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **extra}, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(lock_fd,),
                                preexec_fn=_die_with_parent(os.getpid()))
    finally:
        os.close(lock_fd)  # the child's copy keeps the lock
    return _Active(run, time.time(), log, proc=proc)


class _Workers:
    """The idle warm workers of a sweep, started on demand, at most one per slot."""

    def __init__(self, workdir: str):
        self.log_path = os.path.join(workdir, "workers.log")
        self.idle: list[_Worker] = []

    def take(self, env: dict[str, str], shape: tuple) -> _Worker:
        """An idle worker, one that has compiled `shape` if there is one; else a new one."""
        self.idle.sort(key=lambda w: shape in w.shapes)
        while self.idle:
            worker = self.idle.pop()
            if worker.alive:
                return worker
            worker.close()
        return _Worker(env, self.log_path)

    def knows(self, shape: tuple) -> bool:
        return any(shape in w.shapes for w in self.idle)

    def give_back(self, worker: _Worker, reusable: bool) -> None:
        """A worker whose run ended badly exits by itself (worker.py): wait for it."""
        if reusable and worker.alive:
            self.idle.append(worker)
        else:
            worker.close()

    def close(self) -> None:
        for worker in self.idle:
            worker.close()
        self.idle = []


def _kill_stalled(active: list[_Active], workdir: str, stall_s: float) -> None:
    """SIGKILLs the process training a run whose metrics.jsonl has not grown for stall_s
    seconds (a hung run: the launch then fails, and is retried like any failure)."""
    now = time.time()
    for a in [a for a in active if not a.killed]:
        path = os.path.join(rundirs.run_dir(workdir, a.run.run_id), METRICS)
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size != a.metrics_size:
            a.metrics_size, a.last_growth = size, now
        elif now - max(a.last_growth, a.started) > stall_s:
            a.log.write(f"==> no progress for {stall_s:.0f} s: killed\n")
            a.log.flush()
            a.killed = True
            try:
                os.killpg(a.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _finish(active: _Active, workdir: str, stopping: bool) -> LaunchOutcome:
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


# ---------------------------------------------------------------- the loop


class _Signals:
    """SIGINT/SIGTERM: the first stops the runs cleanly, the second kills them."""

    def __init__(self):
        self.count = 0  # signals received
        self.sent = 0  # escalation already applied: 1 SIGTERM sent, 2 SIGKILL sent
        self._old: dict = {}

    def __enter__(self) -> "_Signals":
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.count += 1

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _signal_all(active: list[_Active], sig: int) -> None:
    for a in active:
        try:
            os.killpg(a.pid, sig)
        except ProcessLookupError:
            pass


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
                 active: list[_Active]) -> list[PlannedRun]:
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
                 workers: _Workers | None) -> _Active | None:
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
            return _launch(run, workdir, options, fd, workers)
    return None


def run_sweep(runs: Sequence[PlannedRun], workdir: str, options: Options,
              progress: "Progress | None" = None) -> Outcome:
    """Runs every planned run that is not done yet, `options.concurrency` at a time."""
    if options.concurrency < 1:
        raise UsageError(f"--concurrency must be at least 1, got {options.concurrency}")
    if options.max_retries < 0:
        raise UsageError(f"--max-retries must be >= 0, got {options.max_retries}")
    outcome = Outcome()
    todo = _triage(runs, workdir, options, outcome)
    if progress:
        progress.start(runs, outcome)
    active: list[_Active] = []
    workers = _Workers(workdir) if options.uses_workers else None
    with _Signals() as signals, contextlib.ExitStack() as cleanup:
        if workers is not None:
            cleanup.callback(workers.close)
        while todo or active:
            stopping = signals.count > 0
            if stopping and signals.sent == 0:
                _signal_all(active, signal.SIGTERM)
                signals.sent = 1
            if signals.count > 1 and signals.sent == 1:
                _signal_all(active, signal.SIGKILL)
                signals.sent = 2
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
                _kill_stalled(active, workdir, options.stall_s)
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
            for run in _unreachable(todo, workdir, outcome, active):
                todo.remove(run)
                outcome.failed.append(run.run_id)
                if progress:
                    progress.unreachable(run)
            if progress:
                progress.tick(active, workdir)
    if progress:
        progress.close(outcome)
    return outcome
