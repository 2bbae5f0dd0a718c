"""Loop-count schedules (train.loop_dist) and truncated backpropagation (train.bptt_loops),
issue #24: the draws against Huginn's equations written out here, their mean, the FLOPs a step
and a plan count, and the truncated gradient against the hand-written model of
tests/reference.py with the stream cut where Huginn cuts it."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import init_params, tiny_model_config, tokens, unrolled

from loopscale import flops
from loopscale.config import FlopConvention, LoopDist, load_config, parse
from loopscale.errors import UsageError
from loopscale.model import LoopedLM, unstack_layers
from loopscale.train.loop_schedule import loops_for_step, mean_loops, planned_flops_per_token

TOKENS = tokens()


def config(*overrides):
    return parse(load_config("experiments/looped.py:tiny", list(overrides)))


def huginn(seed: int, step: int, mean: float, sigma: float) -> int:
    """Geiping et al. 2025: tau ~ N(log(mean) - sigma^2 / 2, sigma) in log space, r ~
    Poisson(exp(tau)) + 1; one generator per (seed, step)."""
    rng = np.random.default_rng([seed, step])
    tau = math.exp(rng.normal(math.log(mean) - sigma ** 2 / 2, sigma))
    return int(rng.poisson(tau)) + 1


def test_poisson_lognormal_draws_are_huginns():
    c = config("--config.train.loop_dist=poisson_lognormal", "--config.train.loop_mean=6",
               "--config.train.loop_sigma=0.5")
    draws = [loops_for_step(c.train, c.model.n_loops, 3, step) for step in range(2000)]
    assert draws[:200] == [huginn(3, step, 6.0, 0.5) for step in range(200)]
    assert min(draws) >= 1 and len(set(draws)) > 8
    # E[r] = loop_mean + 1; the sample's mean within 4 standard errors of it.
    assert abs(np.mean(draws) - 7.0) < 4 * np.std(draws) / math.sqrt(len(draws))
    assert mean_loops(c.train, c.model.n_loops) == 7.0
    # Another seed, other draws; a cap holds every draw under it.
    assert draws[:50] != [loops_for_step(c.train, 2, 4, step) for step in range(50)]
    capped = dataclasses.replace(c.train, loop_max=5)
    assert [loops_for_step(capped, 2, 3, s) for s in range(200)] == [min(d, 5) for d in draws[:200]]


def test_the_capped_mean_is_the_expected_capped_draw():
    c = config("--config.train.loop_dist=poisson_lognormal", "--config.train.loop_mean=6",
               "--config.train.loop_max=8")
    rng = np.random.default_rng(0)
    tau = np.exp(rng.normal(math.log(6.0) - 0.125, 0.5, 400_000))
    sampled = np.mean(np.minimum(rng.poisson(tau) + 1, 8))
    assert mean_loops(c.train, 2) == pytest.approx(sampled, abs=0.01)
    assert mean_loops(c.train, 2) < 7.0


def test_fixed_and_uniform_schedules():
    fixed = config()
    assert fixed.train.loop_dist is LoopDist.FIXED
    assert {loops_for_step(fixed.train, 2, 0, s) for s in range(20)} == {2}
    uniform = config("--config.train.loop_dist=uniform", "--config.train.loop_choices=(1,2,4)")
    draws = [loops_for_step(uniform.train, 2, 6, s) for s in range(6)]
    assert draws == [int(np.random.default_rng([6, s]).choice((1, 2, 4))) for s in range(6)]
    assert mean_loops(uniform.train, 2) == pytest.approx(7 / 3)
    with pytest.raises(UsageError, match="goes with train.loop_dist=uniform"):
        config("--config.train.loop_choices=(1,2)")
    with pytest.raises(UsageError, match="loop_grad_every"):
        config("--config.train.bptt_loops=1", "--config.train.loop_grad_every=5")


def test_a_step_and_a_plan_count_the_loops_they_run():
    """A truncated step runs the frozen loops forward only (2N of the 6N); the planner spends
    a budget at the mean loop count, interpolated (the cost is linear in it); with the fixed
    count and full backpropagation it is the model's own figure."""
    c = config("--config.model.n_loops=4")
    m, T, conv = c.model, c.train.seq_len, c.flop_convention
    layer = flops.layer_use_flops(m, T, conv)
    full = flops.flops_per_token(m, T, conv)
    assert flops.step_flops_per_token(m, T, conv, bptt_loops=1) == pytest.approx(
        full - 3 * m.n_unique * layer * 2 / 3)
    assert flops.step_flops_per_token(m, T, conv, bptt_loops=4) == full
    assert planned_flops_per_token(c) == full
    drawn = config("--config.model.n_loops=4", "--config.train.loop_dist=poisson_lognormal",
                   "--config.train.loop_mean=2.5")  # E[r] = 3.5
    at = {k: flops.flops_per_token(dataclasses.replace(m, n_loops=k), T, conv) for k in (3, 4)}
    assert planned_flops_per_token(drawn) == pytest.approx((at[3] + at[4]) / 2)
    assert planned_flops_per_token(drawn, FlopConvention.KAPLAN) < planned_flops_per_token(drawn)


@functools.partial(jax.jit, static_argnums=(1, 2))
def model_grads(params, cfg, bptt):
    return jax.grad(lambda p: jnp.mean(LoopedLM(cfg).apply(
        {"params": p}, TOKENS, bptt_loops=bptt).logits ** 2))(params)


@functools.partial(jax.jit, static_argnums=(1, 2))
def hand_written_grads(flat, cfg, bptt):
    """The gradient with the stream entering loop K - k (the end of loop K - k - 1's last
    layer) a constant: Huginn's truncation, through reference.forward's stream hook."""
    def cut(t, layer, x):
        frozen = t == cfg.n_loops - bptt - 1 and layer == cfg.n_unique - 1
        return jax.lax.stop_gradient(x) if frozen else x

    return jax.grad(lambda p: jnp.mean(reference.forward(p, TOKENS, cfg, after_layer=cut) ** 2))(
        flat)


@pytest.mark.parametrize("bptt", [1, 3])
def test_truncated_backpropagation_matches_the_hand_written_cut(bptt):
    cfg = tiny_model_config(n_loops=4, injection="input")
    params = init_params(cfg, TOKENS, jit=True)
    flat = unstack_layers(params, cfg.n_unique)
    want = hand_written_grads(flat, cfg, bptt)
    for got in (unstack_layers(model_grads(params, cfg, bptt), cfg.n_unique),
                model_grads(flat, unrolled(cfg), bptt)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, atol=1e-7, rtol=1e-5)
    # It is a truncation: the full gradient differs; the forward pass does not.
    full = model_grads(params, cfg, 0)
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(full), jax.tree.leaves(model_grads(params, cfg, bptt)))) > 1e-4
    model = LoopedLM(cfg)
    np.testing.assert_array_equal(model.apply({"params": params}, TOKENS, bptt_loops=bptt).logits,
                                  model.apply({"params": params}, TOKENS).logits)


@pytest.mark.parametrize("scan", [True, False], ids=["scanned", "unrolled"])
def test_one_compiled_step_serves_every_truncated_loop_count(scan):
    """The shared step (model `frozen_loops`): r - k loops without a gradient in one while
    loop whose trip count is an argument, then the k backpropagated ones. At r = k (no frozen
    loop) and k + 3 it gives the per-count step's loss, gradients (every parameter: prelude, core with
    Huginn's adapter and FiLM rows indexed by the real loop, coda) and per-loop residual norms
    (the last r of its room, zeros before them), from one compile."""
    base = tiny_model_config(injection="concat", n_prelude=1, n_coda=1, loop_modulation="film")
    cfg = base if scan else unrolled(base)
    params = init_params(base, TOKENS, jit=True)
    if not scan:
        params = unstack_layers(params, base.n_unique)
    k, room = 2, 4

    def loss(p, out):
        return jnp.mean(out.logits ** 2), out.residual_norm

    @jax.jit
    def shared(p, frozen):
        return jax.value_and_grad(lambda q: loss(q, LoopedLM(cfg).apply(
            {"params": q}, TOKENS, n_loops=k, frozen_loops=frozen, max_frozen=room)),
            has_aux=True)(p)

    @functools.partial(jax.jit, static_argnums=1)
    def per_count(p, r):
        return jax.value_and_grad(lambda q: loss(q, LoopedLM(cfg).apply(
            {"params": q}, TOKENS, n_loops=r, bptt_loops=k)), has_aux=True)(p)

    for r in (k, k + 3):
        (want, want_norms), want_grads = per_count(params, r)
        (got, norms), grads = shared(params, jnp.int32(r - k))
        assert float(got) == pytest.approx(float(want), rel=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7),
                     grads, want_grads)
        assert norms.shape == (room + k,) and not np.any(norms[:room + k - r])
        np.testing.assert_allclose(norms[-r:], want_norms, rtol=1e-5)
    assert shared._cache_size() == 1


def test_which_schedules_share_a_compiled_step():
    """Room for the largest count less bptt_loops where one step can serve them all; 0 (a step
    per count) without truncation, without a cap on the count, or with an MoE core or a loss
    at several loops."""
    from loopscale.train.loop_schedule import shared_frozen_slots

    huginn_tiny = parse(load_config("experiments/huginn.py:tiny"))
    assert shared_frozen_slots(huginn_tiny) == 8 - 2
    assert shared_frozen_slots(config("--config.train.loop_dist=uniform",
                                      "--config.train.loop_choices=(1,2,5)",
                                      "--config.train.bptt_loops=1")) == 4
    for overrides in (["--config.train.bptt_loops=0"], ["--config.train.loop_max=0"],
                      ["--config.model.ffn=moe"], ["--config.model.loss_loops=all"]):
        assert shared_frozen_slots(parse(load_config("experiments/huginn.py:tiny",
                                                     overrides))) == 0
