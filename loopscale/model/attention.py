"""Causal multi-head attention with separate query and key/value inputs.

Separate inputs are what attention injection needs (PAPERS.md section 1): on loop t >= 2 an
injected layer takes its queries from the previous loop's output and its keys and values from
its own input, with the layer's own W_Q/W_K/W_V, rotary positions and qk-norm on both, and the
causal mask unchanged. Plain self-attention passes the same array twice. The core (scores,
mask, softmax, values) is computed as `model.attention` says (attention_core.py).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from loopscale.config.schema import ModelConfig
from loopscale.model import mup
from loopscale.model.attention_core import attend
from loopscale.model.layers import apply_rope, rms_norm, weight


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(
        self,
        xq_BxTxD: jax.Array,
        xkv_BxTxD: jax.Array,
        rope: tuple[jax.Array, jax.Array],
    ) -> jax.Array:
        cfg = self.cfg
        D, H, K = cfg.d_model, cfg.n_heads, cfg.d_head
        dtype = xq_BxTxD.dtype
        wq = weight(self, "wq", (D, H, K), ("embed", "heads", "kv"), cfg)
        wk = weight(self, "wk", (D, H, K), ("embed", "heads", "kv"), cfg)
        wv = weight(self, "wv", (D, H, K), ("embed", "heads", "kv"), cfg)
        wo = weight(self, "wo", (H, K, D), ("heads", "kv", "embed"), cfg, zero=cfg.zero_init_out)

        q_BxTxHxK = jnp.einsum("btd,dhk->bthk", xq_BxTxD, wq.astype(dtype))
        k_BxSxHxK = jnp.einsum("bsd,dhk->bshk", xkv_BxTxD, wk.astype(dtype))
        v_BxSxHxK = jnp.einsum("bsd,dhk->bshk", xkv_BxTxD, wv.astype(dtype))
        if cfg.qk_norm:  # parameter-free, as in the FLT code; commutes with the rotation
            q_BxTxHxK = rms_norm(q_BxTxHxK, cfg.norm_eps)
            k_BxSxHxK = rms_norm(k_BxSxHxK, cfg.norm_eps)
        q_BxTxHxK = apply_rope(q_BxTxHxK, *rope)
        k_BxSxHxK = apply_rope(k_BxSxHxK, *rope)
        q_BxTxHxK = nn.with_logical_constraint(
            q_BxTxHxK, ("act_batch", "act_length", "act_heads", "act_kv"))

        out_BxTxHxK = attend(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, mup.attention_scale(cfg),
                             cfg.attention)
        out_BxTxD = jnp.einsum("bthk,hkd->btd", out_BxTxHxK, wo.astype(dtype))
        return nn.with_logical_constraint(out_BxTxD, ("act_batch", "act_length", "act_embed"))
