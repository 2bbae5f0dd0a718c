"""The language-model loss from a model's hidden states, with the vocabulary projection taken a
few positions at a time.

The full (B, T, V) float32 logits of a large vocabulary do not fit next to a model: at the FLT
study's paper size (vocabulary 151,669, batch 512 x 1024) they are 318 GB for one loop exit.
`token_losses` therefore projects `chunk` positions at a time inside a rematerialised map, so
only a (B, chunk, V) slice exists at once, in the forward pass and again in the backward pass,
and what is kept between them is a (B, T) row of losses. The result is the same loss.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from loopscale.config.schema import LossLoops

Readout = Callable[[jax.Array], jax.Array]  # hidden (B, t, D) -> logits (B, t, V)


def loss_loop_indices(loss_loops: LossLoops, n_loops: int) -> list[int]:
    """Loop indices (0-based) where the LM loss is taken. The last third is the FLT authors'
    `FEW` loss, loops 2K//3 .. K-1: ceil(K/3) of them (K = 4: loops 2 and 3; K = 1: loop 0)."""
    if loss_loops is LossLoops.ALL:
        return list(range(n_loops))
    if loss_loops is LossLoops.LAST_THIRD:
        return list(range(2 * n_loops // 3, n_loops))
    return [n_loops - 1]


def chunk_size(length: int, chunk: int) -> int:
    """The largest divisor of `length` that is at most `chunk` (0: the whole length)."""
    if chunk <= 0 or chunk >= length:
        return length
    return max(c for c in range(1, chunk + 1) if length % c == 0)


def token_losses(readout: Readout, hidden_BxTxD: jax.Array, targets_BxT: jax.Array,
                 chunk: int) -> tuple[jax.Array, jax.Array]:
    """Per-token cross-entropy and logsumexp of the logits, each (B, T) float32."""
    B, T, D = hidden_BxTxD.shape
    c = chunk_size(T, chunk)

    def one(args):
        h_BxcxD, y_Bxc = args
        logits_BxcxV = readout(h_BxcxD).astype(jnp.float32)
        lse_Bxc = jax.nn.logsumexp(logits_BxcxV, axis=-1)
        ce_Bxc = optax.softmax_cross_entropy_with_integer_labels(logits_BxcxV, y_Bxc)
        return ce_Bxc, lse_Bxc

    if c == T:
        return one((hidden_BxTxD, targets_BxT))
    n = T // c
    h_nxBxcxD = hidden_BxTxD.reshape(B, n, c, D).swapaxes(0, 1)
    y_nxBxc = targets_BxT.reshape(B, n, c).swapaxes(0, 1)
    ce, lse = jax.lax.map(jax.checkpoint(one), (h_nxBxcxD, y_nxBxc))
    return ce.swapaxes(0, 1).reshape(B, T), lse.swapaxes(0, 1).reshape(B, T)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cross_entropy(logits_xV: jax.Array, targets_x: jax.Array, mask_x: jax.Array) -> jax.Array:
    """Mean token cross-entropy over positions where mask is true (small logits only)."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits_xV.astype(jnp.float32), targets_x)
    return masked_mean(ce, mask_x)


def lm_loss(readout: Readout, loop_hidden_KxBxTxD: jax.Array, targets_BxT: jax.Array,
            mask_BxT: jax.Array, loss_loops: LossLoops, chunk: int) -> tuple[jax.Array, jax.Array]:
    """(cross-entropy, last loop's (B, T) logsumexp): the loss at the last loop, or averaged
    over the loops `loss_loops` selects. The logsumexp serves the logit z-loss."""
    loops = loss_loop_indices(loss_loops, loop_hidden_KxBxTxD.shape[0])
    ces, lse = [], None
    for t in loops:
        ce_BxT, lse = token_losses(readout, loop_hidden_KxBxTxD[t], targets_BxT, chunk)
        ces.append(masked_mean(ce_BxT, mask_BxT))
    return jnp.mean(jnp.stack(ces)), lse


def z_loss(lse_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """PaLM's logit z-loss, mean over masked positions of logsumexp(logits)^2."""
    return masked_mean(jnp.square(lse_BxT), mask_BxT)
