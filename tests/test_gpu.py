"""The GPU check: `python -m loopscale.bench.gpu` (what benchmarks/gpu_check.sh runs) tested on
this CPU up to the point where it needs a GPU, and the gpu-marked test of a whole train step
(run only by the check, LOOPSCALE_TEST_GPU=1)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from loopscale.bench import gpu, steps
from loopscale.parallel import mesh as mesh_lib


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory):
    """The check on the :tiny presets, 2 timed rounds, with a JUnit file of two tests (one
    failing) folded in, run as the script runs it. Base's pair and MoE's: Looped's is Base's
    with loops (the same code path; a minute of compiles saved)."""
    out = tmp_path_factory.mktemp("gpu_check")
    junit = out / "tests.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.test_a" name="test_ok"/>'
        '<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>'
        '</testsuite></testsuites>')
    run = subprocess.run([sys.executable, "-m", "loopscale.bench.gpu", f"--out={out}/c.json",
                          f"--tests={junit}", "--size=tiny", "--batch=2", "--steps=2",
                          "--families=base,moe"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    assert run.returncode == 0, run.stderr
    return json.loads((out / "c.json").read_text())


def test_the_check_writes_one_json_of_every_pair(tiny_check):
    r = tiny_check
    assert (r["backend"], r["attention_auto"]) == ("cpu", "xla")
    assert [(p["pair"], p["family"]) for p in r["pairs"]] == [
        ("attention", "base"), ("dispatch", "moe")]
    for pair in r["pairs"][:1]:  # cuDNN needs a GPU: said, not faked
        assert pair["variants"]["cudnn"] == {"not_run": "cuDNN attention needs a GPU (backend: cpu)"}
        xla = pair["variants"]["xla"]
        assert xla["step_s"] > 0 and xla["tokens_per_s"] == pytest.approx(2 * 128 / xla["step_s"])
        assert xla["mfu_maxtext"] is None  # no peak for a CPU
        assert xla["memory"]["temporaries"] > 0
    moe = r["pairs"][1]
    assert set(moe["variants"]) == {"dropless", "capacity"}
    assert moe["dropless_over_capacity"] == pytest.approx(
        moe["variants"]["dropless"]["step_s"] / moe["variants"]["capacity"]["step_s"])
    assert "est_step_time_s" in moe["variants"]["dropless"]  # XLA's estimate beside the measure
    assert r["gpu_tests"] == {"tests": 2, "passed": 1, "failed": ["tests.test_a::test_bad"],
                              "skipped": 0}


def test_the_paper_check_refuses_a_machine_without_a_gpu(tmp_path):
    run = subprocess.run([sys.executable, "-m", "loopscale.bench.gpu", f"--out={tmp_path}/c.json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "loopscale.bench.gpu: the GPU check needs an NVIDIA GPU; JAX's backend is cpu "
        "(install the gpu extra: make install-gpu)"]
    assert not (tmp_path / "c.json").exists()


def test_the_script_installs_carried_wheels_and_runs_the_gpu_tests_first():
    """benchmarks/gpu_check.sh, read: wheels from .whl/ without the network, the gpu-marked
    tests under LOOPSCALE_TEST_GPU=1 into a JUnit file that the JSON folds in."""
    script = open("benchmarks/gpu_check.sh").read()
    assert "source benchmarks/gpu_python.sh" in script
    python = open("benchmarks/gpu_python.sh").read()
    assert "--no-index" in python and ".whl" in python
    assert "LOOPSCALE_TEST_GPU=1" in script and "--junitxml" in script
    assert "loopscale.bench.gpu" in script and "--tests=" in script


def test_the_study_script_trains_measures_and_reports_the_pair(tmp_path, runs_on_one_device):
    """benchmarks/gpu_study.sh at the CPU smoke-test size: the same sweep, measurements and
    analysis as on the GPU (looped against unshared, learning rate 1e-3, no intermediate
    supervision), one seed each; the report and study.json written where RESULTS says."""
    env = {**os.environ, "ARG": "tiny", "SEEDS": "(0,)", "STEPS": "8", "CONCURRENCY": "1",
           "RESULTS": str(tmp_path / "results"), "PY": sys.executable}
    run = subprocess.run(["bash", "benchmarks/gpu_study.sh", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    study = json.loads((tmp_path / "results" / "study.json").read_text())
    assert study == {**study, "arg": "tiny", "steps": 8, "seeds": "(0,)", "backend": "cpu",
                     "sweep_exit": 0}
    runs = sorted((tmp_path / "out" / "sweep" / "runs").iterdir())
    assert len(runs) == 2
    for r in runs:
        config = json.loads((r / "config.json").read_text())
        assert config["train"]["steps"] == 8 and config["train"]["lr"] == 1e-3
        assert config["train"]["intermediate_supervision"] is False
        assert (r / "eval" / "accuracy.json").exists() and (r / "eval" / "lens.json").exists()
    report = (tmp_path / "results" / "report.md").read_text()
    assert "| looped | 2 x 2 | 0.001 | no | 0 / 1 | 0 |" in report
    assert "| unshared | 4 x 1 | 0.001 | no | 0 / 1 | 0 |" in report


@pytest.mark.gpu
def test_a_train_step_on_the_gpu_has_the_cpus_loss():
    """One optimiser step of Base :tiny in bfloat16 (cuDNN attention on the GPU, the einsums on
    the CPU): the same loss within bfloat16's precision, before and after the update."""
    config = steps.load("base.py:tiny", ["--config.model.dtype=bfloat16",
                                         "--config.train.seq_len=128"])
    batch = steps.synthetic_batch(config)
    losses = {}
    for platform in ("gpu", "cpu"):
        step = steps.TrainStep(config, jax.devices(platform)[:1], batch)
        with mesh_lib.activate(step.s.mesh):
            state, first = step.compiled(step.state, step.batch, step.lr_factor)
            _, second = step.compiled(state, step.batch, step.lr_factor)
        losses[platform] = [float(first["loss"]), float(second["loss"])]
    np.testing.assert_allclose(losses["gpu"], losses["cpu"], rtol=2e-2)
