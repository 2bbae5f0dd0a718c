"""Per-loop modulation (model.loop_modulation=film, issue #24): a learned scale and shift per
loop index on the core's input, zero-initialised to the identity; the model against the
hand-written equations of tests/reference.py, scanned and unrolled, past the trained count."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
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
    flat = unstack_layers(params, cfg.n_unique)
    for n_loops in (None, cfg.n_loops + 2):
        want = hand_written(cfg, flat, n_loops)
        np.testing.assert_allclose(logits(cfg, params, n_loops), want, atol=2e-5, rtol=2e-5)
        np.testing.assert_allclose(logits(unrolled(cfg), flat, n_loops), want, atol=2e-5,
                                   rtol=2e-5)
    grads = jax.grad(lambda p: jnp.mean(logits(cfg, p) ** 2))(params)["loop"]
    assert all(float(jnp.max(jnp.abs(grads[k][t]))) > 0 for k in ("film_scale", "film_shift")
               for t in range(cfg.n_loops))
