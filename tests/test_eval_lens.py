"""`loopscale eval --what=lens,probes`: the logit lens and linear probes of the permutation walk
at every layer and loop boundary (evaluate/lens.py, probes.py, probe_fit.py, ladder.py)."""

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import evalkit
import numpy as np
import pytest

from loopscale import data as data_lib
from loopscale.cli import main
from loopscale.evaluate import lens, probe_fit
from loopscale.model import LoopedLM
from loopscale.rundir.load import load_run
from loopscale.sweep.collect import collect_dir

TEXT_RUN = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5" / "killed"
BATCHES = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny looped (2 x 2) permutation run, a few steps, hops 2..4 (so some hops are masked),
    measured once with both evaluations. (The run of tests/test_eval.py's per-hop accuracy
    test: trained once in a process that runs both, each file measuring its own copy.)"""
    _, rundir = evalkit.copy_of(evalkit.PERMUTATION_HOPS_2_4, tmp_path_factory,
                                tmp_path_factory.mktemp("lens") / "run")
    assert main(["eval", f"--workdir={rundir}", "--what=lens,probes", f"--batches={BATCHES}"]) == 0
    return rundir


@pytest.fixture(scope="module")
def held_out(run):
    """(config, parameters on the host, the held-out batches the evaluations read, whole)."""
    config, params = load_run(run)
    train_cfg = dataclasses.replace(config.train, eval_batches=BATCHES)
    batches = list(data_lib.make_dataset(config.data, train_cfg, config.seed, "eval").iterator())
    return config, jax.device_get(params), {k: np.concatenate([b[k] for b in batches])
                                            for k in batches[0]}


def plain_lens_predictions(config, params, data) -> np.ndarray:
    """(K, L, N) argmax of the readout of every layer's stream at the answer position, from
    the whole (K, L, B, T, D) hidden states."""
    model = LoopedLM(config.model)
    out = LoopedLM(config.model, collect_layers=True).apply(
        {"params": params}, data["inputs"], readout=False)
    rows = np.arange(len(data["answer_pos"]))
    hidden = np.asarray(out.layer_hidden)[:, :, rows, data["answer_pos"]]  # (K, L, N, D)
    logits = model.apply({"params": params}, jnp.asarray(hidden), method=LoopedLM.readout)
    return np.argmax(np.asarray(logits), -1)


def plain_shares(pred_KxLxN, data) -> np.ndarray:
    """(K, L, H): share of the examples with a hop j whose prediction is the node after it."""
    hit = (pred_KxLxN[..., None] == data["hop_labels"]) & data["hop_mask"]
    return hit.sum(2) / data["hop_mask"].sum(0)


def test_lens_equals_the_readout_of_every_layer(run, held_out):
    config, params, data = held_out
    got = json.loads((run / "eval" / "lens.json").read_text())
    K, L = config.model.n_loops, config.model.n_unique
    pred = plain_lens_predictions(config, params, data)
    share = plain_shares(pred, data)
    assert got["examples"] == len(data["answer"]) == BATCHES * config.train.batch_size
    assert got["hops"] == [1, 2, 3, 4] and got["iterations"] == list(range(1, K + 1))
    assert got["hop_examples"] == data["hop_mask"].sum(0).tolist()
    assert got["hop_examples"][:2] == [got["examples"]] * 2  # hops 1, 2 always exist
    np.testing.assert_allclose(got["layer"], share.reshape(K * L, -1), atol=1e-12)
    np.testing.assert_allclose(got["iteration"], share[:, -1], atol=1e-12)
    assert got["best_hop"] == (np.argmax(share[:, -1], 1) + 1).tolist()
    assert got["final_answer"] == pytest.approx(np.mean(pred[-1, -1] == data["answer"]))
    assert (run / "eval" / "lens.png").read_bytes()[:4] == b"\x89PNG"
    # The probes' lens is the same readout on the scoring half (the second half of the rows).
    probes = json.loads((run / "eval" / "probes.json").read_text())
    half = len(data["answer"]) // 2
    second = {k: v[half:] for k, v in data.items()}
    np.testing.assert_allclose(probes["lens"]["layer"],
                               plain_shares(pred[:, :, half:], second).reshape(K * L, -1))
    assert probes["fit_examples"] == half and probes["score_examples"] == len(data["answer"]) - half


def test_lens_of_a_stream_that_names_a_chosen_node(held_out):
    """Hand-built: blocks that add nothing (zero output projections), one-hot embeddings and
    the unembedding their transpose, so every layer's readout at the answer position names the
    token there; the token placed there is example b's node after hop 1 + b % 3, or its start.
    The lens must report exactly those shares."""
    config, _, data = held_out
    cfg = dataclasses.replace(config.model, zero_init_out=True)
    V, D = cfg.vocab_size, cfg.d_model
    model = LoopedLM(cfg)
    # Initialised compiled (not op by op); the random values do not enter the result: zero
    # output projections make every block add nothing, and the embeddings are replaced below.
    params = jax.jit(model.init)(jax.random.key(0), data["inputs"][:1])["params"]
    params = {**params, "embedding": jnp.eye(V, D), "unembed": jnp.eye(V, D).T}
    n = len(data["answer"])
    chosen_hop = np.arange(n) % 4  # 0: the start node; j = 1..3: the node after hop j
    walk = np.concatenate([data["start"][:, None], data["hop_labels"]], 1)
    chosen = walk[np.arange(n), chosen_hop]
    inputs = data["inputs"].copy()
    inputs[np.arange(n), data["answer_pos"]] = chosen
    batch = {**{k: jnp.asarray(v) for k, v in data.items()}, "inputs": jnp.asarray(inputs)}
    step = jax.jit(functools.partial(lens.lens_step, model=model, train=None, n_loops=cfg.n_loops))
    sums = jax.device_get(step(params, batch))
    got = lens.table(sums, config.data.n_nodes)
    # By construction: a hop's share counts the examples given that hop's node, plus those
    # whose chosen node happens to equal it (a cycle of the permutation), over its examples.
    expect_H = [np.mean(chosen[data["hop_mask"][:, j]] == data["hop_labels"][data["hop_mask"][:, j], j])
                for j in range(4)]
    assert expect_H[0] >= np.mean(chosen_hop == 1)  # the construction is what it says
    assert expect_H[3] < 0.5  # hop 4 is never chosen: only coincidences name it
    for row in got["layer"] + got["iteration"]:
        np.testing.assert_allclose(row, expect_H, atol=1e-12)
    assert got["start_iteration"] == [pytest.approx(np.mean(chosen == data["start"]))] * cfg.n_loops
    assert got["final_answer"] == pytest.approx(np.mean(chosen == data["answer"]))
    assert got["best_hop"] == [int(np.argmax(expect_H)) + 1] * cfg.n_loops


def test_probe_fitter_finds_a_linear_code_and_not_noise():
    """Synthetic streams: at point 0 a one-hot-like code of hop 1's node plus noise; at point 1
    hop 2's node is coded, scaled 50x with an offset (standardisation must undo it); point 2
    is pure noise. Fitted on 256 examples, scored on 256 others."""
    rng = np.random.default_rng(0)
    N, D, C = 512, 32, 8
    y = rng.integers(C, size=(N, 2)).astype(np.int32)
    mask = np.ones((N, 2), bool)
    mask[::3, 1] = False  # hop 2 missing in a third of the examples
    code = rng.normal(size=(C, D))
    x = np.stack([code[y[:, 0]] + 0.7 * rng.normal(size=(N, D)),
                  50 * (code[y[:, 1]] + 0.7 * rng.normal(size=(N, D))) + 3.0,
                  rng.normal(size=(N, D))]).astype(np.float32)
    probes = probe_fit.fit(x[:, :256], y[:256], mask[:256], n_classes=C)
    acc, count = map(np.asarray, probe_fit.accuracy(probes, x[:, 256:], y[256:], mask[256:]))
    assert count.tolist() == [256, int(mask[256:, 1].sum())]
    assert acc[0, 0] > 0.97 and acc[1, 1] > 0.97  # the coded hop, on unseen examples
    assert acc[0, 1] < 0.25 and acc[1, 0] < 0.25  # the other hop is independent: chance
    assert np.all(acc[2] < 0.25)  # noise: chance (1/8), for all its fit on the fitting half
    fit_acc, _ = probe_fit.accuracy(probes, x[:, :256], y[:256], mask[:256])
    assert np.asarray(fit_acc)[2].min() > 0.3  # it did fit the noise: held-out scoring matters


@pytest.mark.parametrize("what", ["lens", "probes"])
def test_a_text_run_is_refused_in_one_line(tmp_path, capsys, what):
    rundir = tmp_path / "run"
    shutil.copytree(TEXT_RUN, rundir)
    assert main(["eval", f"--workdir={rundir}", f"--what={what}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--what={what} needs the permutation task" in err[0], err
    assert not (rundir / "eval").exists()


def test_collect_carries_the_ladder_scalars(run):
    row = collect_dir(str(run))[0]
    for name in ("lens", "probes"):
        got = json.loads((run / "eval" / f"{name}.json").read_text())
        for key in ("ladder_match", "diagonal", "examples", "chance"):
            assert row[f"{name}_{key}"] == got[key]
        assert 0.0 <= got["ladder_match"] <= 1.0
        assert (run / "eval" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert row["lens_final_answer"] == json.loads((run / "eval" / "lens.json").read_text())["final_answer"]
