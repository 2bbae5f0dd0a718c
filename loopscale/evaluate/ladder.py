"""What the logit lens and the linear probes share (PAPERS.md section 3, the ladder): the
residual stream after every layer of every loop at the answer position of the permutation
task, the summary of a (point x hop) matrix of decoding rates, and its heat map.

Points: the stream after layer l of loop k is point (k, l), k = 1..K, l = 1..L; its depth is
(k - 1) * L + l. Loop boundary k is point (k, L), the stream the next loop starts from (before
the final norm). Hops: column j = 1..H_max holds the node after hop j (data/permutation.py's
hop_labels), counted only over examples whose walk has a hop j (hop_mask).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config import Config
from loopscale.errors import UsageError
from loopscale.model import LoopedLM


def require_permutation(config: Config, what: str) -> None:
    if config.data.source.value != "permutation":
        raise UsageError(f"--what={what} needs the permutation task; {config.name} trains on "
                         f"data.source={config.data.source.value}")


def answer_stream(params, inputs_BxT: jax.Array, pos_B: jax.Array, model: LoopedLM,
                  n_loops: int) -> jax.Array:
    """(K, L, B, D): the stream after every layer of every loop at each row's answer position."""
    collecting = model.clone(collect_layers=True)  # the same parameters, every layer kept
    out = collecting.apply({"params": params}, inputs_BxT, n_loops=n_loops, readout=False)
    return out.layer_hidden[:, :, jnp.arange(pos_B.shape[0]), pos_B]


def summary(share_KxLxH: np.ndarray, count_H: np.ndarray) -> dict:
    """The matrices per iteration (loop boundaries) and per layer, each iteration's best hop,
    and the ladder's scalars:

    best_hop     per iteration, the hop whose node it names most often (rate over the examples
                 that have that hop; 0 when no hop has any example)
    ladder_match the share of iterations k = 1 .. min(K, H_max) whose best hop is k (1.0: a
                 clean one-hop-per-iteration ladder)
    diagonal     the mean rate of iteration k naming hop k over those iterations
    """
    K, L, H = share_KxLxH.shape
    iteration_KxH = share_KxLxH[:, -1]
    present_H = np.asarray(count_H) > 0
    ranked_KxH = np.where(present_H[None], iteration_KxH, -1.0)
    best_K = np.where(present_H.any(), np.argmax(ranked_KxH, axis=1) + 1, 0)
    n = min(K, H)
    diag = [iteration_KxH[k, k] for k in range(n)]
    return {
        "hops": list(range(1, H + 1)), "iterations": list(range(1, K + 1)),
        "depths": list(range(1, K * L + 1)), "layers_per_loop": L,
        "hop_examples": [int(c) for c in count_H],
        "iteration": iteration_KxH.tolist(), "layer": share_KxLxH.reshape(K * L, H).tolist(),
        "best_hop": best_K.tolist(),
        "ladder_match": float(np.mean(best_K[:n] == np.arange(1, n + 1))),
        "diagonal": float(np.mean(diag)),
    }


def plot(rows: list[tuple[str, dict]], title: str):
    """Heat maps, iteration x hop beside depth x hop, one row per (name, `summary` dict)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(rows), 2, figsize=(9, 3.6 * len(rows)), squeeze=False,
                             gridspec_kw={"width_ratios": (1, 1.3)})
    for (name, result), (ax_it, ax_depth) in zip(rows, axes):
        n_hops = len(result["hops"])
        for ax, key, ylabel in ((ax_it, "iteration", "loop iteration"),
                                (ax_depth, "layer", "depth (layers, all loops)")):
            matrix = np.asarray(result[key], float)
            image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis", aspect="auto",
                              origin="lower", extent=(0.5, n_hops + 0.5, 0.5, len(matrix) + 0.5))
            ax.set(xlabel="hop j (the node after j hops)", ylabel=ylabel, title=f"{name}: {key}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax_it.plot(result["best_hop"], result["iterations"], "o", color="red", ms=4,
                   label="best hop")
        ax_it.legend(fontsize="x-small", loc="upper left")
        for k in result["iterations"][:-1]:  # the loop boundaries on the depth panel
            ax_depth.axhline(k * result["layers_per_loop"] + 0.5, color="white", lw=0.6)
        fig.colorbar(image, ax=ax_depth, label="share naming the node")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig
