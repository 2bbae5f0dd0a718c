"""The local runner's processes: how one run is launched, watched, killed and stopped.

A run trains in a process of its own, or in a warm worker (worker.py) that trains run after run;
either way in a new session (a Ctrl-C in the terminal reaches the runner only, which then stops
the runs cleanly) that gets SIGTERM when the runner dies, even by SIGKILL (PR_SET_PDEATHSIG).
runner.py decides what to launch and when; this module only starts, polls and signals.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from loopscale.files import write_atomic
from loopscale.parallel import xla_flags
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import METRICS
from loopscale.rundir.status import ExitCode
from loopscale.sweep.plan_table import PlannedRun

DEFAULT_TRAIN_COMMAND = (sys.executable, "-m", "loopscale.cli", "train")


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


# ---------------------------------------------------------------- what a run is launched with


def command(run: PlannedRun, workdir: str, train_command: Sequence[str]) -> list[str]:
    return [*train_command, *run.train_args(rundirs.run_dir(workdir, run.run_id))]


CACHE_DIR_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def cache_env(workdir: str) -> dict[str, str]:
    """JAX's persistent compilation cache, shared by all runs of the sweep. Tiny CPU steps
    compile in under a second, below JAX's default threshold for caching, hence the zero."""
    return {CACHE_DIR_VARIABLE: os.path.join(workdir, "jax_cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def command_script(argv: Sequence[str], env: dict[str, str], cwd: str) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()))
    return ("#!/usr/bin/env bash\n# Trains this run (resumes from its last checkpoint); written "
            "by `loopscale sweep`.\nset -euo pipefail\n"
            f"cd {shlex.quote(cwd)}\n{exports}exec {shlex.join(argv)}\n")


def run_env(workdir: str, extra: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Variables set for every run: the shared cache (unless the caller's environment already
    names one, e.g. a machine-wide cache), this host's XLA flags (parallel/xla_flags.py; none
    on a CPU), then the caller's own (`extra`)."""
    env = {k: v for k, v in cache_env(workdir).items() if k not in os.environ}
    return {**env, **xla_flags.env(xla_flags.local_platform()), **dict(extra)}


def prepare(run: PlannedRun, workdir: str, train_command: Sequence[str],
            extra_env: Sequence[tuple[str, str]]) -> tuple[list[str], dict[str, str]]:
    """Writes run.json and command.sh into the run directory; returns (argv, extra env)."""
    rundir = rundirs.run_dir(workdir, run.run_id)
    os.makedirs(rundir, exist_ok=True)
    argv = command(run, workdir, train_command)
    env = run_env(workdir, extra_env)
    row = {k: v for k, v in run.row.items()}
    write_atomic(os.path.join(rundir, rundirs.RUN_ROW), json.dumps(row, indent=2) + "\n")
    script = os.path.join(rundir, rundirs.COMMAND)
    write_atomic(script, command_script(argv, env, os.getcwd()))
    os.chmod(script, 0o755)
    return argv, env


# ---------------------------------------------------------------- warm workers


class Worker:
    """A warm worker process (worker.py) and the pipe its replies come back on."""

    def __init__(self, env: dict[str, str], log_path: str):
        read, write = os.pipe()
        with open(log_path, "a") as log:  # what a worker says outside any run
            # New session, as for a run's own process (see launch).
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loopscale.sweep.worker", f"--reply-fd={write}"],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, text=True,
                start_new_session=True, pass_fds=(write,), preexec_fn=_die_with_parent(os.getpid()))
        os.close(write)
        os.set_blocking(read, False)
        self.replies, self._pending = read, b""
        self.shapes: set[tuple] = set()  # Config.step_shape of the runs it has trained

    def submit(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
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


class Workers:
    """The idle warm workers of a sweep, started on demand, at most one per slot."""

    def __init__(self, workdir: str):
        self.log_path = os.path.join(workdir, "workers.log")
        self.idle: list[Worker] = []

    def take(self, env: dict[str, str], shape: tuple) -> Worker:
        """An idle worker, one that has compiled `shape` if there is one; else a new one."""
        self.idle.sort(key=lambda w: shape in w.shapes)
        while self.idle:
            worker = self.idle.pop()
            if worker.alive:
                return worker
            worker.close()
        return Worker(env, self.log_path)

    def knows(self, shape: tuple) -> bool:
        return any(shape in w.shapes for w in self.idle)

    def give_back(self, worker: Worker, reusable: bool) -> None:
        """A worker whose run ended badly exits by itself (worker.py): wait for it."""
        if reusable and worker.alive:
            self.idle.append(worker)
        else:
            worker.close()

    def close(self) -> None:
        for worker in self.idle:
            worker.close()
        self.idle = []


# ---------------------------------------------------------------- a run being trained


@dataclasses.dataclass
class Active:
    """A run being trained, by its own process (`proc`) or by a warm worker (`worker`)."""

    run: PlannedRun
    started: float
    log: object
    proc: subprocess.Popen | None = None
    worker: Worker | None = None
    locked: bool = False  # the worker found run.lock held: not launched after all
    returncode: int | None = None
    last_growth: float = 0.0  # when metrics.jsonl last grew (stall_s)
    metrics_size: int = -1
    killed: bool = False  # by kill_stalled

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


def launch(run: PlannedRun, workdir: str, train_command: Sequence[str],
           extra_env: Sequence[tuple[str, str]], lock_fd: int,
           workers: Workers | None = None) -> Active:
    """Starts training `run`: in a warm worker from `workers` if given (the worker takes the
    run's lock itself), else in a process of its own that inherits `lock_fd`, run.lock."""
    argv, extra = prepare(run, workdir, train_command, extra_env)
    rundir = rundirs.run_dir(workdir, run.run_id)
    log_path = os.path.join(rundir, rundirs.LOG)
    log = open(log_path, "a")
    log.write(f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} launch: {shlex.join(argv)}\n")
    log.flush()
    if workers is not None:
        os.close(lock_fd)  # the worker takes run.lock itself, for as long as it trains the run
        request = {"job": dataclasses.asdict(run.job(rundir)), "rundir": rundir, "log": log_path}
        worker = workers.take({**os.environ, **extra}, run.config.step_shape)
        worker.shapes.add(run.config.step_shape)
        try:
            worker.submit(request)
        except OSError:  # it died since it last replied: a fresh one
            worker.close()
            worker = Worker({**os.environ, **extra}, workers.log_path)
            worker.submit(request)
        return Active(run, time.time(), log, worker=worker)
    try:
        # New session: a Ctrl-C in the terminal reaches the runner only, which then stops the
        # runs cleanly with SIGTERM. pass_fds: the child holds run.lock for as long as it lives.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **extra}, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=(lock_fd,),
                                preexec_fn=_die_with_parent(os.getpid()))
    finally:
        os.close(lock_fd)  # the child's copy keeps the lock
    return Active(run, time.time(), log, proc=proc)


def kill_stalled(active: list[Active], workdir: str, stall_s: float) -> None:
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


def signal_all(active: list[Active], sig: int) -> None:
    for a in active:
        try:
            os.killpg(a.pid, sig)
        except ProcessLookupError:
            pass


class Signals:
    """SIGINT/SIGTERM to the runner: the first stops the runs cleanly, the second kills them."""

    def __init__(self):
        self.count = 0  # signals received
        self.sent = 0  # escalation already applied: 1 SIGTERM sent, 2 SIGKILL sent
        self._old: dict = {}

    def __enter__(self) -> Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.count += 1

    def escalate(self, active: list[Active]) -> None:
        """SIGTERM to every run after the first signal, SIGKILL after the second."""
        if self.count and self.sent == 0:
            signal_all(active, signal.SIGTERM)
            self.sent = 1
        if self.count > 1 and self.sent == 1:
            signal_all(active, signal.SIGKILL)
            self.sent = 2

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
