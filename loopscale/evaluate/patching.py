"""`loopscale eval --what=patching`: activation patching of the residual stream on permutation
traversal (PAPERS.md section 3: where, in which iteration and at which position, the answer
is decided).

Each held-out example gets a corrupted twin (data/permutation.corrupt_start): the same
permutation, listing and hop count from another start node s' = (s + r) mod n, r uniform in
1 .. n-1, so the two differ only in the start token (and in the answer token where padding
shows it) and the corrupted answer a' = p^H(s') always differs from the clean answer a. The
corrupted run's stream is kept at every (loop, layer, position); then, for each of those
points, the clean run is repeated with its stream there replaced by the corrupted one (the
model's stream hook, keep 0 and add x'), and the answer read at the answer position:

    flip_share              share of examples whose patched answer (argmax) is the corrupted
                            run's, among those where the clean and corrupted runs answer
                            differently (None when none do)
    corrupted_answer_share  share of all examples whose patched answer is a' itself
    normalised_logit_diff   (LD - LD_corrupt) / (LD_clean - LD_corrupt), LD = logit(a) -
                            logit(a') averaged over examples: 1 = the clean behaviour, 0 = fully
                            the corrupted one (None when the clean and corrupted means are equal)
    logit_diff              the mean LD itself

each as [loop][layer][position]; `iteration_*` is the loop-boundary slice [loop][position] (the
last layer of each loop), the heat map of a looped run; a run without loops (K = 1) is drawn
per layer. Patching after the answer position cannot change the answer (causal attention).

One jitted function per held-out batch runs the corrupted and clean passes and maps over the
K * L * T patch points, `lanes` of them at once (vmapped); the counts are summed on the
devices, so every process gets the global figures.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import TrainConfig
from loopscale.data import permutation
from loopscale.evaluate import ladder
from loopscale.model import LoopedLM, StreamEdit
from loopscale.train.step import readout_fn

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

# Bytes of patch edits (one (K, L, B, T, D) float32 `add` per lane) held at once.
EDIT_BYTES = 1 << 28


def lanes_for(n_loops: int, n_layers: int, batch: int, length: int, d_model: int) -> int:
    """Patch points evaluated at once: as many as EDIT_BYTES allow, at least 1."""
    per_lane = 4 * n_loops * n_layers * batch * length * d_model
    return int(max(1, min(EDIT_BYTES // per_lane, n_loops * n_layers * length)))


def patching_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int,
                  lanes: int) -> dict[str, jax.Array]:
    """Sums over the batch's examples: per (loop, layer, position) patch point (K, L, T) and
    for the clean and corrupted runs themselves."""
    del train  # one position per example is read: no micro-batches or vocabulary chunks
    inputs_BxT, pos_B = batch["inputs"], batch["answer_pos"]
    a_B, a_corrupt_B = batch["answer"], batch["corrupt_answer"]
    rows_B = jnp.arange(pos_B.shape[0])
    readout = readout_fn(model, params, lead=("act_batch",))

    def run(tokens_BxT, edit=None, collect=False):
        m = model.clone(collect_layers=True) if collect else model
        out = m.apply({"params": params}, tokens_BxT, n_loops=n_loops, readout=False, edit=edit)
        return out, readout(out.exit_hidden[-1, rows_B, pos_B])  # logits (B, V) at the answer

    def logit_diff(logits_BxV):
        return logits_BxV[rows_B, a_B] - logits_BxV[rows_B, a_corrupt_B]

    corrupt, corrupt_logits = run(batch["corrupt_inputs"], collect=True)
    x_corrupt_KxLxBxTxD = corrupt.layer_hidden
    _, clean_logits = run(inputs_BxT)
    pred_clean_B, pred_corrupt_B = (jnp.argmax(x, axis=-1) for x in (clean_logits, corrupt_logits))
    differ_B = pred_clean_B != pred_corrupt_B
    K, L, B, T, _ = x_corrupt_KxLxBxTxD.shape

    def patched(point):
        # Point (t, l, p) in row-major order: keep the clean stream everywhere but there.
        at_KxLxT = (jnp.arange(K * L * T) == point).reshape(K, L, T).astype(jnp.float32)
        keep = jnp.broadcast_to(1.0 - at_KxLxT[:, :, None, :], (K, L, B, T))
        add = at_KxLxT[:, :, None, :, None] * x_corrupt_KxLxBxTxD.astype(jnp.float32)
        _, logits_BxV = run(inputs_BxT, StreamEdit(keep, add))
        pred_B = jnp.argmax(logits_BxV, axis=-1)
        return {"logit_diff": jnp.sum(logit_diff(logits_BxV)),
                "flip": jnp.sum((pred_B == pred_corrupt_B) & differ_B),
                "corrupted_answer": jnp.sum(pred_B == a_corrupt_B)}

    grid = jax.lax.map(patched, jnp.arange(K * L * T), batch_size=lanes)
    return {**jax.tree.map(lambda v: v.reshape(K, L, T), grid),
            "logit_diff_clean": jnp.sum(logit_diff(clean_logits)),
            "logit_diff_corrupt": jnp.sum(logit_diff(corrupt_logits)),
            "clean_right": jnp.sum(pred_clean_B == a_B),
            "corrupt_right": jnp.sum(pred_corrupt_B == a_corrupt_B),
            "differ": jnp.sum(differ_B), "examples": jnp.asarray(B)}


def position_labels(n_nodes: int, length: int) -> list[str]:
    """What each input position holds (data/permutation.py's format)."""
    labels = ["BOS"] + ["node", "image"] * n_nodes + ["QUERY", "start", "HOP"]
    return (labels + ["answer"] + ["PAD"] * length)[:length]


def table(sums: dict) -> dict:
    """The summed counts -> patching.json's figures."""
    examples = int(sums["examples"])
    differ = int(sums["differ"])
    clean, corrupt = (float(sums[k]) / examples for k in ("logit_diff_clean", "logit_diff_corrupt"))
    ld_KxLxT = np.asarray(sums["logit_diff"], np.float64) / examples
    span = clean - corrupt
    normalised = ((ld_KxLxT - corrupt) / span).tolist() if span else None
    flip = (np.asarray(sums["flip"]) / differ).tolist() if differ else None
    return {"examples": examples, "clean_accuracy": float(sums["clean_right"]) / examples,
            "corrupt_accuracy": float(sums["corrupt_right"]) / examples,
            "answers_differ": differ / examples,
            "logit_diff_clean": clean, "logit_diff_corrupt": corrupt,
            "flip_share": flip, "normalised_logit_diff": normalised,
            "corrupted_answer_share": (np.asarray(sums["corrupted_answer"]) / examples).tolist(),
            "logit_diff": ld_KxLxT.tolist(),
            "iteration_flip_share": None if flip is None else [row[-1] for row in flip],
            "iteration_normalised_logit_diff":
                None if normalised is None else [row[-1] for row in normalised]}


def patching(run: Loaded) -> dict:
    c = run.config
    ladder.require_permutation(c, "patching")
    m, n = c.model, c.data.n_nodes

    def prepare(i, local):
        rng = np.random.default_rng([c.seed, i, jax.process_index()])
        twin = permutation.corrupt_start(local, n, rng)
        return {"inputs": local["inputs"], "answer_pos": local["answer_pos"],
                "answer": local["answer"], "corrupt_inputs": twin["inputs"],
                "corrupt_answer": twin["answer"]}

    lanes = lanes_for(m.n_loops, m.n_unique, c.train.batch_size, c.train.seq_len, m.d_model)
    sums = run.sums(functools.partial(patching_step, lanes=lanes), prepare=prepare)
    return {"n_loops": m.n_loops, "layers_per_loop": m.n_unique,
            "answer_pos": 2 * n + 3, "positions": position_labels(n, c.train.seq_len),
            "corruption": "same permutation and hops, start s' = (s + r) mod n, r uniform in "
                          "1..n-1 (answers always differ)",
            **table(sums)}


def plot_patching(result: dict, title: str):
    """Flip share and normalised logit difference, iteration (or, without loops, layer) x
    position, the answer position marked."""
    import matplotlib.pyplot as plt

    per_layer = result["n_loops"] == 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), squeeze=False)
    labels = result["positions"]
    ticks = [p for p, name in enumerate(labels) if name in ("BOS", "QUERY", "start", "HOP")]
    for ax, key, cmap, bounds in ((axes[0, 0], "flip_share", "viridis", (0, 1)),
                                  (axes[0, 1], "normalised_logit_diff", "RdBu", (-0.25, 1.25))):
        grid = result[key]
        if grid is None:
            matrix = np.full((1, len(labels)), np.nan)
        else:  # (K, L, T) -> layers of the one pass, or loop boundaries
            matrix = np.asarray(grid, float)[0] if per_layer else np.asarray(grid, float)[:, -1]
        image = ax.imshow(matrix, vmin=bounds[0], vmax=bounds[1], cmap=cmap, aspect="auto",
                          origin="lower", extent=(-0.5, len(labels) - 0.5, 0.5, len(matrix) + 0.5))
        ax.axvline(result["answer_pos"], color="red", lw=0.8, ls=":")
        ax.set_xticks(ticks, [labels[p] for p in ticks], fontsize="small", rotation=90)
        ax.set_yticks(range(1, len(matrix) + 1))
        ax.set(xlabel="patched position", ylabel="layer" if per_layer else "loop iteration",
               title=key + ("" if grid is not None else " (undefined)"))
        fig.colorbar(image, ax=ax)
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig
