"""A trained run loaded once for `loopscale eval` (`Loaded`): its config, its parameters restored
onto the run's mesh (parameters only: rundir/load.py), and its held-out batches; and the two ways
a measurement runs over them: the loss at every loop exit (`loss_per_exit`) and the sums of a
jitted step over the held-out batches (`sums`).

Held-out data is the run's own eval split (data/: a fixed split of the run's source that
training never reads, `--batches` batches of it), or the text files of `--data`, evaluated in
the train step's micro-batches on the run's mesh, so a paper-scale run evaluates where it
trained. Every measurement module takes a `Loaded`; measures.py is their table.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import jax
import numpy as np

from loopscale import data as data_lib
from loopscale.config import Config
from loopscale.evaluate import held_out
from loopscale.model import LoopedLM
from loopscale.parallel import mesh as mesh_lib
from loopscale.train.eval_loss import evaluate, jit_eval_step


# The jitted steps of the evaluations in this process, by what they compile from (_compiled):
# one `loopscale eval` measuring `loops` and `ppl` runs the eval step at the trained loop count
# twice, and evaluations of runs of one step shape (a sweep's, or one run measured again with
# other --batches or --data) run the same steps; each is traced and compiled once. The last
# _MAX_COMPILED are kept.
_MAX_COMPILED = 32
_COMPILED: collections.OrderedDict = collections.OrderedDict()


def _step_fn_key(step_fn):
    """A hashable identity of a step function (a function, or a partial of one over hashable
    arguments), or None when it has none (a partial over an array: not shared)."""
    if isinstance(step_fn, functools.partial):
        key = (step_fn.func, step_fn.args, tuple(sorted(step_fn.keywords.items())))
    else:
        key = step_fn
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _compiled(key, build):
    """`build()` (a jitted function) once per `key` in this process; a None key is not kept."""
    if key is None:
        return build()
    if key not in _COMPILED:
        _COMPILED[key] = build()
        while len(_COMPILED) > _MAX_COMPILED:
            _COMPILED.popitem(last=False)
    _COMPILED.move_to_end(key)
    return _COMPILED[key]


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A run's checkpoint, ready to evaluate."""

    config: Config
    step: int  # the checkpoint's
    params: object
    mesh: jax.sharding.Mesh
    batches: int  # held-out batches of config.train.batch_size sequences
    tasks: tuple[str, ...] = ()  # --tasks: mc's task files (none: the shipped one)
    data: str = ""  # --data: held-out text files instead of the run's held-out split
    loop_counts: tuple[int, ...] = ()  # --loops: the loops measure's counts (none: 1 .. 2K)

    @property
    def model(self) -> LoopedLM:
        return LoopedLM(self.config.model)

    @property
    def train(self):
        return dataclasses.replace(self.config.train, eval_batches=self.batches)

    def _held_out(self):
        c = self.config
        if self.data:
            return held_out.dataset(c, self.train, self.data, jax.process_index(),
                                    jax.process_count())
        return data_lib.make_dataset(c.data, self.train, c.seed, "eval", jax.process_index(),
                                     jax.process_count())

    def _shardings(self):
        return (jax.tree.map(lambda x: x.sharding, self.params),
                mesh_lib.batch_sharding(self.mesh))

    def _step_key(self, step_fn_key, n_loops: int, shardings):
        """What a jitted step over the held-out batches compiles from: the step function, the
        run's step shape (Config.step_shape: the host-only fields, the number of held-out
        batches among them, never enter a step), the loop count and the shardings. None (not
        shared) when the step function has no identity."""
        if step_fn_key is None:
            return None
        params_sharding, batch_sharding = shardings
        leaves, treedef = jax.tree.flatten(params_sharding)
        return (step_fn_key, self.config.step_shape, n_loops, tuple(leaves), treedef,
                batch_sharding)

    def loss_per_exit(self, n_loops: int) -> tuple[list[float], float]:
        """(mean held-out loss at each loop exit, tokens scored) at `n_loops` loops."""
        params_sharding, batch_sharding = self._shardings()
        with mesh_lib.activate(self.mesh):
            key = self._step_key(jit_eval_step, n_loops, (params_sharding, batch_sharding))
            step = _compiled(key, lambda: jit_eval_step(self.model, self.train, n_loops,
                                                        param_shardings=params_sharding,
                                                        batch_sharding=batch_sharding))
            out = evaluate(step, self.params, self._held_out(), batch_sharding)
        return out["eval_loss_per_loop"], out["eval_tokens"]

    def sums(self, step_fn, max_batches: int | None = None, prepare=None,
             n_loops: int | None = None) -> dict:
        """`step_fn(params, batch, model=, train=, n_loops=)`'s sums over the held-out batches
        (the first `max_batches` of them), at `n_loops` loops (default: the trained count).
        `prepare(i, local)`, if given, returns held-out batch i's rows in this process as the
        step reads them (fields made on the host: patching's corrupted inputs, supervision
        labels)."""
        params_sharding, batch_sharding = self._shardings()
        n_loops = n_loops or self.config.model.n_loops
        step = _compiled(self._step_key(_step_fn_key(step_fn), n_loops,
                                        (params_sharding, batch_sharding)),
                         lambda: jax.jit(functools.partial(step_fn, model=self.model,
                                                           train=self.train, n_loops=n_loops),
                                         in_shardings=(params_sharding, batch_sharding)))
        total = None
        with mesh_lib.activate(self.mesh):
            for i, local in enumerate(self._held_out().iterator()):
                if i == max_batches:
                    break
                if prepare is not None:
                    local = prepare(i, local)
                out = jax.device_get(step(self.params, mesh_lib.global_batch(local, batch_sharding)))
                total = out if total is None else jax.tree.map(np.add, total, out)
        return total
