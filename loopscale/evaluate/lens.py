"""`loopscale eval --what=lens`: the logit lens on permutation traversal (PAPERS.md section 3).

The stream after every layer of every loop, at the answer position of held-out examples, is
read out through the model's own final norm and unembedding (`LoopedLM.readout`, as the early
exits are); for each hop j the share of examples whose argmax is the node after hop j
(ladder.py: points, hops, the summary). A model that walks the permutation one hop per loop
shows a diagonal ladder on the iteration x hop map.

The counts are summed on the devices (`Loaded.sums`), so every process gets the global figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import TrainConfig
from loopscale.evaluate import ladder
from loopscale.model import LoopedLM
from loopscale.train.step import readout_fn

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded


def decode(params, stream_xBxD: jax.Array, model: LoopedLM) -> jax.Array:
    """The argmax of the model's own readout (final norm, unembedding, soft cap) of a stream."""
    return jnp.argmax(readout_fn(model, params, lead=("act_batch",))(stream_xBxD), axis=-1)


def counts(pred_KxLxB: jax.Array, batch) -> dict[str, jax.Array]:
    """How often each point names the node after each hop, the start and the answer."""
    labels_BxH, mask_BxH = batch["hop_labels"], batch["hop_mask"]
    hit_KxLxBxH = (pred_KxLxB[..., None] == labels_BxH) & mask_BxH
    return {"hits": jnp.sum(hit_KxLxBxH, axis=2), "hop_examples": jnp.sum(mask_BxH, axis=0),
            "start": jnp.sum(pred_KxLxB == batch["start"], axis=-1),
            "answer": jnp.sum(pred_KxLxB == batch["answer"], axis=-1),
            "examples": jnp.asarray(pred_KxLxB.shape[-1])}


def lens_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int) -> dict:
    del train  # one position per example: no micro-batches or vocabulary chunks needed
    stream_KxLxBxD = ladder.answer_stream(params, batch["inputs"], batch["answer_pos"], model,
                                          n_loops)
    return counts(decode(params, stream_KxLxBxD, model), batch)


def table(sums: dict, n_nodes: int) -> dict:
    """The summed counts -> lens.json's figures. Beside the hops: `start_iteration` and
    `answer_iteration`, the share of examples each loop boundary names the start node / the
    answer with (`final_answer`: the last one's, the model's accuracy), and `chance` (1/n)."""
    count_H = np.asarray(sums["hop_examples"])
    share_KxLxH = np.asarray(sums["hits"]) / np.maximum(count_H, 1)
    examples = max(int(sums["examples"]), 1)
    answer_K = (np.asarray(sums["answer"])[:, -1] / examples)
    return {**ladder.summary(share_KxLxH, count_H), "examples": int(sums["examples"]),
            "chance": 1.0 / n_nodes,
            "start_iteration": (np.asarray(sums["start"])[:, -1] / examples).tolist(),
            "answer_iteration": answer_K.tolist(), "final_answer": float(answer_K[-1])}


def lens(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "lens")
    return {"n_loops": c.model.n_loops, **table(run.sums(lens_step), c.data.n_nodes)}


def plot_lens(result: dict, title: str):
    return ladder.plot([("logit lens", result)], title)
