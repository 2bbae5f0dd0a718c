"""Measurements of the training state taken on some steps only, outside the jitted train step:
the per-loop gradient norms (`grad_norm_loop`, every `train.loop_grad_every` steps, scanned
models), the activation-gradient norms (`act_grad_norm`, on logged rows when
`train.log_act_grads`), and for the permutation task the held-out answers' accuracy beside the
shortcut's at every evaluation.

Each is its own jitted function, kept in the run's compiled-function cache (`compiled`, shared
by every run of the step shape in a process, sharded_state._shared), so the train step the
trainer compiles is the same whether they are on or off.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from loopscale.config import Config
from loopscale.train.answers import answer_sums
from loopscale.model import LoopedLM
from loopscale.parallel import mesh as mesh_lib
from loopscale.train.step import act_grad_norms, loop_grad_norms, micro_batches


def _first_micro_act_grads(params, batch, *, model: LoopedLM, train, n_loops: int):
    """The logged act_grad_norm: step.act_grad_norms on the step's first micro-batch, at the
    parameters after the step (as grad_norm_loop is taken)."""
    first = jax.tree.map(lambda x: x[0], micro_batches(batch, train.grad_accum))
    return act_grad_norms(params, first, model=model, train=train, n_loops=n_loops)


class StateMetrics:
    """The train loop asks `due(after)` whether step `after` needs the state measured (so it
    waits for that step), then `measure(...)` for the row's extra fields."""

    def __init__(self, config: Config, model: LoopedLM, compiled: dict):
        self.config, self.model = config, model
        self.loop_grad_fns = compiled.setdefault("loop_grad", {})
        self.act_grad_fns = compiled.setdefault("act_grad", {})
        self.compiled = compiled

    def _loop_grads_due(self, after: int) -> bool:
        t = self.config.train
        return bool(t.loop_grad_every and after % t.loop_grad_every == 0
                    and self.config.model.scan)

    def _act_grads_due(self, after: int) -> bool:
        t = self.config.train
        return bool(t.log_act_grads and (after % t.log_every == 0 or after == t.steps))

    def due(self, after: int) -> bool:
        return self._loop_grads_due(after) or self._act_grads_due(after)

    def measure(self, params, batch, n_loops: int, after: int) -> dict:
        t, extra = self.config.train, {}
        if self._loop_grads_due(after):
            if n_loops not in self.loop_grad_fns:
                self.loop_grad_fns[n_loops] = jax.jit(functools.partial(
                    loop_grad_norms, model=self.model, train=t, n_loops=n_loops))
            extra["grad_norm_loop"] = np.asarray(
                self.loop_grad_fns[n_loops](params, batch)).tolist()
        if self._act_grads_due(after):
            if n_loops not in self.act_grad_fns:
                self.act_grad_fns[n_loops] = jax.jit(functools.partial(
                    _first_micro_act_grads, model=self.model, train=t, n_loops=n_loops))
            norms = np.asarray(self.act_grad_fns[n_loops](params, batch))
            extra.update(act_grad_norm=norms[:, -1].tolist(), act_grad_norm_layer=norms.tolist())
        return extra

    def answer_accuracy(self, params, eval_ds, batch_sharding) -> dict:
        """Permutation traversal: the share of held-out answers right at the final exit, beside
        the shortcut's (answering the start node), counted on the devices."""
        if "answers" not in self.compiled:
            self.compiled["answers"] = jax.jit(functools.partial(
                answer_sums, model=self.model, train=self.config.train,
                n_loops=self.config.model.n_loops))
        total = None
        for local in eval_ds.iterator():
            fields = {k: local[k] for k in ("inputs", "answer_pos", "answer", "start")}
            out = jax.device_get(self.compiled["answers"](params, mesh_lib.global_batch(
                fields, batch_sharding)))
            total = out if total is None else jax.tree.map(np.add, total, out)
        count = max(int(total["count"]), 1)
        return {"eval_accuracy": float(total["right"]) / count,
                "eval_shortcut": float(total["shortcut"]) / count}
