"""Linear probes: multinomial logistic regression fitted by optax's L-BFGS, many at once, with
the L2 strength of each chosen by k-fold cross-validation.

One probe per (point, hop): features x_PxNxD (P points of the network, N examples, D dims),
labels y_NxH (H targets per example, classes 0 .. C-1) and a mask m_NxH (which targets exist).
Every (point, hop) pair is an independent convex problem; one L-BFGS run of a fixed number of
steps is vmapped over both axes, so the whole grid is one jitted computation (`_fit_all`,
compiled once per shape and run by every fit below).

Features are standardised per point and dimension with the fitting rows' mean and spread
(the residual stream's scale grows with depth, and L-BFGS's first step is scale-sensitive). An
L2 penalty keeps the optimum finite when a split is linearly separable (it often is: hundreds
of dimensions), and how strong it should be differs between a point that codes the hop (weak:
the code is found) and one that does not (strong: the fit of noise is shrunk to the class
frequencies). `cross_validate` picks it per probe from `ProbeSettings.l2_grid`: example i is
in fold i mod k (the examples are i.i.d. draws, so interleaving is a random split), each fold's
probes are fitted, standardised, on the other folds and scored by their mean cross-entropy on
it (which, unlike accuracy, separates a shrunk guess from a confident wrong one), and the
strength of the least held-out loss wins, the stronger one on a tie. `fit_cv` then fits every
probe on all the examples at its strength.

Cost: folds x len(l2_grid) + 1 fits (25 by default), one at a time, each of the memory of one.
A tiny run's probes (16 probes, 1024 x 64 features) take 1.5-3 s a fit on one CPU core; a
paper-scale run's (256 probes, 4096 x 256) are about 256 times that, hours on two cores
(estimated, not measured): an accelerator's job, as its training is.
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
    # penalties on the weights, 0.5 * l2 * ||W||^2 beside the mean CE, tried by cross-validation
    l2_grid: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
    folds: int = 4


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Probes:
    """Fitted probes on standardised features: logits = ((x - mean) / scale) @ w + b."""

    mean_PxD: jax.Array
    scale_PxD: jax.Array
    w_PxHxDxC: jax.Array
    b_PxHxC: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """The held-out mean cross-entropy of every strength of the grid (largest first) per probe,
    and the strength chosen per probe."""

    l2_G: jax.Array
    loss_GxPxH: jax.Array
    l2_PxH: jax.Array


def _masked_ce(logits_NxC, y_N, m_N) -> jax.Array:
    ce_N = optax.softmax_cross_entropy_with_integer_labels(logits_NxC, y_N)
    return jnp.sum(ce_N * m_N) / jnp.maximum(jnp.sum(m_N), 1.0)


def _fit_one(z_NxD, y_N, m_N, l2, *, n_classes: int, steps: int):
    """One probe on standardised features: (w, b) after `steps` L-BFGS iterations."""
    def loss(theta):
        w_DxC, b_C = theta
        return _masked_ce(z_NxD @ w_DxC + b_C, y_N, m_N) + 0.5 * l2 * jnp.sum(w_DxC ** 2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)
    theta = (jnp.zeros((z_NxD.shape[1], n_classes)), jnp.zeros((n_classes,)))

    def step(carry, _):
        theta, state = carry
        value, grad = value_and_grad(theta, state=state)
        updates, state = opt.update(grad, state, theta, value=value, grad=grad, value_fn=loss)
        return (optax.apply_updates(theta, updates), state), None

    (theta, _), _ = jax.lax.scan(step, (theta, opt.init(theta)), None, length=steps)
    return theta


def _standardise(x_PxNxD, w_N):
    """Mean and spread per point and dimension over the rows of weight 1 in w_N."""
    n = jnp.maximum(jnp.sum(w_N), 1.0)
    mean_PxD = jnp.einsum("pnd,n->pd", x_PxNxD, w_N) / n
    var_PxD = jnp.einsum("pnd,n->pd", (x_PxNxD - mean_PxD[:, None]) ** 2, w_N) / n
    # A dimension constant over the split (e.g. a zero-initialised one) would divide by zero.
    return mean_PxD, jnp.maximum(jnp.sqrt(var_PxD), 1e-6)


@functools.partial(jax.jit, static_argnames=("n_classes", "steps"))
def _fit_all(x_PxNxD, y_NxH, m_NxH, w_N, l2_PxH, *, n_classes: int, steps: int) -> Probes:
    """Probes for every (point, hop) on the rows of weight 1 in w_N, at strengths l2_PxH. The
    one compiled fit: cross-validation's folds and strengths and the final fit differ only in
    w_N and l2_PxH, so they all run it."""
    mean_PxD, scale_PxD = _standardise(x_PxNxD, w_N)
    z_PxNxD = (x_PxNxD - mean_PxD[:, None]) / scale_PxD[:, None]
    one = functools.partial(_fit_one, n_classes=n_classes, steps=steps)
    per_hop = jax.vmap(one, in_axes=(None, 1, 1, 0))  # the same features, each hop's labels
    w, b = jax.vmap(per_hop, in_axes=(0, None, None, 0))(
        z_PxNxD, y_NxH, m_NxH.astype(jnp.float32) * w_N[:, None], l2_PxH)
    return Probes(mean_PxD, scale_PxD, w, b)


def _logits(probes: Probes, x_PxNxD) -> jax.Array:
    """(P, H, N, C)."""
    z_PxNxD = (x_PxNxD.astype(jnp.float32) - probes.mean_PxD[:, None]) / probes.scale_PxD[:, None]
    return jnp.einsum("pnd,phdc->phnc", z_PxNxD, probes.w_PxHxDxC) + probes.b_PxHxC[:, :, None]


@jax.jit
def _held_out_ce(probes: Probes, x_PxNxD, y_NxH, m_NxH, held_N) -> tuple[jax.Array, jax.Array]:
    """(P, H) summed cross-entropy over the existing targets of the rows of weight 1 in held_N,
    and (H,) how many there are."""
    ce_PxHxN = optax.softmax_cross_entropy_with_integer_labels(_logits(probes, x_PxNxD),
                                                               y_NxH.T[None])
    weight_HxN = m_NxH.T.astype(jnp.float32) * held_N
    return jnp.sum(ce_PxHxN * weight_HxN, -1), jnp.sum(weight_HxN, -1)


def _inputs(x_PxNxD, y_NxH, m_NxH):
    return jnp.asarray(x_PxNxD, jnp.float32), jnp.asarray(y_NxH), jnp.asarray(m_NxH)


def fit(x_PxNxD, y_NxH, m_NxH, l2=1e-3, *, n_classes: int,
        steps: int = ProbeSettings.steps) -> Probes:
    """Probes for every (point, hop), fitted on the examples given, at L2 strength `l2` (one
    for all, or one per probe, (P, H))."""
    x_PxNxD, y_NxH, m_NxH = _inputs(x_PxNxD, y_NxH, m_NxH)
    P, N, _ = x_PxNxD.shape
    l2_PxH = jnp.broadcast_to(jnp.asarray(l2, jnp.float32), (P, y_NxH.shape[1]))
    return _fit_all(x_PxNxD, y_NxH, m_NxH, jnp.ones(N), l2_PxH, n_classes=n_classes, steps=steps)


def cross_validate(x_PxNxD, y_NxH, m_NxH, *, n_classes: int,
                   settings: ProbeSettings = ProbeSettings()) -> CrossValidation:
    """k-fold cross-validation of the L2 strength of every probe (module docstring). One fit at
    a time (a fold and a strength): the memory of one fit, whatever the grid."""
    x_PxNxD, y_NxH, m_NxH = _inputs(x_PxNxD, y_NxH, m_NxH)
    P, N, _ = x_PxNxD.shape
    H = y_NxH.shape[1]
    l2_G = jnp.asarray(sorted(settings.l2_grid, reverse=True), jnp.float32)  # ties: stronger
    fold_N = jnp.arange(N) % settings.folds
    ce_GxPxH, count_GxPxH = jnp.zeros((len(l2_G), P, H)), jnp.zeros((len(l2_G), P, H))
    for fold in range(settings.folds):
        held_N = (fold_N == fold).astype(jnp.float32)
        for g, l2 in enumerate(l2_G):
            probes = _fit_all(x_PxNxD, y_NxH, m_NxH, 1.0 - held_N, jnp.full((P, H), l2),
                              n_classes=n_classes, steps=settings.steps)
            ce_PxH, count_H = _held_out_ce(probes, x_PxNxD, y_NxH, m_NxH, held_N)
            ce_GxPxH = ce_GxPxH.at[g].add(ce_PxH)
            count_GxPxH = count_GxPxH.at[g].add(count_H)
    loss_GxPxH = ce_GxPxH / jnp.maximum(count_GxPxH, 1.0)
    return CrossValidation(l2_G, loss_GxPxH, l2_G[jnp.argmin(loss_GxPxH, axis=0)])


def fit_cv(x_PxNxD, y_NxH, m_NxH, *, n_classes: int,
           settings: ProbeSettings = ProbeSettings()) -> tuple[Probes, CrossValidation]:
    """Every probe fitted on all the examples at the strength cross-validation chose for it."""
    cv = cross_validate(x_PxNxD, y_NxH, m_NxH, n_classes=n_classes, settings=settings)
    return fit(x_PxNxD, y_NxH, m_NxH, cv.l2_PxH, n_classes=n_classes, steps=settings.steps), cv


@jax.jit
def predict(probes: Probes, x_PxNxD: jax.Array) -> jax.Array:
    """(P, H, N) predicted classes."""
    return jnp.argmax(_logits(probes, x_PxNxD), axis=-1)


def hits(probes: Probes, x_PxNxD, y_NxH, m_NxH) -> jax.Array:
    """(P, H, N): whether each probe names each example's existing target."""
    return (predict(probes, x_PxNxD) == y_NxH.T[None]) & m_NxH.T[None]


def accuracy(probes: Probes, x_PxNxD, y_NxH, m_NxH) -> tuple[jax.Array, jax.Array]:
    """(P, H) share of the masked targets each probe names, and (H,) how many there are."""
    count_H = jnp.sum(m_NxH, axis=0)
    return jnp.sum(hits(probes, x_PxNxD, y_NxH, m_NxH), axis=-1) / jnp.maximum(count_H, 1), count_H
