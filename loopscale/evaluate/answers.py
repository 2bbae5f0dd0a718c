"""The permutation-traversal task's answers (data/permutation.py): what the model answers at
the answer position, at every loop exit, on held-out permutations (never trained on: the task
splits permutations by hash).

`answer_step` returns each example's argmax at the answer position per loop exit, (K, B); the
host compares them with the answers, per hop count, beside the shortcut (answering the start
node, right exactly when its cycle length divides H).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import TrainConfig
from loopscale.model import LoopedLM
from loopscale.train.step import readout_fn


def answer_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int) -> jax.Array:
    del train  # one position per example: no micro-batches or vocabulary chunks needed
    out = model.apply({"params": params}, batch["inputs"], n_loops=n_loops, readout=False)
    pos_B = batch["answer_pos"]
    hidden_KxBxD = out.loop_hidden[:, jnp.arange(pos_B.shape[0]), pos_B]
    logits_KxBxV = readout_fn(model, params, lead=(None, "act_batch"))(hidden_KxBxD)
    return jnp.argmax(logits_KxBxV, axis=-1)


def answer_sums(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
                ) -> dict[str, jax.Array]:
    """Right answers (final exit) and right shortcuts in a batch, summed on the devices (so
    every process gets the global counts): the trainer's `eval_accuracy`."""
    final_B = answer_step(params, batch, model=model, train=train, n_loops=n_loops)[-1]
    return {"right": jnp.sum(final_B == batch["answer"]),
            "shortcut": jnp.sum(batch["start"] == batch["answer"]),
            "count": jnp.asarray(batch["answer"].shape[0])}


def accuracy_table(predictions_KxN: np.ndarray, answer_N: np.ndarray, start_N: np.ndarray,
                   hops_N: np.ndarray) -> dict:
    """Accuracy overall and per hop count (final exit), per loop exit, beside the shortcut."""
    right = predictions_KxN == answer_N[None]
    shortcut = start_N == answer_N
    per_hop = {}
    for h in np.unique(hops_N):
        sel = hops_N == h
        per_hop[str(int(h))] = {"examples": int(sel.sum()), "accuracy": float(right[-1, sel].mean()),
                                "shortcut": float(shortcut[sel].mean())}
    return {"accuracy": float(right[-1].mean()), "shortcut": float(shortcut.mean()),
            "examples": int(answer_N.size), "accuracy_per_exit": right.mean(1).tolist(),
            "per_hop": per_hop}
