"""`loopscale eval --what=act_grads`: the FLT study's activation-gradient norms (PAPERS.md
section 1) of a trained run, on its held-out batches.

At each loop t and layer l, ||dL/dx_l^(t)||: the gradient of the training objective
(train/step.py `loss_fn`, with intermediate supervision's labels where the run trains with
them) with respect to the stream at the end of that layer, taken as the gradient with respect
to a zero `add` of the model's stream hook (train/step.act_grad_norms). The norm is the FLT
authors' (scripts/base_check.py, their per-loop backward hooks on each block's output): the L2
norm over the whole (B, T, D) gradient tensor of one micro-batch of the train step (B =
train.batch_size / train.grad_accum), the loss that micro-batch's own mean. Reported per loop
boundary (`per_loop`, the last layer's) and per layer (`per_layer`, K x L), each the mean over
every micro-batch of the held-out batches. Growing norms toward the early loops are the
gradient explosion through the unrolled loops; vanishing ones, the collapse.

`loopscale train --config.train.log_act_grads=True` logs the same figure on the training
batches (metrics `act_grad_norm`, `act_grad_norm_layer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from loopscale.config import DataSource
from loopscale.config.schema import TrainConfig
from loopscale.data import permutation
from loopscale.train.eval_loss import summed_over_micro_batches
from loopscale.model import LoopedLM
from loopscale.train.step import act_grad_norms

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

NORM = ("L2 norm of dL/dx over the whole (B, T, D) tensor of one micro-batch (the FLT "
        "authors' per-loop block-output gradient), L its own mean training objective; mean "
        "over micro-batches")


def act_grad_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int) -> dict:
    """Per-(loop, layer) norms summed over the batch's micro-batches, and their count."""
    def sums(micro):
        return {"norm_sum": act_grad_norms(params, micro, model=model, train=train,
                                           n_loops=n_loops),
                "micro_batches": jnp.ones((), jnp.float32)}

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def act_grads(run: Loaded) -> dict:
    c = run.config
    K, L = c.model.n_loops, c.model.n_unique
    prepare = None
    if c.train.intermediate_supervision and c.data.source is DataSource.PERMUTATION:
        def prepare(i, local):
            return {**local, **permutation.supervision_labels(local, K, L)}
    s = run.sums(act_grad_step, prepare=prepare)
    count = float(s["micro_batches"])
    mean_KxL = np.asarray(s["norm_sum"], np.float64) / count
    return {"n_loops": K, "layers_per_loop": L, "norm": NORM, "micro_batches": count,
            "micro_batch_size": c.train.batch_size // c.train.grad_accum,
            "per_loop": mean_KxL[:, -1].tolist(), "per_layer": mean_KxL.tolist(),
            "first_loop": float(mean_KxL[0, -1]), "last_loop": float(mean_KxL[-1, -1]),
            "first_over_last": float(mean_KxL[0, -1] / mean_KxL[-1, -1])
            if mean_KxL[-1, -1] > 0 else None}


def plot_act_grads(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    per_layer = np.asarray(result["per_layer"])
    K, L = per_layer.shape
    depth = np.arange(1, K * L + 1)
    ax.plot(depth, per_layer.reshape(-1), marker=".", label="every layer")
    ax.plot(depth[L - 1::L], result["per_loop"], "o", label="loop boundary")
    ax.set(xlabel="depth (layers, all loops)", ylabel="||dL/dx|| per micro-batch", yscale="log",
           title=title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
