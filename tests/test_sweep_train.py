"""The sweep runner with the real `loopscale train`: kill -9 the runner while runs are training
(after their first checkpoint), run it again, and every planned run ends completed with each
step logged exactly once; then collect reads them. Two runs of 8 steps on 40 KJV chapters."""

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import trainkit

from loopscale.rundir import sweep as rundirs
from loopscale.sweep import load_sweep
from loopscale.sweep.collect import collect
from loopscale.sweep.plan import plan

SWEEP = textwrap.dedent('''
    from loopscale.sweep import base_sweep
    def get_config(arg=None):
        s = base_sweep()
        s.name = "micro_train"
        s.families = {"base": {"experiment": "experiments/base.py:tiny", "overrides": {}}}
        s.overrides = {"data": {"paths": "CORPUS", "cache_dir": "CACHE"},
                       "model": {"n_unique": 2},
                       "train": {"eval_batches": 2, "seq_len": 32, "batch_size": 8}}
        s.shape.kind, s.shape.widths, s.shape.head_dim = "width", (16, 32), 8
        s.lrs = (3e-3,)
        s.steps = 8
        s.warmup_frac = 0.25
        s.evals, s.checkpoints = 0, 4  # evaluations: the final one only
        s.peak_flops, s.mfu = 1e11, 0.3
        return s
''')


def train_rows(rundir):
    with open(os.path.join(rundir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if "loss" in r]


def test_kill_9_mid_training_and_rerun(tmp_path):
    corpus = trainkit.write_corpus(str(tmp_path / "text"))
    sweep_file = tmp_path / "micro_train.py"
    sweep_file.write_text(SWEEP.replace("CORPUS", corpus).replace("CACHE", str(tmp_path / "cache")))
    workdir = str(tmp_path / "sweep")
    cmd = [sys.executable, "-m", "loopscale.cli", "sweep", f"--sweep={sweep_file}",
           f"--workdir={workdir}", "--concurrency=2"]
    # One CPU device per run, as a user's shell has it (conftest gives this process 8).
    env = trainkit.cpu_env(1)
    runner = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and runner.poll() is None:
        if glob.glob(os.path.join(workdir, "runs", "*", "checkpoints", "*")):
            break
        time.sleep(0.1)
    assert runner.poll() is None, "the runner finished before it could be killed"
    runner.send_signal(signal.SIGKILL)
    runner.wait()

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    runs = plan(load_sweep(str(sweep_file))).runs
    assert sorted(os.listdir(os.path.join(workdir, "runs"))) == sorted(x.run_id for x in runs)
    for run in runs:
        rundir = rundirs.run_dir(workdir, run.run_id)
        summary = json.load(open(os.path.join(rundir, "summary.json")))
        assert summary["status"] == "completed" and summary["steps"] == 8
        assert [row["step"] for row in train_rows(rundir)] == list(range(1, 9))
        assert rundirs.failures(rundir) == (0, False)
        assert os.path.getsize(os.path.join(rundir, "train.log")) > 0
    launches = sum(open(os.path.join(rundirs.run_dir(workdir, x.run_id), "train.log")).read()
                   .count("launch:") for x in runs)
    assert launches >= 3  # the interrupted run(s) were launched again and resumed
    assert os.listdir(os.path.join(workdir, "jax_cache"))  # the shared compilation cache
    rows = collect([workdir])
    assert [row["status"] for row in rows] == ["completed", "completed"]
    assert all(row["loss"] > 0 and row["flops"] > 0 for row in rows)
