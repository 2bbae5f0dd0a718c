"""Dense feed-forward blocks: SwiGLU, GELU and relu^2, with explicit weights.

`expert_ffn` runs the same three kinds with an extra leading expert axis (used by moe.py)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from loopscale.config.schema import MLPKind, ModelConfig
from loopscale.model.layers import weight


def activate(kind: MLPKind, up: jax.Array, gate: jax.Array | None) -> jax.Array:
    if kind is MLPKind.SWIGLU:
        return jax.nn.silu(gate) * up
    if kind is MLPKind.GELU:
        return jax.nn.gelu(up)
    return jnp.square(jax.nn.relu(up))


class MLP(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        cfg = self.cfg
        D, F = cfg.d_model, cfg.ffn_width
        dtype = x_BxTxD.dtype
        w_up = weight(self, "w_up", (D, F), ("embed", "mlp"), cfg)
        up_BxTxF = jnp.einsum("btd,df->btf", x_BxTxD, w_up.astype(dtype))
        gate_BxTxF = None
        if cfg.mlp is MLPKind.SWIGLU:
            w_gate = weight(self, "w_gate", (D, F), ("embed", "mlp"), cfg)
            gate_BxTxF = jnp.einsum("btd,df->btf", x_BxTxD, w_gate.astype(dtype))
        h_BxTxF = activate(cfg.mlp, up_BxTxF, gate_BxTxF)
        h_BxTxF = nn.with_logical_constraint(h_BxTxF, ("act_batch", "act_length", "act_mlp"))
        w_down = weight(self, "w_down", (F, D), ("mlp", "embed"), cfg, zero=cfg.zero_init_out)
        return jnp.einsum("btf,fd->btd", h_BxTxF, w_down.astype(dtype))
