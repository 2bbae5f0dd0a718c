"""Held-out language-modelling loss at every loop exit: the trainer's `eval_loss` and
`eval_loss_per_loop`.

`eval_step` is pure and module-level like the train step; `jit_eval_step` binds it to the
trainer's shardings (aot/compile.py compiles the same one); `evaluate` runs it over one pass of
an eval dataset. Nothing here knows the trainer: the model, train config and shardings come in
as arguments, so the evaluators of a trained run directory can call it too.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import TrainConfig
from loopscale.model import LoopedLM
from loopscale.model.loss import chunk_size, token_losses
from loopscale.parallel import mesh as mesh_lib
from loopscale.train.step import micro_batches, readout_fn


def eval_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
              ) -> dict[str, jax.Array]:
    """Sums for a masked mean over the eval set: loss at every loop exit (the last is the
    model's loss). The batch is evaluated in the train step's micro-batches (a forward pass
    of what a train step fits) and each exit's vocabulary projection in chunks of
    `train.ce_chunk` positions, so no (K, B, T, V) logits are ever built."""
    readout = readout_fn(model, params)

    def sums(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False,
                          all_exits=True)
        mask = micro["mask"].astype(jnp.float32)
        per_loop = [jnp.sum(token_losses(readout, h, micro["targets"], train.ce_chunk)[0] * mask)
                    for h in out.exit_hidden]
        return {"loss_sum_per_loop": jnp.stack(per_loop), "weight": jnp.sum(mask)}

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def summed_over_micro_batches(sums, batch, accum: int):
    """`sums(micro_batch)` (a pytree of sums) added up over the train step's `accum`
    micro-batches: an evaluation holds in memory what one train step's forward pass does."""
    if accum == 1:
        return sums(batch)
    parts = jax.lax.map(sums, micro_batches(batch, accum))
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), parts)


def map_position_chunks(fn, hidden_NxBxTxD: jax.Array, targets_BxT: jax.Array, chunk: int):
    """`fn(h_NxBxcxD, targets_Bxc)` -> a pytree of (..., B, c) per-token figures, applied
    `chunk` positions at a time (model/loss.chunk_size) and reassembled to (..., B, T): every
    exit's vocabulary projection is read a few positions at a time, so no (N, B, T, V)
    logits exist whole, as in the loss (model/loss.py)."""
    N, B, T, D = hidden_NxBxTxD.shape
    c = chunk_size(T, chunk)
    if c == T:
        return fn(hidden_NxBxTxD, targets_BxT)
    n = T // c
    parts = (hidden_NxBxTxD.reshape(N, B, n, c, D).transpose(2, 0, 1, 3, 4),
             targets_BxT.reshape(B, n, c).transpose(1, 0, 2))
    out = jax.lax.map(lambda part: fn(*part), parts)  # leaves (n, ..., B, c)
    return jax.tree.map(lambda x: jnp.moveaxis(x, 0, -2).reshape(*x.shape[1:-2], B, T), out)


def jit_eval_step(model: LoopedLM, train: TrainConfig, n_loops: int, *, param_shardings,
                  batch_sharding):
    """`eval_step` at `n_loops` loops, jitted with the parameters' and the batch's shardings."""
    return jax.jit(functools.partial(eval_step, model=model, train=train, n_loops=n_loops),
                   in_shardings=(param_shardings, batch_sharding))


# Evaluation steps dispatched ahead of the one read back: the host makes and places the next
# batch while the device sums the last (as the train loop does), and at most this many batches
# wait on the device, whatever the eval set's size.
AHEAD = 2


def evaluate(step, params, eval_ds, batch_sharding) -> dict:
    """The masked mean loss per loop exit over one pass of `eval_ds` (each process's rows,
    placed with `batch_sharding`), summed by `step` (a `jit_eval_step`). The sums are added
    on the host in the batches' order, so the result does not depend on AHEAD."""
    totals, weight = None, 0.0
    pending: collections.deque = collections.deque()

    def read_one() -> None:
        nonlocal totals, weight
        out = jax.device_get(pending.popleft())
        totals = out["loss_sum_per_loop"] if totals is None else totals + out["loss_sum_per_loop"]
        weight += float(out["weight"])

    for local in eval_ds.iterator():
        pending.append(step(params, mesh_lib.global_batch(local, batch_sharding)))
        if len(pending) > AHEAD:
            read_one()
    while pending:
        read_one()
    per_loop = (np.asarray(totals) / max(weight, 1.0)).tolist()
    return {"eval_loss": per_loop[-1], "eval_loss_per_loop": per_loop, "eval_tokens": weight}
