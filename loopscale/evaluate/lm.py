"""Held-out language-modelling loss at every loop exit: the trainer's `eval_loss` and
`eval_loss_per_loop`.

`eval_step` is pure and module-level like the train step; `jit_eval_step` binds it to the
trainer's shardings (aot/compile.py compiles the same one); `evaluate` runs it over one pass of
an eval dataset. Nothing here knows the trainer: the model, train config and shardings come in
as arguments, so the evaluators of a trained run directory can call it too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import TrainConfig
from loopscale.model import LoopedLM
from loopscale.model.loss import token_losses
from loopscale.train import mesh as mesh_lib
from loopscale.train.step import micro_batches, readout_fn


def eval_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
              ) -> dict[str, jax.Array]:
    """Sums for a masked mean over the eval set: loss at every loop exit (the last is the
    model's loss). The batch is evaluated in the train step's micro-batches (a forward pass
    of what a train step fits) and each exit's vocabulary projection in chunks of
    `train.ce_chunk` positions, so no (K, B, T, V) logits are ever built."""
    readout = readout_fn(model, params)

    def sums(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
        mask = micro["mask"].astype(jnp.float32)
        per_loop = [jnp.sum(token_losses(readout, h, micro["targets"], train.ce_chunk)[0] * mask)
                    for h in out.loop_hidden]
        return {"loss_sum_per_loop": jnp.stack(per_loop), "weight": jnp.sum(mask)}

    if train.grad_accum == 1:
        return sums(batch)
    parts = jax.lax.map(sums, micro_batches(batch, train.grad_accum))
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), parts)


def jit_eval_step(model: LoopedLM, train: TrainConfig, n_loops: int, *, param_shardings,
                  batch_sharding):
    """`eval_step` at `n_loops` loops, jitted with the parameters' and the batch's shardings."""
    return jax.jit(functools.partial(eval_step, model=model, train=train, n_loops=n_loops),
                   in_shardings=(param_shardings, batch_sharding))


def evaluate(step, params, eval_ds, batch_sharding) -> dict:
    """The masked mean loss per loop exit over one pass of `eval_ds` (each process's rows,
    placed with `batch_sharding`), summed by `step` (a `jit_eval_step`)."""
    totals, weight = None, 0.0
    for local in eval_ds.iterator():
        out = jax.device_get(step(params, mesh_lib.global_batch(local, batch_sharding)))
        totals = out["loss_sum_per_loop"] if totals is None else totals + out["loss_sum_per_loop"]
        weight += float(out["weight"])
    per_loop = (np.asarray(totals) / max(weight, 1.0)).tolist()
    return {"eval_loss": per_loop[-1], "eval_loss_per_loop": per_loop, "eval_tokens": weight}
