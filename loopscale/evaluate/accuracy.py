"""Permutation traversal: final-answer accuracy overall, per hop count and per loop exit, beside
the shortcut's (answering the start node); the counts are train/answers.py's."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from loopscale.data import permutation
from loopscale.evaluate import ladder
from loopscale.train.answers import accuracy_sums, accuracy_table

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded


def accuracy(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "accuracy")
    sums = run.sums(functools.partial(accuracy_sums, hops_max=c.data.hops_max))
    return {"n_loops": c.model.n_loops, "shortcut_expected": permutation.shortcut_probability(
        c.data.n_nodes, c.data.hops_min, c.data.hops_max), **accuracy_table(sums)}


def plot_accuracy(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    hops = sorted(result["per_hop"], key=int)
    x = np.arange(len(hops))
    ax.bar(x - 0.2, [result["per_hop"][h]["accuracy"] for h in hops], 0.4, label="model")
    ax.bar(x + 0.2, [result["per_hop"][h]["shortcut"] for h in hops], 0.4, label="shortcut")
    ax.set(xticks=x, xticklabels=hops, xlabel="hops", ylabel="answer accuracy", ylim=(0, 1),
           title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
