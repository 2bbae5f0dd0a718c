"""MoE routing across loop passes on held-out tokens (the sparse-layers study's question: does
a weight-shared MoE layer send a token to the same experts on every pass?).

`routing_step` returns sums over a batch's tokens, per physical layer: how many tokens' top-k
sets on consecutive passes are identical, overlap, or are disjoint (summed over the K-1 pass
pairs), how many distinct experts each token uses across all K passes, and the assignments per
(pass, layer, expert). The training metric `route_*` (train/diagnostics.py) is the same
comparison averaged over layers on training batches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from loopscale.config.schema import TrainConfig
from loopscale.model import LoopedLM
from loopscale.train.step import micro_batches


def routing_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
                 ) -> dict[str, jax.Array]:
    cfg = model.cfg

    def sums(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
        experts = out.moe["experts"]  # (K, L, B, T, k)
        k = experts.shape[-1]
        mask = micro["mask"].astype(jnp.float32)  # (B, T)
        shared = jnp.sum(jnp.any(experts[:-1, ..., :, None] == experts[1:, ..., None, :], -1),
                         -1)  # (K-1, L, B, T): experts of pass t found again on pass t+1
        count = lambda x: jnp.sum(x * mask, axis=(0, 2, 3))
        onehot = jax.nn.one_hot(experts, cfg.n_experts, dtype=jnp.float32)  # (K, L, B, T, k, E)
        used = jnp.max(onehot, axis=(0, 4))  # (L, B, T, E): chosen on any pass
        return {
            "identical": count(shared == k), "disjoint": count(shared == 0),
            "pairs": count(jnp.ones_like(shared, jnp.float32)),
            "unique_sum": jnp.sum(jnp.sum(used, -1) * mask, axis=(1, 2)),  # (L,)
            "load": jnp.einsum("klbtje,bt->kle", onehot, mask),  # (K, L, E)
            "weight": jnp.sum(mask),
        }

    if train.grad_accum == 1:
        return sums(batch)
    parts = jax.lax.map(sums, micro_batches(batch, train.grad_accum))
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), parts)
