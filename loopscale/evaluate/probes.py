"""`loopscale eval --what=probes`: linear probes of the permutation walk (PAPERS.md section 3).

For every layer of every loop (ladder.py's points) and every hop j, a multinomial logistic
regression from the stream at the answer position to the node after hop j (probe_fit.py). The
held-out examples (permutations training never sees) are cut in two: the probes are fitted on
the first half and scored on the second, so an accuracy is that of unseen examples and unseen
permutations. The logit lens is read on the scoring half too (`lens`), for the two maps side by
side on the same examples.

The streams are gathered whole (replicated from the run's mesh) and the probes fitted on the
host's default device; every process fits the same probes, and process 0 writes. Tested on one
process only.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.errors import UsageError
from loopscale.evaluate import ladder, lens, probe_fit
from loopscale.model import LoopedLM
from loopscale.parallel import mesh as mesh_lib

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

SETTINGS = probe_fit.ProbeSettings()
FIELDS = ("hop_labels", "hop_mask", "start", "answer")  # what probes and lens read of a batch


def probe_step(params, batch, *, model: LoopedLM, n_loops: int) -> dict:
    """The stream at every point (K, L, B, D) in float32, the lens's argmax there, and the
    batch's labels."""
    stream_KxLxBxD = ladder.answer_stream(params, batch["inputs"], batch["answer_pos"], model,
                                          n_loops)
    return {"stream": stream_KxLxBxD.astype(jnp.float32),
            "lens": lens.decode(params, stream_KxLxBxD, model),
            **{k: batch[k] for k in FIELDS}}


def gather(run: Loaded) -> dict[str, np.ndarray]:
    """probe_step's outputs over the held-out batches, whole on every process; examples on the
    axis the batch's rows were on."""
    params_sharding, batch_sharding = run._shardings()
    whole = jax.sharding.NamedSharding(run.mesh, jax.sharding.PartitionSpec())
    step = jax.jit(functools.partial(probe_step, model=run.model, n_loops=run.config.model.n_loops),
                   in_shardings=(params_sharding, batch_sharding), out_shardings=whole)
    parts = []
    with mesh_lib.activate(run.mesh):
        for local in run._held_out().iterator():
            batch = {k: local[k] for k in ("inputs", "answer_pos", *FIELDS)}
            parts.append(jax.device_get(step(run.params, mesh_lib.global_batch(batch, batch_sharding))))
    axis = {"stream": 2, "lens": 2}
    return {k: np.concatenate([p[k] for p in parts], axis=axis.get(k, 0)) for k in parts[0]}


def measure(data: dict[str, np.ndarray], n_nodes: int,
            settings: probe_fit.ProbeSettings = SETTINGS) -> dict:
    """Fits on the first half of the examples, scores on the second: probes.json's figures."""
    K, L, N, D = data["stream"].shape
    if N < 2:
        raise UsageError(f"--what=probes needs at least 2 held-out examples, got {N}")
    x_PxNxD = data["stream"].reshape(K * L, N, D)
    y_NxH, m_NxH = data["hop_labels"], data["hop_mask"]
    fit, score = slice(0, N // 2), slice(N // 2, N)
    probes = probe_fit.fit(x_PxNxD[:, fit], y_NxH[fit], m_NxH[fit], n_classes=n_nodes,
                           settings=settings)
    acc_PxH, count_H = probe_fit.accuracy(probes, x_PxNxD[:, score], y_NxH[score], m_NxH[score])
    fit_acc_PxH, _ = probe_fit.accuracy(probes, x_PxNxD[:, fit], y_NxH[fit], m_NxH[fit])
    H = y_NxH.shape[1]
    lens_counts = lens.counts(jnp.asarray(data["lens"][:, :, score]),
                              {k: jnp.asarray(data[k][score]) for k in FIELDS})
    return {**ladder.summary(np.asarray(acc_PxH).reshape(K, L, H), np.asarray(count_H)),
            "fit_layer": np.asarray(fit_acc_PxH).tolist(),
            "examples": N, "fit_examples": N // 2, "score_examples": N - N // 2,
            "chance": 1.0 / n_nodes, "steps": settings.steps, "l2": settings.l2,
            "lens": lens.table(jax.device_get(lens_counts), n_nodes)}


def probes(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "probes")
    return {"n_loops": c.model.n_loops, **measure(gather(run), c.data.n_nodes)}


def plot_probes(result: dict, title: str):
    return ladder.plot([("linear probe", result), ("logit lens, same examples", result["lens"])],
                       title)
