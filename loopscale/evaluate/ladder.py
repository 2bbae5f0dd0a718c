"""What the logit lens and the linear probes share (PAPERS.md section 3, the ladder): the
residual stream after every layer of every loop at the answer position of the permutation
task, the hit counts and rates of a (point x hop) readout, their summary and its heat maps.

Points: the stream after layer l of loop k is point (k, l), k = 1..K, l = 1..L; its depth is
(k - 1) * L + l. Loop boundary k is point (k, L), the stream the next loop starts from (before
the final norm). Hops: column j = 1..H_max holds the node after hop j (data/permutation.py's
hop_labels), counted only over examples whose walk has a hop j (hop_mask). Walks: the same
rates over the examples whose walk has exactly H hops, for each H present.

Matched points put a looped model and an unshared one on one axis: matched point k is depth
k * every. A looped n_unique x K model is matched at its loop boundaries (every = n_unique); an
unshared stack of n_unique * K layers, at every n_unique-th layer, where its layer k * n_unique
corresponds to the looped model's loop boundary k (`matched` re-reads a result at another
`every`, for the looped partner the unshared run does not know of).

The ladder is scored on the matched points: the Spearman rank correlation of k with its best
hop (1: the best hop only grows with k), and the mean distance of the best hop from k * H / M
(M matched points, per walk length H: where a ladder that spreads an H-hop walk evenly over its
iterations stands after k of them, so a ladder that adapts to its iteration count scores 0
whatever H is; 0 exactly only where k * H / M is whole). None of it is scored when the run's
answers are not clearly above chance and the shortcut (`at_chance_reason`): the rates of an
untrained model are noise, and its "best hop" would read as a ladder.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from loopscale.config import Config, DataSource
from loopscale.config.schema import DataConfig, ModelConfig
from loopscale.errors import UsageError
from loopscale.model import LoopedLM

CONFIDENCE = 0.95  # the binomial interval of the final answer accuracy that must clear chance


def require_permutation(config: Config, what: str) -> None:
    if config.data.source is not DataSource.PERMUTATION:
        raise UsageError(f"--what={what} needs the permutation task; {config.name} trains on "
                         f"data.source={config.data.source.value}")


def answer_stream(params, inputs_BxT: jax.Array, pos_B: jax.Array, model: LoopedLM,
                  n_loops: int, through_coda: bool = False) -> jax.Array:
    """(K, L, B, D): the stream after every layer of every loop of the core at each row's
    answer position; `through_coda`: each stream passed through the coda first (the identity
    without one), as the model's exits read it."""
    collecting = model.clone(collect_layers=True)  # the same parameters, every layer kept
    out = collecting.apply({"params": params}, inputs_BxT, n_loops=n_loops, readout=False)
    hidden = out.layer_hidden
    if through_coda:
        hidden = collecting.apply({"params": params}, hidden, method=LoopedLM.through_coda)
    return hidden[:, :, jnp.arange(pos_B.shape[0]), pos_B]


def matched_every(model: ModelConfig, data: DataConfig) -> int:
    """Layers per matched point by default: a looped model's loop (its own boundaries); for an
    unshared stack (one loop), depth / hops_max where that is whole (the depths intermediate
    supervision reads, data/permutation.py `layer_labels`: every 4th of 32 layers for 8 hops,
    the loop boundaries of the study's looped 4 x 8), else every layer."""
    if model.n_loops > 1:
        return model.n_unique
    return model.n_unique // data.hops_max if model.n_unique % data.hops_max == 0 else 1


def hit_counts(hit_KxLxBxH: jax.Array, mask_BxH: jax.Array, hops_B: jax.Array) -> dict:
    """A batch's readouts that name the node after each hop (`hit_KxLxBxH`, bool), counted over
    the examples with that hop, and per walk length (index g: walks of g + 1 hops)."""
    hit_KxLxBxH = hit_KxLxBxH & mask_BxH
    walk_BxG = jax.nn.one_hot(hops_B - 1, mask_BxH.shape[-1], dtype=jnp.int32)
    return {"hits": jnp.sum(hit_KxLxBxH, axis=2), "hop_examples": jnp.sum(mask_BxH, axis=0),
            "walk_hits": jnp.einsum("klbh,bg->klgh", hit_KxLxBxH.astype(jnp.int32), walk_BxG),
            "walk_examples": jnp.sum(walk_BxG, axis=0)}


@dataclasses.dataclass(frozen=True)
class Rates:
    """Decoding rates at every point: over the examples that have hop j, and over those whose
    walk has g + 1 hops (hops past a walk's end have no examples there: rate 0)."""

    hop_KxLxH: np.ndarray
    hop_examples_H: np.ndarray
    walk_KxLxGxH: np.ndarray
    walk_examples_G: np.ndarray

    @classmethod
    def from_counts(cls, sums: dict) -> Rates:
        """`hit_counts`'s sums (over batches) -> rates."""
        hop_H, walk_G = np.asarray(sums["hop_examples"]), np.asarray(sums["walk_examples"])
        return cls(np.asarray(sums["hits"]) / np.maximum(hop_H, 1), hop_H,
                   np.asarray(sums["walk_hits"]) / np.maximum(walk_G, 1)[:, None], walk_G)


def answer_low(right: int, examples: int) -> float:
    """The lower end of the exact (Clopper-Pearson) interval of an accuracy of right/examples."""
    if examples < 1:
        return 0.0
    return float(scipy.stats.binomtest(int(right), int(examples))
                 .proportion_ci(CONFIDENCE).low)


def at_chance_reason(right: int, examples: int, chance: float, shortcut: float) -> str | None:
    """Why the run's ladder is not scored, or None when its final answer accuracy is clearly
    above both chance (1/n) and the shortcut measured on the same examples (answering the start
    node): the lower end of its 95% binomial interval above the larger of the two."""
    floor = max(chance, shortcut)
    low = answer_low(right, examples)
    if low > floor:
        return None
    return (f"final answer accuracy {right / max(examples, 1):.3g} on {examples} examples (95% "
            f"interval from {low:.3g}) is not above max(chance {chance:.3g}, shortcut "
            f"{shortcut:.3g}) = {floor:.3g}")


def best_hops(rate_MxH: np.ndarray, present_H: np.ndarray) -> np.ndarray:
    """Per row, the hop (1-based) whose node it names most often among those with examples;
    0 where no hop has any."""
    ranked = np.where(present_H[None], rate_MxH, -1.0)
    return np.where(present_H.any(), np.argmax(ranked, axis=1) + 1, 0)


def rank_correlation(best_M: np.ndarray) -> float | None:
    """Spearman's rho of point k = 1..M with its best hop; None when either is constant (a
    single point, or one best hop throughout: rho is undefined)."""
    best_M = np.asarray(best_M)
    if len(best_M) < 2 or np.all(best_M == best_M[0]):
        return None
    return float(scipy.stats.spearmanr(np.arange(1, len(best_M) + 1), best_M).statistic)


def uniform_deviation(best_M: np.ndarray, hops: int) -> float:
    """Mean |best hop at point k - k * hops / M| over k = 1..M: 0 for a ladder that spreads an
    H-hop walk evenly over the M points."""
    M = len(best_M)
    return float(np.mean(np.abs(np.asarray(best_M) - np.arange(1, M + 1) * hops / M)))


def matched(layer_DxH, hop_examples_H, walk_DxGxH, walk_examples_G, every: int,
            scored: bool = True) -> dict:
    """The matched view of depth x hop rates: points k = 1..D/every at depth k * every, the
    rate per hop there, and (when scored) each point's best hop and the ladder's scores, over
    all examples and per walk length present."""
    layer_DxH, walk_DxGxH = np.asarray(layer_DxH, float), np.asarray(walk_DxGxH, float)
    depth = layer_DxH.shape[0]
    if every < 1 or depth % every:
        raise ValueError(f"matched points every {every} layers do not divide depth {depth}")
    at_M = np.arange(every - 1, depth, every)
    view = {"every": every, "points": list(range(1, len(at_M) + 1)),
            "depths": (at_M + 1).tolist(), "rate": layer_DxH[at_M].tolist()}
    if not scored:
        return {**view, "best_hop": None, "rank_correlation": None, "uniform_deviation": None,
                "walks": None}
    best_M = best_hops(layer_DxH[at_M], np.asarray(hop_examples_H) > 0)
    walks = {}
    for g in np.flatnonzero(np.asarray(walk_examples_G)):
        hops = int(g) + 1
        rate_MxJ = walk_DxGxH[at_M, g, :hops]  # hops past the walk's end: no examples
        best = best_hops(rate_MxJ, np.ones(hops, bool))
        walks[str(hops)] = {"examples": int(walk_examples_G[g]), "rate": rate_MxJ.tolist(),
                            "best_hop": best.tolist(), "rank_correlation": rank_correlation(best),
                            "deviation": uniform_deviation(best, hops)}
    deviations = [w["deviation"] for w in walks.values()]
    return {**view, "best_hop": best_M.tolist(), "rank_correlation": rank_correlation(best_M),
            "uniform_deviation": float(np.mean(deviations)) if deviations else None,
            "walks": walks}


def rematched(result: dict, every: int) -> dict:
    """`matched` of a `summary` dict (lens.json, probes.json) at another `every`: an unshared
    run's view at its looped partner's n_unique."""
    return matched(result["layer"], result["hop_examples"], result["walk_layer"],
                   result["walk_examples"], every, scored=not result["at_chance"])


def summary(rates: Rates, every: int, at_chance: str | None) -> dict:
    """The matrices per iteration (loop boundaries) and per layer, over all examples and per walk
    length; each iteration's best hop; the matched view (`matched`, points every `every`
    layers) and the ladder's scalars:

    best_hop     per iteration, the hop whose node it names most often (rate over the examples
                 that have that hop; 0 when no hop has any example)
    ladder_match the share of iterations k = 1 .. min(K, H_max) whose best hop is k (1.0: a
                 clean one-hop-per-iteration ladder)
    diagonal     the mean rate of iteration k naming hop k over those iterations
    rank_correlation, uniform_deviation  the matched view's (module docstring)

    `at_chance` (`at_chance_reason`'s verdict): when given, the rates are kept but every best
    hop and scalar is None.
    """
    share_KxLxH = rates.hop_KxLxH
    K, L, H = share_KxLxH.shape
    iteration_KxH = share_KxLxH[:, -1]
    layer_DxH = share_KxLxH.reshape(K * L, H)
    walk_DxGxH = rates.walk_KxLxGxH.reshape(K * L, *rates.walk_KxLxGxH.shape[2:])
    scored = at_chance is None
    view = matched(layer_DxH, rates.hop_examples_H, walk_DxGxH, rates.walk_examples_G, every,
                   scored)
    out = {
        "hops": list(range(1, H + 1)), "iterations": list(range(1, K + 1)),
        "depths": list(range(1, K * L + 1)), "layers_per_loop": L,
        "hop_examples": [int(c) for c in rates.hop_examples_H],
        "walk_examples": [int(c) for c in rates.walk_examples_G],
        "iteration": iteration_KxH.tolist(), "layer": layer_DxH.tolist(),
        "walk_layer": walk_DxGxH.tolist(),
        "at_chance": not scored, "at_chance_reason": at_chance, "matched": view,
        "best_hop": None, "ladder_match": None, "diagonal": None,
        "rank_correlation": view["rank_correlation"],
        "uniform_deviation": view["uniform_deviation"],
    }
    if scored:
        best_K = best_hops(iteration_KxH, rates.hop_examples_H > 0)
        n = min(K, H)
        out.update(best_hop=best_K.tolist(),
                   ladder_match=float(np.mean(best_K[:n] == np.arange(1, n + 1))),
                   diagonal=float(np.mean([iteration_KxH[k, k] for k in range(n)])))
    return out


def _heat_map(ax, matrix_PxH: np.ndarray):
    """Rates on [0, 1], points up and hops across, each cell centred on its 1-based index."""
    from matplotlib.ticker import MaxNLocator

    image = ax.imshow(matrix_PxH, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower",
                      extent=(0.5, matrix_PxH.shape[1] + 0.5, 0.5, len(matrix_PxH) + 0.5))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return image


def _not_drawn(ax, name: str, result: dict) -> None:
    ax.axis("off")
    ax.text(0.02, 0.5, f"{name}: at chance, no ladder drawn\n{result['at_chance_reason']}",
            fontsize="small", wrap=True, va="center", transform=ax.transAxes)


def plot(rows: list[tuple[str, dict]], title: str):
    """Heat maps, iteration x hop beside depth x hop, one row per (name, `summary` dict); a row
    at chance says so instead (its rates are noise)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 2, figsize=(9, 3.6 * len(rows)), squeeze=False,
                             gridspec_kw={"width_ratios": (1, 1.3)})
    for (name, result), (ax_it, ax_depth) in zip(rows, axes):
        if result.get("at_chance"):
            _not_drawn(ax_it, name, result)
            ax_depth.axis("off")
            continue
        for ax, key, ylabel in ((ax_it, "iteration", "loop iteration"),
                                (ax_depth, "layer", "depth (layers, all loops)")):
            image = _heat_map(ax, np.asarray(result[key], float))
            ax.set(xlabel="hop j (the node after j hops)", ylabel=ylabel, title=f"{name}: {key}")
        ax_it.plot(result["best_hop"], result["iterations"], "o", color="red", ms=4,
                   label="best hop")
        ax_it.legend(fontsize="x-small", loc="upper left")
        for k in result["iterations"][:-1]:  # the loop boundaries on the depth panel
            ax_depth.axhline(k * result["layers_per_loop"] + 0.5, color="white", lw=0.6)
        fig.colorbar(image, ax=ax_depth, label="share naming the node")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def plot_matched(rows: list[tuple[str, dict]], title: str):
    """Matched point x hop heat maps side by side, one panel per (name, `matched` view) scored,
    each point's best hop marked: a looped and an unshared ladder on the same axis."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows), 3.6), squeeze=False,
                             sharey=True)
    for (name, view), ax in zip(rows, axes[0]):
        image = _heat_map(ax, np.asarray(view["rate"], float))
        ax.plot(view["best_hop"], view["points"], "o", color="red", ms=4)
        ax.set(xlabel="hop j", title=f"{name}\n(depth k x {view['every']})")
    axes[0, 0].set_ylabel("matched point k")
    fig.colorbar(image, ax=axes[0, -1], label="share naming the node")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig
