"""`loopscale eval --what=probes`: linear probes of the permutation walk (PAPERS.md section 3).

For every layer of every loop (ladder.py's points) and every hop j, a multinomial logistic
regression from the stream at the answer position to the node after hop j (probe_fit.py), its
L2 strength chosen per probe by cross-validation on the fitting examples.

Fitting examples: the task generator is free, so the probes are fitted on FIT_BATCHES batches
of their own (of the run's batch size) rather than on a share of the run's held-out ones: the
eval split (permutations training never sees) at the fixed seed FIT_SEED, the same examples for
every run of a task. FIT_SEED is 2**63, a seed no run trains with (the trainer's PRNGKey takes
a signed 64-bit one), so the fitting examples are never the run's held-out examples, whatever
its seed. The probes are scored on the run's held-out examples (`--batches` of them), where the
logit lens is read too (`lens`: the lens.json figures of the same batches), for the two maps
side by side on the same examples. Fitting and scoring examples are different draws; their
permutations differ too but for coincidences, which the eval split's size makes rare at 16
nodes (16!/16) and common at 8 (2520 permutations): `shared_permutations` is the share of
scoring examples whose permutation some fitting example has.

At chance (the lens's verdict on the scoring examples, ladder.at_chance_reason) the probes'
ladder is not scored either: `at_chance`, the reason, None for the best hops and scalars, no
heat maps.

The streams are gathered whole (replicated from the run's mesh) and the probes fitted on the
host's default device; every process fits the same probes, and process 0 writes. Tested on one
process only.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale import data as data_lib
from loopscale.errors import UsageError
from loopscale.evaluate import ladder, lens, probe_fit
from loopscale.model import LoopedLM
from loopscale.parallel import mesh as mesh_lib

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

SETTINGS = probe_fit.ProbeSettings()
FIT_BATCHES = 64  # generated batches the probes are fitted on (thousands of examples)
FIT_SEED = 2**63  # above any run's seed (module docstring)
FIELDS = ("hop_labels", "hop_mask", "hops", "start", "answer")  # what probes and lens read


def probe_step(params, batch, *, model: LoopedLM, n_loops: int) -> dict:
    """The stream at every point (K, L, B, D) in float32, the lens's argmax there, and the
    batch's labels and inputs."""
    stream_KxLxBxD = ladder.answer_stream(params, batch["inputs"], batch["answer_pos"], model,
                                          n_loops)
    return {"stream": stream_KxLxBxD.astype(jnp.float32),
            "lens": lens.decode(params, stream_KxLxBxD, model),
            **{k: batch[k] for k in ("inputs", *FIELDS)}}


def fit_dataset(run: Loaded) -> data_lib.Dataset:
    """The generated examples the probes are fitted on (module docstring)."""
    c = run.config
    train = dataclasses.replace(run.train, eval_batches=FIT_BATCHES)
    return data_lib.make_dataset(c.data, train, FIT_SEED, "eval", jax.process_index(),
                                 jax.process_count())


def gather(run: Loaded, dataset: data_lib.Dataset | None = None) -> dict[str, np.ndarray]:
    """probe_step's outputs over a dataset's batches (default: the run's held-out ones), whole
    on every process; examples on the axis the batch's rows were on."""
    params_sharding, batch_sharding = run._shardings()
    whole = jax.sharding.NamedSharding(run.mesh, jax.sharding.PartitionSpec())
    step = jax.jit(functools.partial(probe_step, model=run.model, n_loops=run.config.model.n_loops),
                   in_shardings=(params_sharding, batch_sharding), out_shardings=whole)
    parts = []
    with mesh_lib.activate(run.mesh):
        for local in (dataset or run._held_out()).iterator():
            batch = {k: local[k] for k in ("inputs", "answer_pos", *FIELDS)}
            parts.append(jax.device_get(step(run.params, mesh_lib.global_batch(batch, batch_sharding))))
    axis = {"stream": 2, "lens": 2}
    return {k: np.concatenate([p[k] for p in parts], axis=axis.get(k, 0)) for k in parts[0]}


def permutations(inputs_NxT: np.ndarray, n_nodes: int) -> np.ndarray:
    """(N, n): each example's permutation, p[x] = p(x), from its listed (node, image) pairs."""
    inputs_NxT = np.asarray(inputs_NxT)
    perm = np.empty((len(inputs_NxT), n_nodes), np.int64)
    rows = np.arange(len(inputs_NxT))[:, None]
    perm[rows, inputs_NxT[:, 1:2 * n_nodes + 1:2]] = inputs_NxT[:, 2:2 * n_nodes + 2:2]
    return perm


def shared_permutations(fit_inputs, score_inputs, n_nodes: int) -> float:
    """The share of scoring examples whose permutation is among the fitting examples'."""
    seen = {p.tobytes() for p in permutations(fit_inputs, n_nodes)}
    return float(np.mean([p.tobytes() in seen for p in permutations(score_inputs, n_nodes)]))


def _flat(data: dict) -> np.ndarray:
    K, L, N, D = data["stream"].shape
    return data["stream"].reshape(K * L, N, D)


def measure(fit: dict[str, np.ndarray], score: dict[str, np.ndarray], n_nodes: int, every: int,
            settings: probe_fit.ProbeSettings = SETTINGS) -> dict:
    """Fits on `fit`'s examples (L2 by cross-validation), scores on `score`'s: probes.json's
    figures (matched points every `every` layers)."""
    K, L, N, _ = fit["stream"].shape
    if N < 2 * settings.folds:
        raise UsageError(f"--what=probes needs at least {2 * settings.folds} fitting examples, "
                         f"got {N}")
    if score["stream"].shape[2] < 1:
        raise UsageError("--what=probes needs at least 1 held-out example")
    H = fit["hop_labels"].shape[1]
    probes, cv = probe_fit.fit_cv(_flat(fit), fit["hop_labels"], fit["hop_mask"],
                                  n_classes=n_nodes, settings=settings)
    hit_PxHxN = probe_fit.hits(probes, _flat(score), score["hop_labels"], score["hop_mask"])
    hit_KxLxNxH = jnp.moveaxis(hit_PxHxN.reshape(K, L, H, -1), 2, 3)
    rates = ladder.Rates.from_counts(jax.device_get(
        ladder.hit_counts(hit_KxLxNxH, jnp.asarray(score["hop_mask"]), jnp.asarray(score["hops"]))))
    fit_acc_PxH, _ = probe_fit.accuracy(probes, _flat(fit), fit["hop_labels"], fit["hop_mask"])
    lens_counts = lens.counts(jnp.asarray(score["lens"]),
                              {k: jnp.asarray(score[k]) for k in FIELDS})
    lens_table = lens.table(jax.device_get(lens_counts), n_nodes, every)
    return {**ladder.summary(rates, every, lens_table["at_chance_reason"]),
            "fit_layer": np.asarray(fit_acc_PxH).tolist(),
            "examples": lens_table["examples"], "fit_examples": N,
            "fit_data": {"split": "eval", "seed": FIT_SEED, "batches": FIT_BATCHES},
            "shared_permutations": shared_permutations(fit["inputs"], score["inputs"], n_nodes),
            "chance": 1.0 / n_nodes, "final_answer": lens_table["final_answer"],
            "final_answer_low": lens_table["final_answer_low"],
            "shortcut": lens_table["shortcut"],
            "steps": settings.steps, "folds": settings.folds,
            "l2_grid": sorted(settings.l2_grid),
            "l2_layer": np.asarray(cv.l2_PxH).tolist(),
            "cv_loss_layer": np.moveaxis(np.asarray(cv.loss_GxPxH), 0, -1)[..., ::-1].tolist(),
            "lens": lens_table}


def probes(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "probes")
    fit = gather(run, fit_dataset(run))
    return {**lens.trained_as(run), **measure(fit, gather(run), c.data.n_nodes,
                                              ladder.matched_every(c.model, c.data), SETTINGS)}


def plot_probes(result: dict, title: str):
    return ladder.plot([("linear probe", result), ("logit lens, same examples", result["lens"])],
                       title)
