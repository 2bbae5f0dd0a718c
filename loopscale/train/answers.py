"""The permutation-traversal task's answers (data/permutation.py): what the model answers at
the answer position, at every loop exit, on held-out permutations (never trained on: the task
splits permutations by hash).

`answer_step` returns each example's argmax at the answer position per loop exit, (K, B);
`accuracy_sums` compares them with the answers on the devices, per hop count, beside the
shortcut (answering the start node, right exactly when its cycle length divides H).
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
    out = model.apply({"params": params}, batch["inputs"], n_loops=n_loops, readout=False,
                      all_exits=True)
    pos_B = batch["answer_pos"]
    hidden_KxBxD = out.exit_hidden[:, jnp.arange(pos_B.shape[0]), pos_B]
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


def accuracy_sums(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int,
                  hops_max: int) -> dict[str, jax.Array]:
    """`loopscale eval --what=accuracy`'s counts over a batch, summed on the devices (so every
    process gets the global figures): right answers per loop exit, and per hop count h
    (0 .. hops_max) the examples, right final answers and right shortcuts."""
    right_KxB = answer_step(params, batch, model=model, train=train, n_loops=n_loops) == \
        batch["answer"]
    hop_BxH = jax.nn.one_hot(batch["hops"], hops_max + 1, dtype=jnp.int32)
    shortcut_B = (batch["start"] == batch["answer"]).astype(jnp.int32)
    return {"right_per_exit": jnp.sum(right_KxB, axis=1),
            "examples_per_hop": jnp.sum(hop_BxH, axis=0),
            "right_per_hop": right_KxB[-1].astype(jnp.int32) @ hop_BxH,
            "shortcut_per_hop": shortcut_B @ hop_BxH}


def accuracy_table(sums: dict) -> dict:
    """Accuracy overall and per hop count (final exit), per loop exit, beside the shortcut."""
    examples_H = np.asarray(sums["examples_per_hop"])
    right_H, shortcut_H = np.asarray(sums["right_per_hop"]), np.asarray(sums["shortcut_per_hop"])
    n = max(int(examples_H.sum()), 1)
    per_hop = {str(h): {"examples": int(examples_H[h]),
                        "accuracy": float(right_H[h] / examples_H[h]),
                        "shortcut": float(shortcut_H[h] / examples_H[h])}
               for h in np.nonzero(examples_H)[0]}
    return {"accuracy": float(right_H.sum() / n), "shortcut": float(shortcut_H.sum() / n),
            "examples": int(examples_H.sum()),
            "accuracy_per_exit": (np.asarray(sums["right_per_exit"]) / n).tolist(),
            "per_hop": per_hop}
