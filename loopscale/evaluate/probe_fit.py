"""Linear probes: multinomial logistic regression fitted by optax's L-BFGS, many at once.

One probe per (point, hop): features x_PxNxD (P points of the network, N examples, D dims),
labels y_NxH (H targets per example, classes 0 .. C-1) and a mask m_NxH (which targets exist).
Every (point, hop) pair is an independent convex problem; `fit` vmaps one L-BFGS run of a fixed
number of steps over both axes, so the whole grid is one jitted computation.

Features are standardised per point and dimension with the fitting split's mean and spread
(the residual stream's scale grows with depth, and L-BFGS's first step is scale-sensitive), and
a small L2 penalty keeps the optimum finite when a split is linearly separable (it usually is:
a few hundred examples in hundreds of dimensions).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    steps: int = 100  # L-BFGS iterations, each with its own line search
    l2: float = 1e-3  # penalty on the weights, 0.5 * l2 * ||W||^2, beside the mean CE


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Probes:
    """Fitted probes on standardised features: logits = ((x - mean) / scale) @ w + b."""

    mean_PxD: jax.Array
    scale_PxD: jax.Array
    w_PxHxDxC: jax.Array
    b_PxHxC: jax.Array


def _masked_ce(logits_NxC, y_N, m_N) -> jax.Array:
    ce_N = optax.softmax_cross_entropy_with_integer_labels(logits_NxC, y_N)
    return jnp.sum(ce_N * m_N) / jnp.maximum(jnp.sum(m_N), 1.0)


def _fit_one(z_NxD, y_N, m_N, *, n_classes: int, settings: ProbeSettings):
    """One probe on standardised features: (w, b) after `settings.steps` L-BFGS iterations."""
    def loss(theta):
        w_DxC, b_C = theta
        return _masked_ce(z_NxD @ w_DxC + b_C, y_N, m_N) + 0.5 * settings.l2 * jnp.sum(w_DxC ** 2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)
    theta = (jnp.zeros((z_NxD.shape[1], n_classes)), jnp.zeros((n_classes,)))

    def step(carry, _):
        theta, state = carry
        value, grad = value_and_grad(theta, state=state)
        updates, state = opt.update(grad, state, theta, value=value, grad=grad, value_fn=loss)
        return (optax.apply_updates(theta, updates), state), None

    (theta, _), _ = jax.lax.scan(step, (theta, opt.init(theta)), None, length=settings.steps)
    return theta


@functools.partial(jax.jit, static_argnames=("n_classes", "settings"))
def fit(x_PxNxD: jax.Array, y_NxH: jax.Array, m_NxH: jax.Array, *, n_classes: int,
        settings: ProbeSettings = ProbeSettings()) -> Probes:
    """Probes for every (point, hop), fitted on the examples given."""
    x_PxNxD = x_PxNxD.astype(jnp.float32)
    mean_PxD = jnp.mean(x_PxNxD, axis=1)
    # A dimension constant over the split (e.g. a zero-initialised one) would divide by zero.
    scale_PxD = jnp.maximum(jnp.std(x_PxNxD, axis=1), 1e-6)
    z_PxNxD = (x_PxNxD - mean_PxD[:, None]) / scale_PxD[:, None]
    one = functools.partial(_fit_one, n_classes=n_classes, settings=settings)
    per_hop = jax.vmap(one, in_axes=(None, 1, 1))  # the same features, each hop's labels
    w, b = jax.vmap(per_hop, in_axes=(0, None, None))(z_PxNxD, y_NxH, m_NxH.astype(jnp.float32))
    return Probes(mean_PxD, scale_PxD, w, b)


@jax.jit
def predict(probes: Probes, x_PxNxD: jax.Array) -> jax.Array:
    """(P, H, N) predicted classes."""
    z_PxNxD = (x_PxNxD.astype(jnp.float32) - probes.mean_PxD[:, None]) / probes.scale_PxD[:, None]
    logits_PxHxNxC = jnp.einsum("pnd,phdc->phnc", z_PxNxD, probes.w_PxHxDxC) + probes.b_PxHxC[:, :, None]
    return jnp.argmax(logits_PxHxNxC, axis=-1)


def accuracy(probes: Probes, x_PxNxD, y_NxH, m_NxH) -> tuple[jax.Array, jax.Array]:
    """(P, H) share of the masked targets each probe names, and (H,) how many there are."""
    right_PxHxN = (predict(probes, x_PxNxD) == y_NxH.T[None]) & m_NxH.T[None]
    count_H = jnp.sum(m_NxH, axis=0)
    return jnp.sum(right_PxHxN, axis=-1) / jnp.maximum(count_H, 1), count_H
