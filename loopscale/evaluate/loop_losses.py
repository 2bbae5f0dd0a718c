"""Held-out loss and perplexity at every loop exit (`ppl`) and at inference loop counts other
than the trained one (`loops`: 1 .. 2K), with their figures."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded


def _ppl(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def ppl(run: Loaded) -> dict:
    per_exit, tokens = run.loss_per_exit(run.config.model.n_loops)
    return {"loss": per_exit[-1], "ppl": _ppl(per_exit[-1]), "n_loops": run.config.model.n_loops,
            "loss_per_exit": per_exit, "ppl_per_exit": [_ppl(x) for x in per_exit],
            "tokens": tokens}


def loops(run: Loaded) -> dict:
    """Loop counts 1 .. 2K: the looped block run fewer or more times than it was trained for
    (a model without loops, K = 1, runs its whole stack once or twice)."""
    trained = run.config.model.n_loops
    counts = list(range(1, 2 * trained + 1))
    losses = [run.loss_per_exit(k)[0][-1] for k in counts]
    return {"trained_loops": trained, "loop_counts": counts, "loss": losses,
            "ppl": [_ppl(x) for x in losses],
            "loss_at_trained": losses[trained - 1]}


def plot_ppl(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    exits = range(1, len(result["ppl_per_exit"]) + 1)
    ax.plot(list(exits), result["ppl_per_exit"], marker="o")
    ax.set(xlabel="loop exit", ylabel="held-out perplexity", yscale="log", title=title)
    fig.tight_layout()
    return fig


def plot_loops(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(result["loop_counts"], result["ppl"], marker="o")
    ax.axvline(result["trained_loops"], color="grey", linestyle=":", label="trained")
    ax.set(xlabel="inference loop count", ylabel="held-out perplexity", yscale="log",
           title=title)
    ax.legend()
    fig.tight_layout()
    return fig
