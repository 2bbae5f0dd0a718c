"""`loopscale eval --what=lens`: the logit lens on permutation traversal (PAPERS.md section 3).

The stream after every layer of every loop of the core, at the answer position of held-out
examples, is read out as the early exits are: through the coda when the model has one
(`LoopedLM.through_coda`, on whole sequences), then the model's own final norm and unembedding
(`LoopedLM.readout`); for each hop j the share of examples whose argmax is the node after hop j, over all
examples and per walk length (ladder.py: points, hops, matched points, the summary and its
scores). A model that walks the permutation one hop per loop shows a diagonal ladder on the
iteration x hop map.

The ladder is read only off a run that answers: when the final answer accuracy is not clearly
above chance and the shortcut on the same examples (ladder.at_chance_reason), lens.json says
`at_chance` with the reason, its best hops and ladder scalars are None and the figure draws no
heat map. Whether the run was trained with intermediate supervision (whose loss puts hop j's
node at loop boundary j: a ladder it was taught, not one it found) is recorded beside.

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
    """How often each point names the node after each hop (over all examples and per walk
    length), the start and the answer; how often the shortcut (the start) is the answer."""
    hit_KxLxBxH = pred_KxLxB[..., None] == batch["hop_labels"]
    return {**ladder.hit_counts(hit_KxLxBxH, batch["hop_mask"], batch["hops"]),
            "start": jnp.sum(pred_KxLxB == batch["start"], axis=-1),
            "answer": jnp.sum(pred_KxLxB == batch["answer"], axis=-1),
            "shortcut": jnp.sum(batch["start"] == batch["answer"]),
            "examples": jnp.asarray(pred_KxLxB.shape[-1])}


def lens_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int) -> dict:
    del train  # one position per example: no micro-batches or vocabulary chunks needed
    stream_KxLxBxD = ladder.answer_stream(params, batch["inputs"], batch["answer_pos"], model,
                                          n_loops, through_coda=True)
    return counts(decode(params, stream_KxLxBxD, model), batch)


def table(sums: dict, n_nodes: int, every: int) -> dict:
    """The summed counts -> lens.json's figures (matched points every `every` layers). Beside
    the hops: `start_iteration` and `answer_iteration`, the share of examples each loop
    boundary names the start node / the answer with (`final_answer`: the last one's, the
    model's accuracy; `final_answer_low`: the lower end of its 95% interval), `shortcut` (the
    share whose start is the answer), `chance` (1/n), and the at-chance verdict."""
    examples = int(sums["examples"])
    right_K = np.asarray(sums["answer"])[:, -1]
    shortcut = int(sums["shortcut"]) / max(examples, 1)
    chance = 1.0 / n_nodes
    reason = ladder.at_chance_reason(int(right_K[-1]), examples, chance, shortcut)
    return {**ladder.summary(ladder.Rates.from_counts(sums), every, reason),
            "examples": examples, "chance": chance, "shortcut": shortcut,
            "start_iteration": (np.asarray(sums["start"])[:, -1] / max(examples, 1)).tolist(),
            "answer_iteration": (right_K / max(examples, 1)).tolist(),
            "final_answer": float(right_K[-1] / max(examples, 1)),
            "final_answer_low": ladder.answer_low(int(right_K[-1]), examples)}


def trained_as(run: Loaded) -> dict:
    """What lens.json and probes.json record of how the run was trained."""
    c = run.config
    return {"n_loops": c.model.n_loops, "n_unique": c.model.n_unique,
            "intermediate_supervision": c.train.intermediate_supervision}


def lens(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "lens")
    every = ladder.matched_every(c.model, c.data)
    return {**trained_as(run), **table(run.sums(lens_step), c.data.n_nodes, every)}


def plot_lens(result: dict, title: str):
    return ladder.plot([("logit lens", result)], title)
