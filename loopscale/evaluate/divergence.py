"""How far each loop exit's next-token distribution is from the final one: the Jensen-Shannon
divergence (the FLT study's convergence measure), per token, in bits (nats / ln 2, so 0..1).

`jsd_step` returns sums over a batch (per exit: JSD, its square, tokens below 0.5 bits, and
the tokens counted), so a pass over held-out batches gives each exit's mean, spread and share
of tokens below 0.5 exactly. Like the eval step it runs in the train step's micro-batches and
reads the vocabulary out `train.ce_chunk` positions at a time, so no (K, B, T, V) tensor is
ever whole; the final exit's distribution of a chunk is computed once and compared with each
earlier exit's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import TrainConfig
from loopscale.train.eval_loss import map_position_chunks, summed_over_micro_batches
from loopscale.model import LoopedLM
from loopscale.train.step import readout_fn

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

BELOW = 0.5  # bits: the share of tokens whose exit is this close to the final distribution


def _js_bits(logp: jax.Array, logq: jax.Array) -> jax.Array:
    """JSD(p, q) / ln 2 over the last axis, from log-probabilities."""
    p, q = jnp.exp(logp), jnp.exp(logq)
    logm = jnp.log(0.5 * (p + q))
    js = 0.5 * jnp.sum(p * (logp - logm), -1) + 0.5 * jnp.sum(q * (logq - logm), -1)
    return js / math.log(2.0)


def jsd_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
             ) -> dict[str, jax.Array]:
    readout = readout_fn(model, params)

    def sums(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
        hidden_KxBxTxD = out.loop_hidden
        K = hidden_KxBxTxD.shape[0]
        mask_BxT = micro["mask"].astype(jnp.float32)

        def chunk(h_KxBxcxD, _):
            logq = jax.nn.log_softmax(readout(h_KxBxcxD[-1]).astype(jnp.float32), -1)
            return jnp.stack([_js_bits(jax.nn.log_softmax(readout(h_KxBxcxD[k]).astype(
                jnp.float32), -1), logq) for k in range(K - 1)])  # (K-1, B, c)

        js = map_position_chunks(chunk, hidden_KxBxTxD, micro["targets"], train.ce_chunk)
        return {"js_sum": jnp.sum(js * mask_BxT, (1, 2)),
                "js_sq_sum": jnp.sum(js ** 2 * mask_BxT, (1, 2)),
                "below": jnp.sum((js < BELOW) * mask_BxT, (1, 2)),
                "weight": jnp.sum(mask_BxT)}

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def jsd(run: Loaded) -> dict:
    """Per exit 1 .. K-1 (the last exit is the final distribution itself)."""
    k = run.config.model.n_loops
    if k < 2:
        return {"n_loops": k, "exits": [], "mean": [], "std": [], "share_below": [],
                "below": BELOW, "note": "one loop: no earlier exit to compare"}
    s = run.sums(jsd_step)
    n = max(float(s["weight"]), 1.0)
    mean = np.asarray(s["js_sum"]) / n
    std = np.sqrt(np.maximum(np.asarray(s["js_sq_sum"]) / n - mean ** 2, 0.0))
    return {"n_loops": k, "exits": list(range(1, k)), "mean": mean.tolist(), "std": std.tolist(),
            "share_below": (np.asarray(s["below"]) / n).tolist(), "below": BELOW,
            "tokens": float(s["weight"]), "mean_first_exit": float(mean[0])}


def plot_jsd(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    if result["exits"]:
        ax.errorbar(result["exits"], result["mean"], yerr=result["std"], marker="o", capsize=3)
    ax.set(xlabel="loop exit", ylabel="JSD to the final exit (bits)", ylim=(0, 1), title=title)
    fig.tight_layout()
    return fig
