"""The language-model loss on a model's outputs (cross-entropy at the configured loop exits)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from loopscale.config.schema import LossLoops
from loopscale.model.transformer import ModelOutputs, loss_loop_indices


def cross_entropy(logits_xV: jax.Array, targets_x: jax.Array, mask_x: jax.Array) -> jax.Array:
    """Mean token cross-entropy over positions where mask is true."""
    ce = optax.softmax_cross_entropy_with_integer_labels(logits_xV.astype(jnp.float32), targets_x)
    mask = mask_x.astype(jnp.float32)
    return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def lm_loss(outputs: ModelOutputs, targets_BxT: jax.Array, mask_BxT: jax.Array,
            loss_loops: LossLoops) -> jax.Array:
    """Cross-entropy at the last loop, or averaged over the loops `loss_loops` selects."""
    if loss_loops is LossLoops.LAST or outputs.exit_logits is None:
        return cross_entropy(outputs.logits, targets_BxT, mask_BxT)
    loops = loss_loop_indices(loss_loops, outputs.exit_logits.shape[0])
    return jnp.mean(jnp.stack(
        [cross_entropy(outputs.exit_logits[t], targets_BxT, mask_BxT) for t in loops]
    ))


def z_loss(logits_xV: jax.Array, mask_x: jax.Array) -> jax.Array:
    """PaLM's logit z-loss, mean over masked positions of logsumexp(logits)^2."""
    lse = jax.nn.logsumexp(logits_xV.astype(jnp.float32), axis=-1)
    mask = mask_x.astype(jnp.float32)
    return jnp.sum(jnp.square(lse) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
