"""Small building blocks: explicit weights with muP roles, RMSNorm, rotary positions.

Shape legend used across model/: B batch, T length (queries), S length (keys), D d_model,
H heads, K head size, F FFN width, E experts, C expert capacity, V vocabulary, L unique layers,
N flattened tokens, A token-expert assignments (N * top_k).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from loopscale.config.schema import InitDist, InitSpec, ModelConfig
from loopscale.model import mup


def weight(
    module: nn.Module,
    name: str,
    shape: Sequence[int],
    axes: Sequence[str | None],
    cfg: ModelConfig,
    zero: bool = False,
) -> jax.Array:
    """Declares a float32 weight drawn as its init role's entry of `model.init` says, at the
    std its muP role scales to this width (both looked up by name: mup.init_of); `zero`
    (zero_init_out, zero_init_readout) starts it at zero whatever the entry says.

    `axes` are logical axis names, mapped onto mesh axes by the trainer's rules."""
    spec = InitSpec(InitDist.ZEROS, 0.0) if zero else mup.init_of(name, cfg)
    init = nn.with_logical_partitioning(initializer(spec), tuple(axes))
    return module.param(name, init, tuple(shape), jnp.float32)


def initializer(spec: InitSpec) -> jax.nn.initializers.Initializer:
    if spec.dist is InitDist.ZEROS:
        return nn.initializers.zeros
    if spec.dist is InitDist.NORMAL:
        return nn.initializers.normal(stddev=spec.std)
    if spec.dist is InitDist.TRUNCATED_NORMAL:
        return nn.initializers.truncated_normal(stddev=spec.std, lower=-3.0, upper=3.0)
    bound = math.sqrt(3.0) * spec.std  # uniform on [-b, b] has std b / sqrt(3)

    def uniform(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return uniform


def rms_norm(x: jax.Array, eps: float) -> jax.Array:
    """Parameter-free RMS normalisation over the last axis, computed in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype)


class RMSNorm(nn.Module):
    """Pre-norm RMSNorm; with `cfg.norm_gain` a learnable gain (role: norm), else none."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = rms_norm(x, self.cfg.norm_eps)
        if self.cfg.norm_gain:
            init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
            gain = self.param("scale", init, (x.shape[-1],), jnp.float32)
            y = y * gain.astype(y.dtype)
        return y


def rope_tables(length: int, d_head: int, base: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables (T, K/2) for rotary positions on the first/second half split."""
    inv_freq = 1.0 / (base ** (jnp.arange(0, d_head, 2, dtype=jnp.float32) / d_head))
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BxTxHxK: jax.Array, cos_TxK2: jax.Array, sin_TxK2: jax.Array) -> jax.Array:
    x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
    cos, sin = cos_TxK2[None, :, None, :], sin_TxK2[None, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxTxHxK.dtype)
