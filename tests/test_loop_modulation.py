"""The core's own per-loop parameters (issue #24): per-loop modulation
(model.loop_modulation=film, a learned scale and shift per loop index on the core's input,
zero-initialised to the identity) and Parcae's stability-constrained injection
(model.injection=parcae) and Huginn's concatenation adapter (model.injection=concat); each
against the hand-written equations of tests/reference.py,
scanned and unrolled, and past the trained count."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reference
from helpers import init_params, tiny_model_config, tokens, unrolled

from loopscale import flops
from loopscale.model import LoopedLM, unstack_layers
from loopscale.model.mup import Role, param_roles

TOKENS = tokens()


@functools.partial(jax.jit, static_argnums=(0, 2))
def logits(cfg, params, n_loops=None):
    return LoopedLM(cfg).apply({"params": params}, TOKENS, n_loops=n_loops).logits


@functools.partial(jax.jit, static_argnums=(0, 2))
def hand_written(cfg, flat, n_loops=None):
    return reference.forward(flat, TOKENS, cfg, n_loops=n_loops)


def assert_matches_hand_written(cfg, params):
    """The scanned and the unrolled model against reference.py, at the trained loop count and
    two loops past it."""
    flat = unstack_layers(params, cfg.n_unique)
    for n_loops in (None, cfg.n_loops + 2):
        want = hand_written(cfg, flat, n_loops)
        np.testing.assert_allclose(logits(cfg, params, n_loops), want, atol=2e-5, rtol=2e-5)
        np.testing.assert_allclose(logits(unrolled(cfg), flat, n_loops), want, atol=2e-5,
                                   rtol=2e-5)


@pytest.fixture(scope="module")
def film():
    cfg = tiny_model_config(loop_modulation="film", injection="input")
    return cfg, init_params(cfg, TOKENS, jit=True)


def test_film_starts_as_the_identity(film):
    cfg, params = film
    film_params = {k: params["loop"][k] for k in ("film_scale", "film_shift")}
    assert all(p.shape == (cfg.n_loops, cfg.d_model) and not np.any(p)
               for p in film_params.values())
    rest = {**params, "loop": {"stack": params["loop"]["stack"]}}
    plain = dataclasses.replace(cfg, loop_modulation=type(cfg.loop_modulation)("none"))
    np.testing.assert_array_equal(logits(cfg, params), logits(plain, rest))
    assert flops.param_counts(cfg)["params_total"] == sum(x.size for x in jax.tree.leaves(params))
    roles = param_roles(params)["loop"]
    assert roles["film_scale"] is roles["film_shift"] is Role.NORM  # no width scaling, no decay


@pytest.mark.parametrize("mode", ["input", "flt"])
def test_film_matches_hand_written_equations(film, mode):
    """x_t <- x_t * (1 + scale_t) + shift_t on loop t's start, at every loop; past the trained
    count the last row."""
    cfg, params = film
    cfg = dataclasses.replace(cfg, injection=type(cfg.injection)(mode), embed_norm=True)
    rng = np.random.default_rng(0)
    loop = {**params["loop"], **{k: jnp.asarray(rng.normal(0, 0.5, params["loop"][k].shape),
                                                jnp.float32)
                                  for k in ("film_scale", "film_shift")}}
    params = {**params, "loop": loop}
    assert_matches_hand_written(cfg, params)
    grads = jax.grad(lambda p: jnp.mean(logits(cfg, p) ** 2))(params)["loop"]
    assert all(float(jnp.max(jnp.abs(grads[k][t]))) > 0 for k in ("film_scale", "film_shift")
               for t in range(cfg.n_loops))


@pytest.fixture(scope="module")
def parcae():
    cfg = tiny_model_config(injection="parcae")
    return cfg, init_params(cfg, TOKENS, jit=True)


def decay(params) -> jax.Array:
    """A_bar's diagonal: exp(-dt exp(log_a)), dt = exp(log_dt)."""
    loop = params["loop"]
    return jnp.exp(-jnp.exp(loop["parcae_log_dt"]) * jnp.exp(loop["parcae_log_a"]))


def test_parcae_matches_hand_written_equations(parcae):
    """Every loop, the first from a zero state, starts from A_bar x_prev + B_bar e0."""
    cfg, params = parcae
    rng = np.random.default_rng(1)
    loop = {**params["loop"], **{k: params["loop"][k] + jnp.asarray(
        rng.normal(0, 0.3, params["loop"][k].shape), jnp.float32)
        for k in ("parcae_log_a", "parcae_log_dt", "parcae_b")}}
    params = {**params, "loop": loop}
    assert_matches_hand_written(cfg, params)
    assert flops.param_counts(cfg)["params_total"] == sum(x.size for x in jax.tree.leaves(params))


def test_parcae_state_matrix_stays_contracting_through_training(parcae):
    """A_bar = exp(dt A) with A = -exp(log_a): every entry in (0, 1) at init (sqrt(1/5), the
    code's decay target, with B = I) and after 20 Adam steps at a large learning rate on a loss
    that rewards a growing state (the norm of the last loop's stream)."""
    cfg, params = parcae
    np.testing.assert_allclose(decay(params), np.sqrt(1 / 5), rtol=1e-6)
    np.testing.assert_array_equal(params["loop"]["parcae_b"], np.eye(cfg.d_model))
    model = LoopedLM(cfg)
    tx = optax.adam(0.3)

    @jax.jit
    def step(p, state):
        def loss(p):
            return -jnp.mean(jnp.square(model.apply({"params": p}, TOKENS).loop_hidden[-1]))
        updates, state = tx.update(jax.grad(loss)(p), state, p)
        return optax.apply_updates(p, updates), state

    state = tx.init(params)
    for _ in range(20):
        params, state = step(params, state)
    radius = float(jnp.max(decay(params)))
    assert 0 < float(jnp.min(decay(params))) and radius < 1.0
    assert radius > np.sqrt(1 / 5) + 0.1  # it did move, towards 1


def test_concat_matches_hand_written_equations():
    """Huginn's adapter: every loop, the first from a zero state, starts from [x_prev; e] W
    (W: 2 d_model x d_model, drawn as an input projection), with a prelude and a coda."""
    cfg = tiny_model_config(injection="concat", n_prelude=1, n_coda=1)
    params = init_params(cfg, TOKENS, jit=True)
    w = params["loop"]["adapter"]
    assert w.shape == (2 * cfg.d_model, cfg.d_model)
    assert float(jnp.std(w)) == pytest.approx(cfg.init.attn_qkv.std or cfg.init_std, rel=0.1)
    assert param_roles(params)["loop"]["adapter"] is Role.HIDDEN
    assert_matches_hand_written(cfg, params)
    assert flops.param_counts(cfg)["params_total"] == sum(x.size for x in jax.tree.leaves(params))
    assert flops.param_counts(cfg)["params_rec"] == (
        sum(x.size for x in jax.tree.leaves(params["loop"])))
