"""MoE routing across loop passes on held-out tokens (the sparse-layers study's question: does
a weight-shared MoE layer send a token to the same experts on every pass?).

`routing_step` returns sums over a batch's tokens, per physical layer of the looped core
(numbered after a prelude's layers; a prelude's or coda's layer runs once, with no pass to
compare, and routing.json's `parts` gives only its share of assignments per expert): how many tokens' top-k
sets on consecutive passes are identical, overlap, or are disjoint (summed over the K-1 pass
pairs), how many distinct experts each token uses across all K passes, and the assignments per
(pass, layer, expert). The training metric `route_*` (train/diagnostics.py) is the same
comparison averaged over layers on training batches.

Beside the measured shares, the random-routing baseline (`random_overlap`): the shares a router
choosing its top-k of E experts uniformly at random and independently on each pass would give.
Two such sets share j experts with the hypergeometric probability C(k, j) C(E-k, k-j) / C(E, k):
identical is j = k, disjoint j = 0, partial the rest (top-2 of 8: 1/28 = 3.6%, 12/28 = 42.9%,
15/28 = 53.6%). A token's expected distinct experts over K such passes is E (1 - (1 - k/E)^K).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import FFNKind, TrainConfig
from loopscale.errors import UsageError
from loopscale.model import LoopedLM
from loopscale.train.eval_loss import summed_over_micro_batches

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded


def random_overlap(top_k: int, n_experts: int) -> dict[str, float]:
    """Shares of two independent uniform top-k sets of `n_experts` that are identical, overlap
    in part, or are disjoint (hypergeometric: the module docstring), exactly."""
    k, E = top_k, n_experts
    sets = math.comb(E, k)
    shared = [math.comb(k, j) * math.comb(E - k, k - j) / sets for j in range(k + 1)]
    return {"identical": shared[k], "partial": sum(shared[1:k]), "disjoint": shared[0]}


def random_unique_experts(top_k: int, n_experts: int, n_loops: int) -> float:
    """Expected distinct experts a token uses over `n_loops` independent uniform top-k passes:
    each expert is missed by a pass with probability 1 - k/E."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** n_loops)


def _shares(load: np.ndarray) -> np.ndarray:
    """Assignments per expert -> each expert's share of them (over the last axis)."""
    return load / np.maximum(load.sum(-1, keepdims=True), 1.0)


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
            # The prelude's and coda's layers, one pass each: their assignments per expert.
            **{f"load_{name}": jnp.einsum(
                "lbtje,bt->le", jax.nn.one_hot(part["experts"], cfg.n_experts), mask)
               for name, part in (out.moe_parts or {}).items()},
        }

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def routing(run: Loaded) -> dict:
    """Per physical layer, consecutive loop passes compared (a model without loops has no pair
    to compare: refused, rather than reporting shares of zero pairs)."""
    m = run.config.model
    if m.ffn is not FFNKind.MOE:
        raise UsageError(f"--what=routing needs an MoE model; {run.config.name} has "
                         f"model.ffn={m.ffn.value}")
    if m.n_loops < 2:
        raise UsageError(f"--what=routing compares a token's experts across loop passes; "
                         f"{run.config.name} has model.n_loops={m.n_loops}")
    s = run.sums(routing_step)
    pairs = np.maximum(np.asarray(s["pairs"]), 1.0)
    identical, disjoint = np.asarray(s["identical"]) / pairs, np.asarray(s["disjoint"]) / pairs
    share = _shares(np.asarray(s["load"]))  # (K, L, E)
    unique = np.asarray(s["unique_sum"]) / max(float(s["weight"]), 1.0)
    chance = random_overlap(m.top_k, m.n_experts)
    partial = 1 - identical - disjoint
    shares = "; ".join(f"{key} {measured:.1%} (random {chance[key]:.1%})" for key, measured in
                       (("identical", identical.mean()), ("partial", partial.mean()),
                        ("disjoint", disjoint.mean())))
    # The core's layers, numbered as the model's physical layers (after the prelude's): the
    # prelude's and coda's run once per token, with no second pass to compare.
    first = m.n_prelude + 1
    # Their layers in the same numbering: the prelude's first, the coda's after the core's.
    numbers = {"prelude": range(1, first), "coda": range(first + m.n_unique,
                                                         first + m.n_unique + m.n_coda)}
    parts = {name: {"layers": list(numbers[name]),
                    "load": _shares(np.asarray(s[f"load_{name}"])).tolist()}
             for name in ("prelude", "coda") if f"load_{name}" in s}
    return {"n_loops": m.n_loops, "layers": list(range(first, first + m.n_unique)),
            "n_prelude": m.n_prelude, "n_coda": m.n_coda, "parts": parts, "top_k": m.top_k,
            "n_experts": m.n_experts,
            "identical": identical.tolist(), "partial": partial.tolist(),
            "disjoint": disjoint.tolist(), "unique_experts": unique.tolist(),
            "load_per_pass": share.tolist(), "tokens": float(s["weight"]),
            "identical_mean": float(identical.mean()), "disjoint_mean": float(disjoint.mean()),
            "partial_mean": float(partial.mean()), "unique_experts_mean": float(unique.mean()),
            **{f"random_{key}": value for key, value in chance.items()},
            "random_unique_experts": random_unique_experts(m.top_k, m.n_experts, m.n_loops),
            "note": f"consecutive passes, mean over layers: {shares}; random routing is top-"
                    f"{m.top_k} of {m.n_experts} drawn uniformly and independently each pass"}


def plot_routing(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    layers = np.asarray(result["layers"])
    at = len(layers) + 1.5  # the random baseline's bar, a little apart from the layers'
    bottom, chance_bottom = np.zeros(len(layers)), 0.0
    for i, key in enumerate(("identical", "partial", "disjoint")):
        ax.bar(layers, result[key], bottom=bottom, color=f"C{i}", label=key)
        bottom += np.asarray(result[key])
        ax.bar([at], [result[f"random_{key}"]], bottom=chance_bottom, color=f"C{i}", alpha=0.5,
               hatch="//", edgecolor="white")
        chance_bottom += result[f"random_{key}"]
        if key != "disjoint":  # the random boundaries carried across the layers' bars
            ax.hlines(chance_bottom, layers[0] - 0.4, at + 0.4, colors="black", lw=0.7, ls="--",
                      label="random routing" if key == "identical" else None)
    ax.set_xticks([*layers, at], [*map(str, layers), "random"])
    ax.set(xlabel=f"physical layer (random: top-{result['top_k']} of {result['n_experts']} "
                  f"uniformly per pass)", ylabel="share of tokens, consecutive passes",
           ylim=(0, 1), title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
