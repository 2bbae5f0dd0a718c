"""Run and sweep directories on gs://, against a GCS emulator on loopback (tests/gcs.py): a run
stopped mid-way (SIGKILL, then SIGTERM) resumes bit for bit as on a local disk, with its
checkpoints (orbax, through tensorstore), metrics (written whole: an object store has no
append), TensorBoard events, evaluation and JAX's compilation cache all on the bucket and
nothing written to a local path by mistake; a sweep directory there collects, fits, reports
and shows its status; a bucket that does not exist is one line."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import gcs
import pandas as pd
import pytest
import sweepkit
import trainkit
from etils import epath

from loopscale.cli import main
from loopscale.sweep import status
from loopscale.sweep.collect import collect

BUCKET = "loopscale-test"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    with gcs.emulator(BUCKET, tmp_path_factory.mktemp("gcs")):
        yield f"gs://{BUCKET}"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(root / "text")), str(root / "cache")


def _env(cache_dir) -> dict:
    """One CPU device, the emulator's variables (inherited) and a shared compilation cache, so
    the three processes below compile the step once: on the bucket, as the launch scripts put
    a gs:// sweep's (JAX reads and writes it through etils.epath)."""
    return {**trainkit.cpu_env(1), "JAX_COMPILATION_CACHE_DIR": str(cache_dir),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def _wait_for_checkpoint(checkpoints: epath.Path, step: int, proc, timeout=300):
    """Until orbax has committed checkpoint `step` (its commit marker is written last)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        if (checkpoints / str(step) / "commit_success.txt").exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"checkpoint {step} never committed")


def test_a_run_on_gs_killed_mid_way_resumes_bit_identical(bucket, corpus, tmp_path):
    args = ["train", f"--config={REPO}/experiments/looped.py:tiny", "--eval=ppl",
            *trainkit.overrides(*corpus, **{"train.steps": 60, "train.checkpoint_every": 10,
                                            "train.eval_every": 10})]
    env = _env(f"{bucket}/jax_cache")
    local = tmp_path / "local"
    done = trainkit.run_cli(*args, f"--workdir={local}", env=env)
    assert done.returncode == 0, done.stderr[-2000:]

    # Started from an empty folder: a gs:// path taken for a local one would land in it.
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run = epath.Path(f"{bucket}/runs/killed")
    proc = subprocess.Popen(trainkit.loopscale_cmd(*args, f"--workdir={run}"), env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(run / "checkpoints", 20, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((run / "summary.json").read_text())["status"] == "running"
    # The rows the checkpoint has seen were stored with it (metrics.jsonl is written whole).
    assert max(r["step"] for r in trainkit.metric_rows(run)) >= 20
    # Resumed, then stopped by SIGTERM (a pod's preemption notice) after its step-40
    # checkpoint: it saves where it is, writes the metrics it holds and exits 0, still running.
    proc = subprocess.Popen(trainkit.loopscale_cmd(*args, f"--workdir={run}"), env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_checkpoint(run / "checkpoints", 40, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    saved = max(int(n) for n in gcs.names(run / "checkpoints") if n.isdigit())
    assert 40 <= saved < 60
    assert max(r["step"] for r in trainkit.metric_rows(run) if "loss" in r) == saved
    assert json.loads((run / "summary.json").read_text())["status"] == "running"
    resumed = subprocess.run(trainkit.loopscale_cmd(*args, f"--workdir={run}"), env=env, cwd=cwd,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Append mode" not in resumed.stderr  # gcsfs's warning: an append became a rewrite

    rows, straight = trainkit.metric_rows(run), trainkit.metric_rows(local)
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 61))  # each step once
    assert [r["step"] for r in rows if "eval_loss" in r] == [10, 20, 30, 40, 50, 60]
    assert [r["loss"] for r in rows if "loss" in r] == \
        [r["loss"] for r in straight if "loss" in r]  # bit-identical to the local run
    assert trainkit.tensorboard_steps(run, "loss") == list(range(1, 61))
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert json.loads((run / "eval" / "ppl.json").read_text()) == \
        json.loads((local / "eval" / "ppl.json").read_text())
    # The newest two are kept (train.keep_checkpoints), the one SIGTERM saved among them when
    # it came after step 50.
    assert sorted(p.name for p in (local / "checkpoints").iterdir()) == ["50", "60"]
    assert sorted(int(n) for n in gcs.names(run / "checkpoints")) == [max(saved, 50), 60]
    assert os.listdir(cwd) == []
    assert list(epath.Path(f"{bucket}/jax_cache").iterdir())  # the steps compiled into it


def test_a_sweep_on_gs_collects_fits_reports_and_shows_its_status(bucket, tmp_path):
    """The sweep directory a cluster's runs leave on the bucket (sweepkit: completed runs on a
    law, one run in each other state), read where it lies: collect writes its table there,
    fit and report read it, and status counts every state; the running run is told from a
    stopped one by its metrics.jsonl's age (an object store has no locks)."""
    workdir = f"{bucket}/sweep"
    runs = sweepkit.write_law_sweep(workdir)
    running = epath.Path(f"{workdir}/runs/{runs[1].run_id}")
    (running / "metrics.jsonl").write_text(
        json.dumps({"step": 7, "loss": 3.25, "step_time_s": 0.5}) + "\n")

    table = f"{workdir}/results.csv"
    assert main(["collect", workdir, f"--out={table}"]) == 0
    assert len(pd.read_csv(epath.Path(table).open())) == len(runs)
    flags = ["--bootstrap=0", "--grid=small"]
    assert main(["fit", table, f"--out={workdir}/fit.json", *flags]) == 0
    fit = json.loads(epath.Path(f"{workdir}/fit.json").read_text())
    assert set(fit["families"]) == {"base", "looped", "moe", "looped_moe"}
    assert main(["report", workdir, f"--out={workdir}/report", *flags]) == 0
    assert json.loads(epath.Path(f"{workdir}/report/fit.json").read_text())["families"] \
        == fit["families"]

    doc = status.summary(status.read(workdir))
    budgets = [float(g["budget"]) for g in doc["groups"] if g["family"] == "base"]
    assert budgets == sorted(budgets) and len(budgets) == 3  # in FLOPs, not as strings
    assert doc["states"] == {"done": len(runs) - 4, "running": 1, "stopped": 0, "failed": 1,
                             "diverged": 1, "pending": 1}
    assert doc["running"] == [{"run_id": runs[1].run_id, "family": runs[1].row["family"],
                               "budget": str(runs[1].row["budget"]), "step": 7,
                               "of": runs[1].row["steps"], "loss": 3.25}]


def test_a_launch_script_writes_its_plan_on_the_bucket(bucket, tmp_path):
    """`loopscale sweep --launcher=tpu-pod --workdir=gs://...`: the script locally, the plan and
    each run's plan row on the bucket, where collect finds every run pending."""
    workdir = f"{bucket}/launched"
    assert main(["sweep", "--sweep=sweeps/isoflop_cpu.py", "--launcher=tpu-pod",
                 f"--workdir={workdir}", f"--script-dir={tmp_path}", "--tpu-name=slice",
                 "--zone=us-central2-b"]) == 0
    assert (tmp_path / "tpu-pod.sh").exists()
    rows = collect([workdir])
    assert rows and {r["status"] for r in rows} == {"pending"}
    assert all((epath.Path(workdir) / "runs" / r["run_id"] / "run.json").exists() for r in rows)


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_a_bucket_that_does_not_exist_is_one_line(bucket, tmp_path, command):
    workdir = f"gs://no-such-{BUCKET}/x"
    args = {"train": ["train", "--config=experiments/base.py:tiny"],
            "sweep": ["sweep", "--sweep=sweeps/isoflop_cpu.py", "--launcher=slurm",
                      f"--script-dir={tmp_path}"]}[command]
    r = trainkit.run_cli(*args, f"--workdir={workdir}", env=trainkit.cpu_env(1))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert workdir in r.stderr and "does not exist" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no script written either
