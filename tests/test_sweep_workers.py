"""Warm workers (sweep/worker.py): real `loopscale train` runs one after another in one
process per slot, with the isolation of a process per run: a worker killed mid-run (as the
OOM killer would) fails that launch only; the run is retried by a fresh worker and resumes."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from loopscale.rundir import sweep as rundirs
from loopscale.sweep import load_sweep
from loopscale.sweep.plan import plan
from loopscale.sweep.runner import Options, run_sweep

# A sweep's runs see one CPU device, as on a user's machine (conftest.py).
pytestmark = pytest.mark.usefixtures("runs_on_one_device")

SWEEP = '''
from loopscale.sweep import base_sweep


def get_config(arg=None):
    s = base_sweep()
    s.name = "warm"
    s.families = {"base": {"experiment": "experiments/base.py:tiny", "overrides": {}}}
    s.overrides = {"model": {"scan": False, "d_model": 16, "n_heads": 1},
                   "train": {"eval_batches": 1, "batch_size": 8, "seq_len": 32}}
    s.seeds = (0, 1, 2)
    s.steps = 60
    s.evals, s.checkpoints = 1, 6
    return s
'''


def _workers() -> list[int]:
    """This process's own workers (its children): another test file running beside this one
    (pytest -n 2) may have warm workers of its own, which are not this test's to count or kill."""
    out = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "loopscale.sweep.worker"],
                         capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.slow
def test_warm_workers_train_every_run_and_survive_a_killed_worker(tmp_path):
    path = tmp_path / "warm.py"
    path.write_text(SWEEP)
    runs = plan(load_sweep(str(path))).runs
    workdir = str(tmp_path / "sweep")
    victim = runs[1].run_id
    killed = []

    def kill_mid_run():  # the worker training the second run, once it has logged a step
        metrics = os.path.join(rundirs.run_dir(workdir, victim), "metrics.jsonl")
        deadline = time.time() + 300
        while time.time() < deadline and not killed:
            if os.path.exists(metrics) and os.path.getsize(metrics) and len(_workers()) == 1:
                os.kill(_workers()[0], signal.SIGKILL)
                killed.append(True)
            time.sleep(0.01)

    threading.Thread(target=kill_mid_run, daemon=True).start()
    out = run_sweep(runs, workdir, Options(concurrency=1, warm=True, poll_s=0.05))
    assert killed and out.ok and len(out.done) == 3
    outcomes = {r.run_id: [a["outcome"] for a in rundirs.attempts(rundirs.run_dir(workdir, r.run_id))]
                for r in runs}
    assert outcomes[victim] == ["failed", "done"]
    assert all(o == ["done"] for rid, o in outcomes.items() if rid != victim)
    for run in runs:  # every step logged once, the killed run's included (it resumed)
        rows = [json.loads(line) for line in open(os.path.join(
            rundirs.run_dir(workdir, run.run_id), "metrics.jsonl"))]
        assert [r["step"] for r in rows if "loss" in r] == list(range(1, 61))
    # One worker trained the first run and then the second; the second's compile was reused.
    first = json.load(open(os.path.join(rundirs.run_dir(workdir, runs[0].run_id), "summary.json")))
    third = json.load(open(os.path.join(rundirs.run_dir(workdir, runs[2].run_id), "summary.json")))
    assert first["compile_time_s"] > 0 and third["compile_time_s"] == 0
    assert not _workers()  # none left behind
