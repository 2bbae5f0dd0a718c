"""How far the next-token distribution at each depth is from the final one: the Jensen-Shannon
divergence (the sparse-layers study's convergence measure), per token, in bits (nats / ln 2,
so 0..1).

Depth points. After layer l of loop k of the core the stream is read out as an exit reads it:
through the coda when the model has one (on whole sequences), then the model's own final norm
and unembedding (the logit lens, `readout_fn`), at depth d = (k-1)*L + l for k = 1..K,
l = 1..L (core layers only: a prelude's layers run before the loop and are not depth points): every layer of a model without loops (K = 1) and of a looped one alike, so the
study's comparison (looped models converge earlier in depth) can be drawn on one axis. The
loop boundaries are the depths k*L; their figures are also given per loop exit (`exits`,
`mean`, `std`, `share_below`, exits 1..K-1, as before depth points were measured). The last
depth is the final distribution itself: JSD 0 there by definition, not computed.

Convergence. A token has converged at a depth when its JSD there is below 0.5 bits (the
study's threshold). Two scalars compare models of any shape as a fraction of their depth:
`converged_half_fraction`, the first depth where half the tokens are converged (share_below
>= 0.5), and `first_converged_fraction_mean`, the mean over tokens of the first depth at which
each is converged (not necessarily staying so), each divided by the total depth K*L.

`jsd_step` returns sums over a batch (per depth: JSD, its square, tokens below 0.5 bits; per
depth, the tokens that first converge there; and the tokens counted), so a pass over held-out
batches gives each depth's mean, spread and share of tokens below 0.5 exactly. Like the eval
step it runs in the train step's micro-batches and reads the vocabulary out `train.ce_chunk`
positions at a time, one depth at a time (a `lax.map` over depths), so no (depth, B, T, V)
tensor is ever whole, only the micro-batch's stream at every depth, (K*L, B, T, D); the final
distribution of a chunk is computed once and compared with each earlier depth's. Measured
(`loopscale compile --step=eval:jsd`, Looped-MoE :paper on v5p-128, 16 depths): 3.1 GB a chip
with `train.ce_chunk` 512 (the loop-exit version: 1.8), 2.1 GB with 256; a Python loop over
the depths instead of the map: 3.6 GB.
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

BELOW = 0.5  # bits: a token is converged at a depth whose JSD to the final one is below this
HALF = 0.5  # share of tokens converged that `converged_half_depth` asks for


def _js_bits(logp: jax.Array, logq: jax.Array) -> jax.Array:
    """JSD(p, q) / ln 2 over the last axis, from log-probabilities. log m by logaddexp, not
    log(0.5 (p + q)): where both probabilities underflow to 0 the latter is -inf and 0 * inf
    a NaN. One sum over the vocabulary, so XLA can fuse it into one pass."""
    logm = jnp.logaddexp(logp, logq) - math.log(2.0)
    terms = jnp.exp(logp) * (logp - logm) + jnp.exp(logq) * (logq - logm)
    return 0.5 * jnp.sum(terms, -1) / math.log(2.0)


def jsd_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
             ) -> dict[str, jax.Array]:
    """Sums over a batch per depth 1 .. K*L-1 (the last depth is the reference): `js_sum`,
    `js_sq_sum`, `below` (tokens under BELOW bits); `first` per depth 1 .. K*L, the tokens
    whose first converged depth it is (the last depth takes every token converged nowhere
    earlier); `weight`, the tokens counted."""
    model = model.clone(collect_layers=True)  # the same parameters, every layer's stream kept
    readout = readout_fn(model, params)

    def sums(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
        K, L, B, T, D = out.layer_hidden.shape
        # Each layer's stream as an exit reads it: through the coda, if any (whole sequences).
        hidden = model.apply({"params": params}, out.layer_hidden, method=LoopedLM.through_coda)
        hidden_NxBxTxD = hidden.reshape(K * L, B, T, D)  # depth-major: (k-1)*L + l
        mask_BxT = micro["mask"].astype(jnp.float32)

        def log_probs(h_BxcxD):
            return jax.nn.log_softmax(readout(h_BxcxD).astype(jnp.float32), -1)

        def chunk(h_NxBxcxD, _):
            logq_BxcxV = log_probs(h_NxBxcxD[-1])
            # One depth's (B, c, V) at a time: a Python loop would leave XLA free to keep all
            # K*L-1 of them live at once.
            js_MxBxc = jax.lax.map(lambda h: _js_bits(log_probs(h), logq_BxcxV), h_NxBxcxD[:-1])
            # The last depth converges every token; (1, B, c) spelled out, since for one layer
            # run once (the compile's shallow cost points) there is no earlier depth to copy.
            converged_NxBxc = jnp.concatenate(
                [js_MxBxc < BELOW, jnp.ones((1, *js_MxBxc.shape[1:]), bool)])
            return js_MxBxc, jnp.argmax(converged_NxBxc, axis=0)  # (N-1, B, c), (B, c)

        js, first_BxT = map_position_chunks(chunk, hidden_NxBxTxD, micro["targets"],
                                            train.ce_chunk)
        return {"js_sum": jnp.sum(js * mask_BxT, (1, 2)),
                "js_sq_sum": jnp.sum(js ** 2 * mask_BxT, (1, 2)),
                "below": jnp.sum((js < BELOW) * mask_BxT, (1, 2)),
                "first": jnp.einsum("btn,bt->n", jax.nn.one_hot(first_BxT, K * L), mask_BxT),
                "weight": jnp.sum(mask_BxT)}

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def summarise(sums: dict, n_loops: int, layers_per_loop: int) -> dict:
    """The JSON figures from the summed `jsd_step` outputs over the held-out batches."""
    K, L = n_loops, layers_per_loop
    N = K * L
    n = max(float(sums["weight"]), 1.0)
    # The last depth is the final distribution: JSD 0, every token below, none above.
    mean = np.append(np.asarray(sums["js_sum"], np.float64) / n, 0.0)
    std = np.sqrt(np.maximum(np.append(np.asarray(sums["js_sq_sum"], np.float64) / n, 0.0)
                             - mean ** 2, 0.0))
    share = np.append(np.asarray(sums["below"], np.float64) / n, 1.0)
    first = np.asarray(sums["first"], np.float64) / n
    depths = np.arange(1, N + 1)
    half = int(depths[np.argmax(share >= HALF)])  # the last depth always qualifies
    exits = np.arange(1, K) * L - 1  # loop boundaries before the last, as depth indices
    first_mean = float(np.sum(first * depths) / N)
    note = (f"half the tokens within {BELOW} bits of the final distribution from depth {half} "
            f"of {N} ({half / N:.2f} of the depth); a token first converges at "
            f"{first_mean:.2f} of the depth on average")
    if K > 1:
        note += f"; mean JSD at the end of loop 1: {mean[L - 1]:.3f} bits"
    return {
        "n_loops": K, "layers_per_loop": L, "depths": depths.tolist(),
        "loop_boundaries": [k * L for k in range(1, K + 1)],
        "depth_mean": mean.tolist(), "depth_std": std.tolist(), "depth_share_below": share.tolist(),
        "first_converged_share": first.tolist(),
        "converged_half_depth": half, "converged_half_fraction": half / N,
        "first_converged_fraction_mean": first_mean,
        "exits": list(range(1, K)), "mean": mean[exits].tolist(), "std": std[exits].tolist(),
        "share_below": share[exits].tolist(),
        **({"mean_first_exit": float(mean[L - 1])} if K > 1 else {}),
        "below": BELOW, "tokens": float(sums["weight"]), "note": note,
    }


def jsd(run: Loaded) -> dict:
    """Per depth 1 .. K*L, and per loop exit 1 .. K-1 (the module docstring)."""
    m = run.config.model
    if m.n_loops * m.n_unique < 2:  # one layer run once: the final distribution is all there is
        zero = {"js_sum": np.zeros(0), "js_sq_sum": np.zeros(0), "below": np.zeros(0),
                "first": np.ones(1), "weight": 0.0}
        return summarise(zero, m.n_loops, m.n_unique)
    return summarise(run.sums(jsd_step), m.n_loops, m.n_unique)


def plot_jsd(result: dict, title: str):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    depths = np.asarray(result["depths"])
    mean, std = np.asarray(result["depth_mean"]), np.asarray(result["depth_std"])
    ax.plot(depths, mean, marker="o", ms=3, label="mean JSD")
    ax.fill_between(depths, np.maximum(mean - std, 0), np.minimum(mean + std, 1), alpha=0.2,
                    label="± 1 std")
    ax.plot(depths, result["depth_share_below"], ls="--", marker=".", ms=3,
            label=f"share below {result['below']} bits")
    for k, boundary in enumerate(result["loop_boundaries"][:-1]):
        ax.axvline(boundary + 0.5, color="grey", lw=0.8, ls=":",
                   label="loop boundary" if k == 0 else None)
    ax.axvline(result["converged_half_depth"], color="C3", lw=0.8,
               label="half the tokens converged")
    ax.set(xlabel="depth (layers run, all loops)", ylabel="JSD to the final depth (bits) / share",
           ylim=(0, 1.02), xlim=(0.5, depths[-1] + 0.5), title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    return fig
