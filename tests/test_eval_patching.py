"""`loopscale eval --what=patching,act_grads` and the training metric act_grad_norm
(evaluate/patching.py, act_grads.py, train/step.act_grad_norms), against the hand-written
equations of tests/reference.py with the stream edited or differentiated by hand."""

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
import trainkit

from loopscale import data as data_lib
from loopscale.cli import main
from loopscale.config import load_config, parse
from loopscale.data import permutation
from loopscale.model import unstack_layers
from loopscale.rundir.load import load_run
from loopscale.train.trainer import train

TEXT_RUN = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5" / "killed"
BATCHES = 2
N_NODES = 8
ANSWER_POS = 2 * N_NODES + 3
SHAPES = {"looped": (2, 3), "unshared": (4, 1), "parts": (2, 2)}  # (layers per loop, loops)
# "parts": a prelude and a coda of one layer each around the looped core; patching edits the
# core's stream and reads the answer after the coda.
PARTS = {"model.n_prelude": 1, "model.n_coda": 1}


def _config(kind: str, **fields):
    layers, loops = SHAPES[kind]
    base = {"train.steps": 3, "train.checkpoint_every": 0, "train.eval_every": 0,
            "train.eval_batches": BATCHES, "model.d_model": 32,
            # a wide init, so that the few steps' model already answers by its input (with
            # 0.02 every example gets the same answer and nothing could flip)
            "model.init_std": 0.3,
            "model.n_unique": layers, "model.n_loops": loops, "data.n_nodes": N_NODES,
            "data.hops_min": 2, "data.hops_max": 3,
            # one position past the answer position (it holds the answer token), so patching
            # there can be seen to change nothing
            "train.seq_len": permutation.seq_len(N_NODES) + 1}
    base.update(PARTS if kind == "parts" else {})
    base.update(fields)
    return parse(load_config("experiments/permutation.py:tiny",
                             [f"--config.{k}={v}" for k, v in base.items()]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A looped 2 x 3 run (two micro-batches a step, act_grad_norm logged every 2 steps and at
    the end), an unshared 4-layer run and a 1-(2 x 2)-1 prelude/core/coda run (neither), each
    trained 3 steps and measured once."""
    out = {}
    for kind, fields in (("looped", {"train.grad_accum": 2, "train.log_act_grads": True,
                                     "train.log_every": 2}),
                         ("unshared", {}), ("parts", {})):
        rundir = tmp_path_factory.mktemp(kind) / "run"
        assert train(_config(kind, **fields), str(rundir)) == 0
        assert main(["eval", f"--workdir={rundir}", "--what=patching,act_grads"]) == 0
        out[kind] = rundir
    return out


def _result(rundir, name):
    return json.loads((Path(rundir) / "eval" / f"{name}.json").read_text())


def _held_out(rundir):
    """(config, unrolled params, batches) as the evaluations read them."""
    config, params = load_run(rundir)
    train_cfg = dataclasses.replace(config.train, eval_batches=BATCHES)
    batches = list(data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator())
    return config, unstack_layers(jax.device_get(params), config.model.n_unique), batches


def _answer_logits(flat, inputs, cfg, after_layer=None):
    logits = reference.forward(flat, jnp.asarray(inputs), cfg, after_layer=after_layer)
    return np.asarray(logits)[:, ANSWER_POS]


def test_corrupted_twin_differs_only_in_the_start_and_answer():
    task = permutation.PermutationTask(N_NODES, 2, 3, seed=0, split="eval",
                                       length=permutation.seq_len(N_NODES) + 1)
    batch = {k: np.stack([task(i)[k] for i in range(64)]) for k in task(0)}
    twin = permutation.corrupt_start(batch, N_NODES, np.random.default_rng(0))
    assert np.all(twin["start"] != batch["start"]) and np.all(twin["answer"] != batch["answer"])
    changed = np.nonzero(np.any(twin["inputs"] != batch["inputs"], axis=0))[0]
    assert changed.tolist() == [ANSWER_POS - 1, ANSWER_POS + 1]  # start token, answer token
    assert np.array_equal(twin["inputs"][:, ANSWER_POS + 1], twin["answer"])
    for b in range(8):  # the corrupted answer is the walk from the new start
        perm = np.empty(N_NODES, int)
        perm[batch["inputs"][b, 1:2 * N_NODES + 1:2]] = batch["inputs"][b, 2:2 * N_NODES + 2:2]
        assert twin["answer"][b] == permutation.follow(perm, twin["start"][b], batch["hops"][b])[-1]


@pytest.mark.parametrize("kind", ["looped", "unshared"])
def test_patching_the_answer_at_the_end_is_the_corrupted_run_and_after_it_nothing(runs, kind):
    got = _result(runs[kind], "patching")
    layers, loops = SHAPES[kind]
    T = permutation.seq_len(N_NODES) + 1
    assert (got["n_loops"], got["layers_per_loop"], got["answer_pos"]) == (loops, layers, ANSWER_POS)
    assert got["examples"] == BATCHES * 16 and len(got["positions"]) == T
    ld = np.asarray(got["logit_diff"])
    norm = np.asarray(got["normalised_logit_diff"])
    flip = np.asarray(got["flip_share"])
    corrupted = np.asarray(got["corrupted_answer_share"])
    assert ld.shape == norm.shape == flip.shape == (loops, layers, T)
    assert got["answers_differ"] > 0  # else the flip share would be undefined
    # The last loop boundary at the answer position is what the answer is read from: patched
    # there, the answer is exactly the corrupted run's.
    assert norm[-1, -1, ANSWER_POS] == pytest.approx(0.0, abs=1e-4)
    assert ld[-1, -1, ANSWER_POS] == pytest.approx(got["logit_diff_corrupt"], abs=1e-4)
    assert flip[-1, -1, ANSWER_POS] == 1.0
    assert corrupted[-1, -1, ANSWER_POS] == got["corrupt_accuracy"]
    # After the answer position nothing reaches the answer (causal attention), at any point.
    np.testing.assert_allclose(ld[:, :, ANSWER_POS + 1], got["logit_diff_clean"], atol=1e-4)
    np.testing.assert_allclose(norm[:, :, ANSWER_POS + 1], 1.0, atol=1e-3)
    assert np.all(flip[:, :, ANSWER_POS + 1] == 0)
    assert got["iteration_flip_share"] == flip[:, -1].tolist()
    assert (Path(runs[kind]) / "eval" / "patching.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", ["looped", "unshared", "parts"])
def test_patching_equals_patching_the_equations_by_hand(runs, kind):
    """Two grid points, recomputed with the reference equations: the corrupted stream at that
    layer of that loop written into the clean run at one position."""
    config, flat, batches = _held_out(runs[kind])
    cfg = config.model
    got = _result(runs[kind], "patching")
    K, L = cfg.n_loops, cfg.n_unique
    points = [(0, 0, ANSWER_POS - 1), (K - 1, 0, ANSWER_POS), (K - 1, L - 1, 3)]
    ld = {p: 0.0 for p in points}
    flips = {p: 0 for p in points}
    differ = 0
    for i, batch in enumerate(batches):
        twin = permutation.corrupt_start(batch, N_NODES, np.random.default_rng([config.seed, i, 0]))
        streams = {}

        def keep(t, l, x, streams=streams):
            streams[t, l] = x
            return x

        corrupt_logits = _answer_logits(flat, twin["inputs"], cfg, keep)
        clean_pred = np.argmax(_answer_logits(flat, batch["inputs"], cfg), -1)
        corrupt_pred = np.argmax(corrupt_logits, -1)
        differ += int(np.sum(clean_pred != corrupt_pred))
        rows = np.arange(len(clean_pred))
        for point in points:
            t0, l0, p0 = point

            def patch(t, l, x, t0=t0, l0=l0, p0=p0, streams=streams):
                return x.at[:, p0].set(streams[t, l][:, p0]) if (t, l) == (t0, l0) else x

            logits = _answer_logits(flat, batch["inputs"], cfg, patch)
            ld[point] += float(np.sum(logits[rows, batch["answer"]] - logits[rows, twin["answer"]]))
            pred = np.argmax(logits, -1)
            flips[point] += int(np.sum((pred == corrupt_pred) & (clean_pred != corrupt_pred)))
    n = got["examples"]
    assert got["answers_differ"] == pytest.approx(differ / n)
    for (t, l, p) in points:
        assert got["logit_diff"][t][l][p] == pytest.approx(ld[t, l, p] / n, abs=2e-4)
        assert got["flip_share"][t][l][p] == pytest.approx(flips[t, l, p] / differ)


def _hand_act_grads(flat, micro, cfg):
    """||d CE / d a_tl||_2 over (B, T, D), a_tl a zero added to the stream after layer l of
    loop t in the reference equations; CE the masked mean at the last loop (the permutation
    run's objective: loss on the last loop, no z-loss, no supervision of other loops)."""
    B, T = micro["inputs"].shape
    zeros = jnp.zeros((cfg.n_loops, cfg.n_unique, B, T, cfg.d_model))
    fields = {k: jnp.asarray(micro[k]) for k in ("inputs", "targets", "mask")}
    return np.asarray(_hand_grad_norms(flat, fields, zeros, cfg), np.float64)


@jax.jit(static_argnums=3)
def _hand_grad_norms(flat, micro, zeros, cfg):
    def loss(adds):
        logits = reference.forward(flat, micro["inputs"], cfg,
                                   after_layer=lambda t, l, x: x + adds[t, l])
        logp = jax.nn.log_softmax(logits, -1)
        nll = -jnp.take_along_axis(logp, micro["targets"][..., None], -1)[..., 0]
        mask = micro["mask"].astype(jnp.float32)
        return jnp.sum(nll * mask) / jnp.sum(mask)

    return jnp.sqrt(jnp.sum(jnp.square(jax.grad(loss)(zeros)), axis=(2, 3, 4)))


@pytest.mark.parametrize("kind", ["looped", "unshared", "parts"])
def test_act_grads_equal_a_hand_written_gradient(runs, kind):
    config, flat, batches = _held_out(runs[kind])
    accum = config.train.grad_accum
    # Micro-batch j of a batch is rows j, j + accum, ... (train/step.micro_batches).
    per_micro = [_hand_act_grads(flat, {k: v[j::accum] for k, v in b.items()}, config.model)
                 for b in batches for j in range(accum)]
    got = _result(runs[kind], "act_grads")
    want = np.mean(per_micro, axis=0)
    assert got["micro_batches"] == len(per_micro) == BATCHES * accum
    assert got["micro_batch_size"] == 16 // accum
    np.testing.assert_allclose(got["per_layer"], want, rtol=2e-4)
    np.testing.assert_allclose(got["per_loop"], want[:, -1], rtol=2e-4)
    assert np.all(want > 0)


def test_act_grad_norm_is_logged_when_asked_and_only_then(runs):
    """The looped run logs it every 2 steps (its log interval) and at the end, equal to the hand-written
    gradient on the last step's first micro-batch at the final parameters; the unshared run,
    with the flag off, never."""
    looped = trainkit.metric_rows(runs["looped"])
    logged = [r for r in looped if "loss" in r]
    assert [r["step"] for r in logged] == [2, 3]
    assert all(len(r["act_grad_norm"]) == 3 and len(r["act_grad_norm_layer"]) == 3
               for r in logged)
    config, params = load_run(runs["looped"])
    flat = unstack_layers(jax.device_get(params), config.model.n_unique)
    batches = data_lib.make_dataset(config.data, config.train, config.seed, "train").iterator()
    for _ in range(config.train.steps):
        last = next(batches)
    want = _hand_act_grads(flat, {k: v[0::2] for k, v in last.items()}, config.model)
    np.testing.assert_allclose(logged[-1]["act_grad_norm_layer"], want, rtol=2e-4)
    np.testing.assert_allclose(logged[-1]["act_grad_norm"], want[:, -1], rtol=2e-4)
    unshared = trainkit.metric_rows(runs["unshared"])
    assert any("loss" in r for r in unshared)
    assert not any(k.startswith("act_grad") for r in unshared for k in r)


def test_patching_needs_the_permutation_task(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(TEXT_RUN, run)
    assert main(["eval", f"--workdir={run}", "--what=patching"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--what=patching needs the permutation task" in err[0], err
    assert not (run / "eval").exists()
