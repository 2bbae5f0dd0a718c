"""The local sweep runner against a fake `loopscale train` (fast, and able to fail on purpose):
resume, skip, retries, bad input, the lock, bounded concurrency, and kill -9 of the runner at
any moment followed by a rerun that ends with every run done exactly once."""

import fcntl
import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from loopscale.rundir import sweep as rundirs
from loopscale.sweep import load_sweep
from loopscale.sweep.plan import plan
from loopscale.sweep.runner import Options, SweepLock, run_sweep
from loopscale.errors import UsageError

# A sweep's runs see one CPU device, as on a user's machine (conftest.py).
pytestmark = pytest.mark.usefixtures("runs_on_one_device")

# A stand-in for `loopscale train` with its contract: config.json (refuses another config),
# summary.json with status, metrics.jsonl trimmed to the checkpoint on resume, a checkpoint
# every 2 steps, SIGTERM -> checkpoint and exit 0, exit 3 when diverged, 2 on bad input.
# The family name (config.name) picks a behaviour: ok, diverge, flaky (fails once), broken
# (always fails), bad (bad input).
FAKE_TRAIN = textwrap.dedent('''
    import json, os, signal, sys, time
    args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
    wd = args["workdir"]
    name, steps = args["config.name"], int(args["config.train.steps"])
    os.makedirs(wd, exist_ok=True)
    def write(path, data):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    def read(path):
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
    config = {k: v for k, v in args.items() if k != "workdir"}
    old = read(os.path.join(wd, "config.json"))
    if old is not None and old != config:
        print("workdir holds a run with a different config", file=sys.stderr); sys.exit(2)
    if name == "bad":
        print("bad input", file=sys.stderr); sys.exit(2)
    summary = read(os.path.join(wd, "summary.json")) or {}
    if summary.get("status") in ("completed", "diverged"):
        sys.exit(3 if summary["status"] == "diverged" else 0)
    write(os.path.join(wd, "config.json"), config)
    log = os.environ.get("FAKE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"id": os.path.basename(wd), "start": time.time()}) + "\\n")
    if name == "flaky" or name == "broken":
        count = (read(os.path.join(wd, "fail_count")) or 0) + 1
        write(os.path.join(wd, "fail_count"), count)
        if name == "broken" or count == 1:
            write(os.path.join(wd, "summary.json"), {"status": "failed"})
            sys.exit(1)
    ckpt = read(os.path.join(wd, "ckpt")) or 0
    rows = []
    if os.path.exists(os.path.join(wd, "metrics.jsonl")):
        with open(os.path.join(wd, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    with open(os.path.join(wd, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\\n" for r in rows if r["step"] <= ckpt)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    write(os.path.join(wd, "summary.json"), {"status": "running"})
    started = time.time()
    with open(os.path.join(wd, "metrics.jsonl"), "a") as f:
        for step in range(ckpt + 1, steps + 1):
            time.sleep(float(os.environ.get("FAKE_STEP_S", "0.02")))
            f.write(json.dumps({"step": step, "loss": 3.0 - step / 100}) + "\\n"); f.flush()
            if name == "diverge" and step == 2:
                write(os.path.join(wd, "summary.json"), {"status": "diverged", "steps": step})
                sys.exit(3)
            if step % 2 == 0 or step == steps or stop:
                write(os.path.join(wd, "ckpt"), step)
            if stop:
                sys.exit(0)
    write(os.path.join(wd, "summary.json"), {
        "status": "completed", "final_eval_loss": 2.0, "best_eval_loss": 1.9, "steps": steps,
        "tokens": steps * 100, "flops": steps * 1e6, "wall_time_s": time.time() - started})
''')

SWEEP = textwrap.dedent('''
    from loopscale.sweep import base_sweep
    def get_config(arg=None):
        s = base_sweep()
        s.name = "micro"
        s.families = {n: {"experiment": "experiments/base.py:tiny", "overrides": {}}
                      for n in ("ok", "diverge", "flaky", "broken", "bad")}
        s.select = "ok"
        s.shape.kind, s.shape.widths, s.shape.head_dim = "width", (64, 128), 64
        s.steps = 10
        s.peak_flops, s.mfu = 1e11, 0.5
        return s
''')


@pytest.fixture
def kit(tmp_path):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE_TRAIN)
    sweep = tmp_path / "micro.py"
    sweep.write_text(SWEEP)
    return {"fake": str(fake), "sweep": str(sweep), "dir": str(tmp_path / "sweep")}


def runs_of(kit, *overrides):
    return plan(load_sweep(kit["sweep"], list(overrides))).runs


def options(kit, **kw):
    return Options(train_command=(sys.executable, kit["fake"]), poll_s=0.05, **kw)


def steps_logged(workdir, run_id):
    with open(os.path.join(rundirs.run_dir(workdir, run_id), "metrics.jsonl")) as f:
        return [json.loads(line)["step"] for line in f if line.strip()]


def test_runs_everything_then_skips_what_is_done(kit):
    runs = runs_of(kit, "--sweep.select=ok,diverge")
    assert len(runs) == 4
    out = run_sweep(runs, kit["dir"], options(kit, concurrency=2))
    assert out.ok and len(out.done) == 4
    statuses = {r.family: rundirs.status(rundirs.run_dir(kit["dir"], r.run_id)) for r in runs}
    assert statuses == {"ok": "completed", "diverge": "diverged"}
    for run in runs:
        rundir = rundirs.run_dir(kit["dir"], run.run_id)
        assert os.access(os.path.join(rundir, "command.sh"), os.X_OK)
        assert json.load(open(os.path.join(rundir, "run.json")))["run_id"] == run.run_id
        with open(os.path.join(rundir, "command.sh")) as f:
            script = f.read()
        # Every run shares the sweep's compilation cache.
        assert f"JAX_COMPILATION_CACHE_DIR={os.path.join(kit['dir'], 'jax_cache')}" in script
        assert f"--workdir={rundir}" in script
    again = run_sweep(runs, kit["dir"], options(kit))
    assert again.ok and len(again.done) == 4
    for run in runs:  # nothing was launched a second time
        assert len(rundirs.attempts(rundirs.run_dir(kit["dir"], run.run_id))) == 1


def test_failed_runs_are_retried_up_to_the_limit(kit):
    runs = runs_of(kit, "--sweep.select=flaky,broken,bad", "--sweep.shape.widths=(64,)")
    out = run_sweep(runs, kit["dir"], options(kit, max_retries=2))
    by_family = {r.family: r.run_id for r in runs}
    assert set(out.done) == {by_family["flaky"]}
    assert sorted(out.failed) == sorted([by_family["broken"], by_family["bad"]])
    n = {f: len(rundirs.attempts(rundirs.run_dir(kit["dir"], i))) for f, i in by_family.items()}
    assert n == {"flaky": 2, "broken": 3, "bad": 1}  # bad input is never retried
    # The limit holds across invocations: nothing is launched again...
    out = run_sweep(runs, kit["dir"], options(kit, max_retries=2))
    assert len(rundirs.attempts(rundirs.run_dir(kit["dir"], by_family["broken"]))) == 3
    # ...until the limit is raised.
    out = run_sweep(runs, kit["dir"], options(kit, max_retries=3))
    assert len(rundirs.attempts(rundirs.run_dir(kit["dir"], by_family["broken"]))) == 4
    assert not out.ok


def test_concurrency_is_bounded(kit, monkeypatch):
    log = os.path.join(os.path.dirname(kit["dir"]), "starts.jsonl")
    monkeypatch.setenv("FAKE_LOG", log)
    monkeypatch.setenv("FAKE_STEP_S", "0.03")
    runs = runs_of(kit, "--sweep.select=ok,diverge", "--sweep.seeds=(0,1)")
    assert len(runs) == 8
    run_sweep(runs, kit["dir"], options(kit, concurrency=3))
    spans = []
    for line in open(log):
        run_id = json.loads(line)["id"]
        a = rundirs.attempts(rundirs.run_dir(kit["dir"], run_id))[0]
        spans.append((a["started"], a["ended"]))
    peak = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert 2 <= peak <= 3


def test_a_second_runner_is_locked_out(kit):
    with SweepLock(kit["dir"]):
        with pytest.raises(UsageError, match="another sweep runner"):
            with SweepLock(kit["dir"]):
                pass
    with SweepLock(kit["dir"]):  # released on exit
        pass


def _sweep_cmd(kit, *extra):
    return [sys.executable, "-m", "loopscale.cli", "sweep", f"--sweep={kit['sweep']}",
            f"--workdir={kit['dir']}", f"--train-command={sys.executable} {kit['fake']}", *extra]


def test_lock_on_the_command_line(kit):
    with SweepLock(kit["dir"]):
        r = subprocess.run(_sweep_cmd(kit), capture_output=True, text=True)
    assert r.returncode == 2 and "another sweep runner" in r.stderr


def _logged(kit) -> int:
    total = 0
    for path in glob.glob(os.path.join(kit["dir"], "runs", "*", "metrics.jsonl")):
        with open(path) as f:
            total += sum(1 for _ in f)
    return total


# Kill points: as soon as a run has its directory, mid-way through the runs, and near the end
# (some runs finished, one diverged, others still training).
@pytest.mark.parametrize("kill_at_steps", [0, 9, 25])
def test_kill_9_and_rerun_gives_every_run_once(kit, kill_at_steps):
    env = {**os.environ, "FAKE_STEP_S": "0.05"}
    extra = ["--sweep.select=ok,diverge", "--sweep.steps=16", "--concurrency=2"]
    runner = subprocess.Popen(_sweep_cmd(kit, *extra), env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and runner.poll() is None:
        started = glob.glob(os.path.join(kit["dir"], "runs", "*", "command.sh"))
        if started and _logged(kit) >= kill_at_steps:
            break
        time.sleep(0.01)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    assert runner.returncode == -signal.SIGKILL  # killed while working, not finished
    # Its training processes get SIGTERM from the kernel (no orphan trains on unsupervised):
    # each checkpoints, exits and frees its run.lock.
    deadline = time.time() + 30
    for lock in glob.glob(os.path.join(kit["dir"], "runs", "*", "run.lock")):
        fd = os.open(lock, os.O_RDWR)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.time() < deadline, f"{lock} still held"
                time.sleep(0.05)
        os.close(fd)
    r = subprocess.run(_sweep_cmd(kit, *extra), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr + r.stdout
    runs = runs_of(kit, "--sweep.select=ok,diverge", "--sweep.steps=16")
    assert sorted(os.listdir(os.path.join(kit["dir"], "runs"))) == sorted(x.run_id for x in runs)
    for run in runs:
        status = rundirs.status(rundirs.run_dir(kit["dir"], run.run_id))
        steps = steps_logged(kit["dir"], run.run_id)
        if run.family == "ok":
            assert status == "completed" and steps == list(range(1, 17)), steps
        else:
            assert status == "diverged" and steps == [1, 2]
        assert rundirs.failures(rundirs.run_dir(kit["dir"], run.run_id)) == (0, False)


def test_sigterm_stops_runs_cleanly_and_they_resume(kit):
    env = {**os.environ, "FAKE_STEP_S": "0.05"}
    extra = ["--sweep.select=ok", "--sweep.steps=40", "--concurrency=2"]
    runner = subprocess.Popen(_sweep_cmd(kit, *extra), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    # Wait until both runs are training, then interrupt the runner as Ctrl-C would.
    deadline = time.time() + 60
    while time.time() < deadline:
        logged = glob.glob(os.path.join(kit["dir"], "runs", "*", "metrics.jsonl"))
        if len(logged) == 2 and all(os.path.getsize(p) for p in logged):
            break
        time.sleep(0.05)
    runner.send_signal(signal.SIGINT)
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 1 and "2 interrupted" in out, out + err
    runs = runs_of(kit, "--sweep.select=ok", "--sweep.steps=40")
    for run in runs:
        rundir = rundirs.run_dir(kit["dir"], run.run_id)
        assert rundirs.status(rundir) == "running"
        assert [a["outcome"] for a in rundirs.attempts(rundir)] == ["interrupted"]
    r = subprocess.run(_sweep_cmd(kit, *extra), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for run in runs:
        assert steps_logged(kit["dir"], run.run_id) == list(range(1, 41))
        assert rundirs.failures(rundirs.run_dir(kit["dir"], run.run_id)) == (0, False)


def test_dry_run_prints_commands_and_writes_nothing(kit):
    r = subprocess.run(_sweep_cmd(kit, "--dry-run"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("--workdir=") == 2 and "(pending)" in r.stdout
    assert not os.path.exists(kit["dir"])


def test_a_run_held_by_an_orphan_waits_for_it(kit):
    runs = runs_of(kit, "--sweep.select=ok", "--sweep.shape.widths=(64,)")
    rundir = rundirs.run_dir(kit["dir"], runs[0].run_id)
    os.makedirs(rundir)
    fd = os.open(os.path.join(rundir, "run.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a training process left by a killed runner
    import threading

    released = []

    def release():
        time.sleep(1.0)
        released.append(time.time())
        os.close(fd)

    threading.Thread(target=release).start()
    out = run_sweep(runs, kit["dir"], options(kit))
    assert out.ok
    (attempt,) = rundirs.attempts(rundir)
    assert attempt["started"] >= released[0]


def test_a_hung_run_is_killed_and_retried(kit, monkeypatch):
    """No metrics for stall_s: the launch is killed, counted as failed, and retried."""
    monkeypatch.setenv("FAKE_STEP_S", "30")  # a step that never ends, as far as the test goes
    runs = runs_of(kit, "--sweep.shape.widths=(64,)")
    out = run_sweep(runs, kit["dir"], options(kit, stall_s=1.0, max_retries=1))
    assert out.failed == [runs[0].run_id]
    attempts = rundirs.attempts(rundirs.run_dir(kit["dir"], runs[0].run_id))
    assert [a["rc"] for a in attempts] == [-signal.SIGKILL] * 2
    log = open(os.path.join(rundirs.run_dir(kit["dir"], runs[0].run_id), "train.log")).read()
    assert log.count("no progress for 1 s: killed") == 2
