"""Token-choice top-k mixture of experts, with two dispatch paths that compute the same thing.

- dropless: every (token, expert) assignment is sorted by expert and the experts run as one
  grouped matmul (`jax.lax.ragged_dot`), so no token is ever dropped;
- capacity: GShard/Switch-style one-hot dispatch and combine einsums, each expert taking at most
  C = ceil(capacity_factor * T * top_k / E) assignments per sequence (top-1 choices first);
  the rest are dropped and reported as `dropped_frac`.
With ample capacity (capacity_factor >= E / top_k) the two agree (tests/test_moe.py).

Router: bias-free linear map, softmax over all experts for the load-balancing loss; combine
weights are the softmax over the k selected logits (the sparse-layers study's choice).
Losses: Switch load balancing E * sum_i f_i P_i (f_i the share of assignments sent to expert i,
P_i its mean router probability; exactly 1.0 for a uniform router) and the router z-loss
mean(logsumexp(logits)^2).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from loopscale.config.schema import MLPKind, ModelConfig, MoEDispatch
from loopscale.model import mup
from loopscale.model.ffn import activate
from loopscale.model.layers import weight


def load_balancing_loss(probs_NxE: jax.Array, load_E: jax.Array) -> jax.Array:
    n_experts = probs_NxE.shape[-1]
    return n_experts * jnp.sum(load_E * jnp.mean(probs_NxE, axis=0))


def router_z_loss(logits_NxE: jax.Array) -> jax.Array:
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits_NxE, axis=-1)))


def capacity(cfg: ModelConfig, tokens_per_group: int) -> int:
    return max(1, math.ceil(cfg.capacity_factor * tokens_per_group * cfg.top_k / cfg.n_experts))


class MoE(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxTxD: jax.Array) -> tuple[jax.Array, dict]:
        cfg = self.cfg
        B, T, D = x_BxTxD.shape
        E, F, k = cfg.n_experts, cfg.expert_width, cfg.top_k
        dtype = x_BxTxD.dtype

        w_router = weight(self, "router", (D, E), ("embed", None), cfg)
        router_mult = mup.scaling(mup.Role.ROUTER, cfg).forward_mult
        logits_BxTxE = jnp.einsum(
            "btd,de->bte", x_BxTxD.astype(jnp.float32), w_router
        ) * router_mult
        probs_BxTxE = jax.nn.softmax(logits_BxTxE, axis=-1)
        top_logits_BxTxK, experts_BxTxK = jax.lax.top_k(logits_BxTxE, k)
        gates_BxTxK = jax.nn.softmax(top_logits_BxTxK, axis=-1)

        axes_in, axes_out = ("expert", "embed", "mlp"), ("expert", "mlp", "embed")
        w_up = weight(self, "w_up", (E, D, F), axes_in, cfg)
        w_gate = weight(self, "w_gate", (E, D, F), axes_in, cfg) if cfg.mlp is MLPKind.SWIGLU else None
        w_down = weight(self, "w_down", (E, F, D), axes_out, cfg, zero=cfg.zero_init_out)
        weights = (w_up.astype(dtype), None if w_gate is None else w_gate.astype(dtype), w_down.astype(dtype))

        if cfg.moe_dispatch is MoEDispatch.DROPLESS:
            y_BxTxD = _dropless(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, cfg.mlp, E)
            dropped = jnp.zeros((), jnp.float32)
        else:
            y_BxTxD, dropped = _with_capacity(
                x_BxTxD, experts_BxTxK, gates_BxTxK, weights, cfg.mlp, capacity(cfg, T)
            )

        load_E = jnp.mean(jax.nn.one_hot(experts_BxTxK, E, dtype=jnp.float32), axis=(0, 1, 2))
        stats = {
            "lb_loss": load_balancing_loss(probs_BxTxE.reshape(-1, E), load_E),
            "router_z": router_z_loss(logits_BxTxE.reshape(-1, E)),
            "expert_load": load_E,
            "experts": experts_BxTxK.astype(jnp.int32),
            "dropped_frac": dropped,
        }
        return nn.with_logical_constraint(y_BxTxD, ("batch", "length", "embed")), stats


def _expert_ffn(kind: MLPKind, x, weights, matmul: Callable) -> jax.Array:
    w_up, w_gate, w_down = weights
    gate = None if w_gate is None else matmul(x, w_gate)
    return matmul(activate(kind, matmul(x, w_up), gate), w_down)


def _dropless(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, kind, n_experts):
    B, T, D = x_BxTxD.shape
    k = experts_BxTxK.shape[-1]
    x_NxD = x_BxTxD.reshape(B * T, D)
    expert_A = experts_BxTxK.reshape(-1)
    token_A = jnp.repeat(jnp.arange(B * T), k)
    order_A = jnp.argsort(expert_A, stable=True)
    sizes_E = jnp.bincount(expert_A, length=n_experts).astype(jnp.int32)
    xs_AxD = x_NxD[token_A[order_A]]

    def grouped(x, w):
        return jax.lax.ragged_dot(x, w, sizes_E)

    ys_AxD = _expert_ffn(kind, xs_AxD, weights, grouped)
    y_AxD = ys_AxD[jnp.argsort(order_A)]  # undo the sort with a gather
    y_NxKxD = y_AxD.reshape(B * T, k, D)
    gates_NxK = gates_BxTxK.reshape(B * T, k).astype(y_NxKxD.dtype)
    return jnp.einsum("nkd,nk->nd", y_NxKxD, gates_NxK).reshape(B, T, D)


def _with_capacity(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, kind, cap):
    B, T, D = x_BxTxD.shape
    k = experts_BxTxK.shape[-1]
    n_experts = weights[0].shape[0]
    onehot_BxTxKxE = jax.nn.one_hot(experts_BxTxK, n_experts, dtype=jnp.int32)
    # Queue position of each assignment in its expert: all first choices, then all second ...
    queue_BxKTxE = onehot_BxTxKxE.transpose(0, 2, 1, 3).reshape(B, k * T, n_experts)
    position_BxKTxE = jnp.cumsum(queue_BxKTxE, axis=1) * queue_BxKTxE - 1
    position_BxTxKxE = position_BxKTxE.reshape(B, k, T, n_experts).transpose(0, 2, 1, 3)
    kept_BxTxKxE = (onehot_BxTxKxE > 0) & (position_BxTxKxE < cap)
    slot_BxTxKxExC = jax.nn.one_hot(position_BxTxKxE, cap, dtype=x_BxTxD.dtype) * kept_BxTxKxE[..., None]
    dispatch_BxTxExC = jnp.sum(slot_BxTxKxExC, axis=2)
    gates = gates_BxTxK.astype(x_BxTxD.dtype)[..., None, None]
    combine_BxTxExC = jnp.sum(slot_BxTxKxExC * gates, axis=2)

    xin_ExBxCxD = jnp.einsum("btec,btd->ebcd", dispatch_BxTxExC, x_BxTxD)

    def batched(x, w):
        return jnp.einsum("ebcd,edf->ebcf", x, w)

    yout_ExBxCxD = _expert_ffn(kind, xin_ExBxCxD, weights, batched)
    y_BxTxD = jnp.einsum("ebcd,btec->btd", yout_ExBxCxD, combine_BxTxExC)
    dropped = 1.0 - jnp.sum(kept_BxTxKxE) / (B * T * k)
    return y_BxTxD, dropped.astype(jnp.float32)
