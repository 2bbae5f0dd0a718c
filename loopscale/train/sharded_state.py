"""A run's step shape made ready to train: the mesh, the model, the optimiser, the train
state's shardings, the state itself (initialised already sharded, or only its shapes), and the
jitted train step, built once per step shape in a process (`_shared`).

The trainer (trainer.py) uses all of it; aot/compile.py and bench/steps.py use `setup`,
`abstract_state`, `init_state` and `jit_train_step` to compile and time the very step the
trainer runs. Nothing here reads a run directory or data.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from loopscale.config import Config
from loopscale.errors import UsageError
from loopscale.model import LoopedLM
from loopscale.parallel import mesh as mesh_lib
from loopscale.rundir.checkpoint import abstract_like
from loopscale.train.optimizer import build_optimizer
from loopscale.train.step import GradLayout, TrainState, train_step


@dataclasses.dataclass
class Setup:
    config: Config
    mesh: jax.sharding.Mesh
    model: LoopedLM
    tx: object
    lr_factor: object  # step -> lr_t / peak (optimizer.py: the schedule lives outside tx)
    state_shardings: object
    # Where the parameters live and where their gradient goes (ZeRO-1 splits it as the
    # optimiser state): what the step's one gradient reduction needs (step.local_gradients).
    grad_layout: GradLayout
    batch_sharding: object
    # The compiled functions of this step shape in this process: "init", "eval", and
    # "train" / "loop_grad" / "act_grad" by loop count, and the abstract state (shared by
    # every run of the shape; _shared).
    compiled: dict


_MAX_SHAPES = 8
_SHARED: collections.OrderedDict = collections.OrderedDict()


def _shared(config: Config, mesh: jax.sharding.Mesh, build) -> tuple:
    """(model, tx, state shardings, compiled functions) of this run's step shape, built once
    per process: a warm sweep worker (sweep/worker.py) trains run after run, and runs of one
    shape at other budgets, schedules or branch points then reuse the model, the optimiser
    and every compiled function instead of tracing and compiling them again. The last
    _MAX_SHAPES shapes are kept. Keyed by the device objects, not their ids: two TPU
    topologies compiled for in one process number their devices alike."""
    key = (config.step_shape, tuple(mesh.devices.flat), tuple(mesh.shape.items()))
    if key not in _SHARED:
        _SHARED[key] = (*build(), {})
        while len(_SHARED) > _MAX_SHAPES:
            _SHARED.popitem(last=False)
    _SHARED.move_to_end(key)
    return _SHARED[key]


def _boxed_state_fn(model: LoopedLM, tx, seq_len: int):
    """rng -> TrainState whose params and optimiser state carry their logical axis names."""
    def init(rng):
        params = model.init(rng, jnp.zeros((1, seq_len), jnp.int32))["params"]
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
    return init


def setup(config: Config, devices=None) -> Setup:
    mesh = mesh_lib.make_mesh(config.mesh, devices)
    dp = mesh_lib.data_parallel_size(mesh)
    if config.train.batch_size % (dp * config.train.grad_accum):
        raise UsageError(f"train.batch_size={config.train.batch_size} must be divisible by "
                         f"data-parallel size {dp} x train.grad_accum={config.train.grad_accum}")
    _, lr_factor = build_optimizer(config.train, config.model)

    def build():
        model = LoopedLM(config.model)
        tx, _ = build_optimizer(config.train, config.model)
        abstract = jax.eval_shape(_boxed_state_fn(model, tx, config.train.seq_len),
                                  jax.random.PRNGKey(0))
        shardings = mesh_lib.logical_shardings(abstract, mesh)
        shapes = nn.unbox(abstract)
        mesh_lib.check_divisible(shapes.params, shardings.params)
        grads = shardings.params
        if config.mesh.zero1:
            shardings = shardings.replace(opt_state=mesh_lib.zero1_shardings(
                shapes.opt_state, shardings.opt_state, mesh))
            grads = mesh_lib.zero1_shardings(shapes.params, shardings.params, mesh)
        specs = functools.partial(jax.tree.map, lambda sharding: sharding.spec)
        return model, tx, shardings, GradLayout(specs(shardings.params), specs(grads))

    model, tx, shardings, layout, compiled = _shared(config, mesh, build)
    return Setup(config, mesh, model, tx, lr_factor, shardings, layout,
                 mesh_lib.batch_sharding(mesh), compiled)


def init_compiler_options(platform: str) -> dict | None:
    """XLA options for the init program: on CPUs LLVM's level 1, not the default 2. The init
    runs once a run, and its compile is mostly many small threefry hashes (the parameters'
    random draws): a few seconds even for a tiny model, a third to a half of them spent on
    optimisations that buy nothing for one run. Level 1 draws the same bits (the init digests
    of tests/test_init.py, computed at level 2, are checked at level 1; level 0 draws others)
    and compiled the demo's and the tiny presets' inits in 52-74% of the time (six configs,
    2026-12-06)."""
    return {"xla_backend_optimization_level": 1} if platform == "cpu" else None


def _jit_init(s: Setup):
    init = _boxed_state_fn(s.model, s.tx, s.config.train.seq_len)
    return jax.jit(lambda rng: nn.unbox(init(rng)), out_shardings=s.state_shardings)


def init_state(s: Setup):
    key = jax.random.PRNGKey(s.config.seed)
    if "init" not in s.compiled:
        options = init_compiler_options(s.mesh.devices.flat[0].platform)
        s.compiled["init"] = _jit_init(s).lower(key).compile(compiler_options=options)
    return s.compiled["init"](key)


def abstract_state(s: Setup):
    """The train state's shapes, dtypes and shardings, allocating nothing. Traced once per
    step shape (s.compiled): tracing the model's init took 0.4 s at the demo's widths, and
    every run asks for it before restoring, a cooldown branch twice (resume.py)."""
    if "abstract_state" not in s.compiled:
        s.compiled["abstract_state"] = abstract_like(
            jax.eval_shape(_jit_init(s), jax.random.PRNGKey(s.config.seed)), s.state_shardings)
    return s.compiled["abstract_state"]


def jit_train_step(s: Setup, n_loops: int, max_frozen: int = 0):
    """The train step as it runs: explicit shardings, the state donated (one per loop count;
    with `max_frozen`, the step shared across loop counts, which takes the frozen count as a
    fourth argument: loop_schedule.shared_frozen_slots)."""
    step = functools.partial(train_step, model=s.model, tx=s.tx, train=s.config.train,
                             n_loops=n_loops, max_frozen=max_frozen, layout=s.grad_layout)
    scalar = mesh_lib.replicated(s.mesh)
    return jax.jit(step, in_shardings=(s.state_shardings, s.batch_sharding, scalar,
                                       *((scalar,) if max_frozen else ())),
                   out_shardings=(s.state_shardings, None), donate_argnums=0)
