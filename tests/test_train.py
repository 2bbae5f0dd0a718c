"""The trainer end to end on CPU: run directory contents, sharding equivalence, resume after
SIGKILL bit for bit, SIGTERM, divergence, and refusing a workdir of another run."""

import json
import os
import signal
import subprocess
import time

import jax
import numpy as np
import pytest
import trainkit

from loopscale.errors import UsageError
from loopscale.rundir.status import ExitCode
from loopscale.train.trainer import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(root / "text")), str(root / "cache")


rows = trainkit.metric_rows


def train_losses(workdir):
    return {r["step"]: r["loss"] for r in rows(workdir) if "loss" in r}


def summary(workdir):
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


# Two heads, to split over tensor=2; and the meshes the sharded runs below are compared on.
TWO_HEADS = {"model.n_heads": 2, "model.head_dim": 32}
LOOPED_MESH = {"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}
LOOPED_MOE_MESH = {"mesh.data": 2, "mesh.fsdp": 1, "mesh.tensor": 2, "mesh.expert": 2}


def test_run_directory_is_complete(corpus, tmp_path):
    # On test_sharded_losses_match_one_device's Looped-MoE model and mesh (data, tensor and
    # expert axes): the same step shape, so that test's sharded run reuses these compiled steps
    # (sharded_state._shared; steps, eval and checkpoint cadence are host-side).
    cfg = trainkit.config("looped_moe", *corpus, **TWO_HEADS, **LOOPED_MOE_MESH)
    assert train(cfg, str(tmp_path / "run")) == 0
    run = tmp_path / "run"
    logged = rows(run)
    steps = [r["step"] for r in logged if "loss" in r]
    assert steps == list(range(1, 7))
    last = [r for r in logged if "loss" in r][-1]
    for key in ["loss", "lr", "grad_norm", "update_norm", "tokens", "flops", "step_time_s",
                "tokens_per_s", "mfu", "mfu_maxtext", "residual_norm", "expert_load", "lb_loss",
                "router_z", "dropped_frac", "route_identical", "route_disjoint", "grad_norm_block",
                "grad_norm_cv"]:
        assert key in last, key
    assert len(last["residual_norm"]) == cfg.model.n_loops
    assert np.asarray(last["expert_load"]).shape == (cfg.model.n_loops, cfg.model.n_experts)
    assert last["tokens"] == 6 * 8 * 32
    assert any("eval_loss" in r for r in logged)
    s = summary(run)
    assert s["status"] == "completed" and s["steps"] == 6 and s["tokens"] == 6 * 8 * 32
    for key in ["final_train_loss", "final_eval_loss", "best_eval_loss", "flops", "params_unique",
                "params_embedding", "wall_time_s", "compile_time_s", "collapsed", "collapse_rule"]:
        assert key in s, key
    assert s["flops"] == pytest.approx(last["flops"])
    assert json.loads((run / "config.json").read_text())["model"]["ffn"] == "moe"
    assert list((run / "tensorboard").glob("events.out.tfevents*"))
    assert (run / "checkpoints").is_dir()
    # Re-running a completed run does nothing and changes nothing.
    before = (run / "metrics.jsonl").read_text()
    assert train(cfg, str(run)) == 0
    assert (run / "metrics.jsonl").read_text() == before


def test_loss_decreases_on_text(corpus, tmp_path):
    cfg = trainkit.config("base", *corpus, **{"train.steps": 30, "train.eval_every": 0,
                                              "train.checkpoint_every": 0, "train.lr": 1e-2})
    assert train(cfg, str(tmp_path / "run")) == 0
    losses = train_losses(tmp_path / "run")
    assert np.mean([losses[s] for s in range(26, 31)]) < losses[1] - 1.0


@pytest.mark.parametrize("experiment,mesh", [("looped", LOOPED_MESH),
                                             ("looped_moe", LOOPED_MOE_MESH)])
def test_sharded_losses_match_one_device(corpus, tmp_path, experiment, mesh):
    fields = {"train.steps": 5, "train.eval_every": 0, "train.checkpoint_every": 0, **TWO_HEADS}
    one = trainkit.config(experiment, *corpus, **fields)
    eight = trainkit.config(experiment, *corpus, **fields, **mesh)
    assert train(one, str(tmp_path / "one"), devices=jax.devices()[:1]) == 0
    assert train(eight, str(tmp_path / "eight")) == 0
    a, b = train_losses(tmp_path / "one"), train_losses(tmp_path / "eight")
    assert a.keys() == b.keys() == set(range(1, 6))
    np.testing.assert_allclose([b[k] for k in sorted(b)], [a[k] for k in sorted(a)], atol=1e-4)


def test_indivisible_mesh_is_a_usage_error(corpus, tmp_path):
    cfg = trainkit.config("looped", *corpus, **{"mesh.tensor": 2, "mesh.data": 4})  # 1 head
    with pytest.raises(UsageError, match="cannot be split 2 ways"):
        train(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "config.json").exists()  # a refused run leaves no trace


def test_mismatched_workdir_is_refused_untouched(corpus, tmp_path):
    # At test_loss_decreases_on_text's lr: the same step shape (Config.step_shape), so this run
    # reuses that test's compiled steps (sharded_state._shared) instead of compiling its own.
    cfg = trainkit.config("base", *corpus, **{"train.steps": 2, "train.eval_every": 0,
                                              "train.lr": 1e-2})
    run = tmp_path / "run"
    assert train(cfg, str(run)) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    other = trainkit.config("base", *corpus, **{"train.steps": 2, "train.eval_every": 0,
                                                "train.lr": 1.0})
    with pytest.raises(UsageError, match="train.lr"):
        train(other, str(run))
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


TIMED = {"step_time_s", "tokens_per_s", "mfu", "mfu_maxtext"}  # the row's fields read off a clock


def test_the_host_reads_logged_steps_only_and_a_resume_is_the_same_run(corpus, tmp_path,
                                                                       monkeypatch):
    """train.log_every 4: the trainer fetches the steps' metrics four at a time, once the step
    after a logged one is dispatched (and wherever it must wait: here the step-6 checkpoint and
    the end), each step's row still judged by the divergence rule; rows go to metrics.jsonl at
    steps 4, 8, 12. Stopped by SIGTERM after step 4 and resumed, the run logs exactly what the
    straight one does: its divergence rule and gradient-oscillation window are taken up from
    the checkpoint (replayed over the logged rows, the window would hold one step of five).
    test_loss_decreases_on_text's step shape: its compiled step."""
    from loopscale.train import step_log

    cfg = trainkit.config("base", *corpus, **{"train.steps": 12, "train.eval_every": 0,
                                              "train.checkpoint_every": 6, "train.lr": 1e-2,
                                              "train.log_every": 4})
    read, reads = step_log.StepLog.read, []

    def counted(self, pending, extra):
        reads.append([p.done for p in pending])
        return read(self, pending, extra)

    monkeypatch.setattr(step_log.StepLog, "read", counted)
    assert train(cfg, str(tmp_path / "straight")) == 0
    assert reads == [[1, 2, 3, 4], [5, 6], [7, 8], [9, 10, 11, 12]]

    def stopped_after_4(self, pending, extra):
        if pending[-1].done == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: stop at the next step
        return read(self, pending, extra)

    monkeypatch.setattr(step_log.StepLog, "read", stopped_after_4)
    run = tmp_path / "stopped"
    assert train(cfg, str(run)) == 0 and summary(run)["status"] == "running"
    saved = [int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved and max(saved) < 6
    monkeypatch.setattr(step_log.StepLog, "read", read)
    assert train(cfg, str(run)) == 0 and summary(run)["status"] == "completed"
    rows = {name: [{k: v for k, v in r.items() if k not in TIMED}
                   for r in trainkit.metric_rows(tmp_path / name) if "loss" in r]
            for name in ("straight", "stopped")}
    assert [r["step"] for r in rows["straight"]] == [4, 8, 12]
    assert rows["stopped"] == rows["straight"]  # grad_norm_std and _cv included


def test_divergence_stops_the_run_with_status_3(corpus, tmp_path):
    cfg = trainkit.config("base", *corpus, **{"train.steps": 30, "train.lr": 1e4,
                                              "train.grad_clip": 0.0, "train.eval_every": 0,
                                              "train.warmup_steps": 0})
    assert train(cfg, str(tmp_path / "run")) == ExitCode.DIVERGED
    s = summary(tmp_path / "run")
    assert s["status"] == "diverged" and s["diverged_step"] < 30 and s["diverged_reason"]


def test_a_run_too_short_for_the_patience_that_blows_up_is_diverged(corpus, tmp_path):
    """20 steps at lr 1e4 (loss in the hundreds of thousands) once ended `completed` and was
    fitted: the patience rule needs 20 strikes, which a 20-step run cannot collect."""
    cfg = trainkit.config("base", *corpus, **{"train.steps": 12, "train.lr": 1e4,
                                              "train.grad_clip": 0.0, "train.eval_every": 0,
                                              "train.warmup_steps": 0,
                                              "train.checkpoint_every": 0})
    assert train(cfg, str(tmp_path / "run")) == ExitCode.DIVERGED
    s = summary(tmp_path / "run")
    assert s["status"] == "diverged" and s["diverged_reason"]
    assert "first loss" in s["divergence_rule"] and "ln(vocabulary)" in s["divergence_rule"]


def _env(cache_dir=None):
    """One CPU device, as a user's shell has it; with `cache_dir`, JAX's persistent compilation
    cache there (safe on one device), so processes of the same run compile their steps once."""
    env = trainkit.cpu_env(1)
    if cache_dir is not None:
        env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    return env


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory):
    """One persistent compilation cache for this file's CLI processes (one CPU device each),
    as a sweep's runs share one: the SIGKILL and SIGTERM tests train the same step shape
    (looped.py:tiny at the same train fields; steps and cadences are host-side), so whichever
    runs second runs the executables the first compiled instead of compiling them again."""
    return tmp_path_factory.mktemp("jax_cache")


def _wait_for_step(workdir, step, proc, timeout=300):
    path = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
        logged = rows(workdir, growing=True) if os.path.exists(path) else []
        if any(r.get("step", 0) >= step for r in logged if "loss" in r):
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} never logged")


def test_sigkill_then_resume_is_bit_identical(corpus, tmp_path, jax_cache):
    args = ["train", "--config=experiments/looped.py:tiny",
            *trainkit.overrides(*corpus, **{"train.steps": 40, "train.checkpoint_every": 10,
                                            "train.eval_every": 10})]
    # The three processes share a compilation cache, as a sweep's runs do: the resumed process
    # runs the very executables the straight run compiled (the file's cache: jax_cache).
    env = _env(cache_dir=jax_cache)
    straight = tmp_path / "straight"
    done = trainkit.run_cli(*args, f"--workdir={straight}", env=env)
    assert done.returncode == 0, done.stderr[-2000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen(trainkit.loopscale_cmd(*args, f"--workdir={killed}"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_step(killed, 22, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert summary(killed)["status"] == "running"
    resumed = trainkit.run_cli(*args, f"--workdir={killed}", env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    a, b = train_losses(straight), train_losses(killed)
    steps = [r["step"] for r in rows(killed) if "loss" in r]
    assert steps == list(range(1, 41))  # every step exactly once
    assert [r["step"] for r in rows(killed) if "eval_loss" in r] == [10, 20, 30, 40]
    assert rows(killed)[-2]["flops"] == rows(straight)[-2]["flops"]  # resumed from an eval row
    assert [a[s] for s in range(1, 41)] == [b[s] for s in range(1, 41)]  # bit-identical
    assert summary(killed)["status"] == "completed"
    assert os.listdir(jax_cache)  # the steps were compiled into it


def test_sigterm_saves_and_exits_cleanly(corpus, tmp_path, jax_cache):
    # test_sigkill_then_resume_is_bit_identical's model and step shape (looped.py:tiny; steps
    # and cadences are host-side) and its compilation cache (jax_cache): one compile for both.
    args = ["train", "--config=experiments/looped.py:tiny",
            *trainkit.overrides(*corpus, **{"train.steps": 400, "train.checkpoint_every": 0,
                                            "train.eval_every": 0}), f"--workdir={tmp_path / 'run'}"]
    proc = subprocess.Popen(trainkit.loopscale_cmd(*args), env=_env(cache_dir=jax_cache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait_for_step(tmp_path / "run", 3, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    last = max(r["step"] for r in rows(tmp_path / "run") if "loss" in r)
    saved = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] == last < 400
    assert summary(tmp_path / "run")["status"] == "running"


@pytest.mark.parametrize("ramp", [0, 3])
def test_a_muon_run_resumes_from_its_checkpoint(corpus, tmp_path, ramp):
    """The FLT recipe's optimiser state (Muon and AdamW under optax masks) restores: a run cut
    back to its step-2 checkpoint, as a crash after step 2 leaves it, resumes and repeats the
    losses of steps 3-4 exactly. (Restoring a masked state used to fail on its empty nodes.)
    With a momentum ramp, Muon's state is inject_hyperparams' and restores as well."""
    import shutil

    from etils import epath

    from loopscale.files import write_json

    config = trainkit.config("flt", *corpus, **{"train.optimizer": "muon", "train.steps": 4,
                                                "train.checkpoint_every": 2,
                                                "train.eval_every": 0,
                                                "train.muon_momentum_start": 0.85,
                                                "train.muon_momentum_warmup": ramp})
    workdir = tmp_path / "run"
    assert train(config, str(workdir)) == 0
    first = train_losses(workdir)
    shutil.rmtree(workdir / "checkpoints" / "4")
    kept = [r for r in rows(workdir) if r.get("step", 0) <= 2 and "loss" in r]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    write_json(epath.Path(workdir / "summary.json"), {**summary(workdir), "status": "running"})
    assert train(config, str(workdir)) == 0
    assert train_losses(workdir) == first
