"""The LM loss projected onto the vocabulary in chunks equals the loss at once (value and
gradients, last loop and every exit), and evaluation in micro-batches equals one pass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import init_params, tiny_model_config, tokens

from loopscale.config import load_config, parse
from loopscale.config.schema import LossLoops
from loopscale.train.eval_loss import eval_step
from loopscale.model import LoopedLM
from loopscale.model.loss import chunk_size, loss_loop_indices, token_losses
from loopscale.train.step import loss_fn

B, T = 4, 12


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_model_config(n_loops=3, logit_softcap=15.0)
    inputs = tokens(B, T, seed=1)
    params = init_params(cfg, inputs)
    batch = {"inputs": inputs, "targets": tokens(B, T, seed=2),
             "mask": jnp.asarray(np.random.default_rng(0).random((B, T)) > 0.2)}
    train = parse(load_config("experiments/base.py:tiny", [])).train
    return cfg, params, batch, train


def testchunk_sizes_divide_the_length():
    assert [chunk_size(12, c) for c in (0, 5, 4, 12, 100)] == [12, 4, 4, 12, 12]


def test_token_losses_in_chunks_equal_the_whole_projection():
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.normal(size=(B, T, 8)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(8, 50)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 50, size=(B, T)))

    def readout(x):
        return x @ w

    want_ce = optax.softmax_cross_entropy_with_integer_labels(readout(h), y)
    want_lse = jax.nn.logsumexp(readout(h), axis=-1)
    for chunk in (0, 3, 4):
        ce, lse = token_losses(readout, h, y, chunk)
        np.testing.assert_allclose(ce, want_ce, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss_loops", [LossLoops.LAST, LossLoops.ALL])
def test_training_loss_and_gradients_do_not_depend_on_the_chunk(setup, loss_loops):
    cfg, params, batch, train = setup
    model = LoopedLM(dataclasses.replace(cfg, loss_loops=loss_loops))
    results = []
    for chunk in (0, 4):
        t = dataclasses.replace(train, ce_chunk=chunk, z_loss_weight=1e-3)
        grad_fn = jax.jit(jax.value_and_grad(lambda p, t=t: loss_fn(p, batch, model, t, 3)[0]))
        results.append(grad_fn(params))
    (loss0, grads0), (loss4, grads4) = results
    assert float(loss4) == pytest.approx(float(loss0), rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grads0, grads4)


def test_eval_in_micro_batches_and_chunks_equals_one_pass(setup):
    cfg, params, batch, train = setup
    model = LoopedLM(cfg)
    out = model.apply({"params": params}, batch["inputs"], exit_logits=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(out.exit_logits, batch["targets"][None])
    want = np.sum(np.asarray(ce) * np.asarray(batch["mask"])[None], axis=(1, 2))
    t = dataclasses.replace(train, grad_accum=2, ce_chunk=4)
    got = jax.jit(lambda p, b: eval_step(p, b, model=model, train=t, n_loops=3))(params, batch)
    np.testing.assert_allclose(got["loss_sum_per_loop"], want, rtol=1e-5)
    assert float(got["weight"]) == float(np.sum(batch["mask"]))


@pytest.mark.parametrize("n_loops,want", [(1, [0]), (2, [1]), (4, [2, 3]), (6, [4, 5]),
                                          (9, [6, 7, 8]), (12, [8, 9, 10, 11])])
def test_last_third_is_the_flt_authors_loops(n_loops, want):
    """The FLT code's `FEW` loss: loops range(2K//3, K), ceil(K/3) of them (12 loops: the last 4,
    where floor(K/3) took the same; 4 loops: the last 2, where floor took 1)."""
    assert loss_loop_indices(LossLoops.LAST_THIRD, n_loops) == want
    assert len(want) == -(-n_loops // 3)


def test_last_third_loss_is_the_mean_over_its_loops(setup):
    cfg, params, batch, train = setup
    K = 4  # the loop count where ceil(K/3) = 2 differs from floor(K/3) = 1
    model = LoopedLM(dataclasses.replace(cfg, loss_loops=LossLoops.LAST_THIRD))
    out = model.apply({"params": params}, batch["inputs"], n_loops=K, exit_logits=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(out.exit_logits, batch["targets"][None])
    mask = np.asarray(batch["mask"], np.float32)
    per_loop = np.sum(np.asarray(ce) * mask[None], axis=(1, 2)) / mask.sum()
    _, aux = loss_fn(params, batch, model, train, K)
    assert float(aux["ce"]) == pytest.approx(float(per_loop[2:].mean()), rel=1e-5)


@pytest.mark.parametrize("batches", [1, 2, 7])
def test_evaluate_reads_every_batch_once_whatever_it_dispatches_ahead(batches, monkeypatch):
    """`evaluate` keeps up to AHEAD steps in flight; each batch is summed once, in order, so
    the result is the same at any depth, with fewer batches than the depth too."""
    from loopscale.train import eval_loss

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    rows = [{"x": np.full((2, 3), float(i + 1) / 3, np.float32)} for i in range(batches)]

    class Source:
        def iterator(self):
            return iter(rows)

    def step(params, batch):  # per "loop" sums, and one token weight a row
        x = batch["x"]
        return {"loss_sum_per_loop": jnp.stack([x.sum(), params * x.sum()]),
                "weight": jnp.float32(x.shape[0])}

    got = {}
    for ahead in (0, 2, 4):
        monkeypatch.setattr(eval_loss, "AHEAD", ahead)
        got[ahead] = eval_loss.evaluate(step, 2.0, Source(), sharding)
    assert got[0] == got[2] == got[4]
    total = sum(float(r["x"].sum()) for r in rows)
    assert got[0]["eval_tokens"] == 2 * batches
    assert got[0]["eval_loss_per_loop"] == pytest.approx([total / (2 * batches),
                                                          2 * total / (2 * batches)])
