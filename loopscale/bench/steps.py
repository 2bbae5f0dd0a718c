"""The project's own train step, ready to time: an experiment config -> the trainer's setup,
state and jitted step (`trainer.setup`, `init_state`, `jit_train_step`) on one device, fed a
fixed batch made the trainer's way (`mesh.global_batch`).

Experiment files are found in the checkout beside the package (experiments/NAME.py), as the
demo finds its sweep, so `loopscale bench` runs from any directory of an editable install.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import numpy as np

from loopscale import checkout
from loopscale.aot import compile as aot
from loopscale.config import Config, load_config, parse
from loopscale.errors import UsageError
from loopscale.parallel import mesh as mesh_lib
from loopscale.train import trainer


def experiment_path(name: str) -> str:
    """experiments/NAME (with its :ARG) of the checkout the package is installed from."""
    file, colon, arg = name.partition(":")
    path = checkout.root() / "experiments" / file
    if not path.is_file():
        raise UsageError(f"no {path} beside the installed package (not an editable install of "
                         "the checkout); loopscale bench needs the checkout's experiments/")
    return f"{path}{colon}{arg}"


def load(name: str, overrides: Sequence[str] = ()) -> Config:
    """The validated config of experiments/NAME[:ARG] with `--config.a.b=v` overrides."""
    return parse(load_config(experiment_path(name), list(overrides)))


def one_device() -> list:
    return jax.devices()[:1]


def synthetic_batch(config: Config, seed: int = 0) -> dict:
    """A batch of uniform random tokens, shaped as the data pipeline's (B, T) arrays. Step
    time does not depend on the values (the MoE's routing aside: uniform tokens route about
    evenly, as a trained router is pushed to)."""
    t = config.train
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.model.vocab_size, (t.batch_size, t.seq_len + 1), np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "mask": np.ones((t.batch_size, t.seq_len), bool)}


class TrainStep:
    """The trainer's compiled step for `config` with its state and one batch; calling it runs
    one optimiser step (the state is donated and replaced, as in the trainer) and waits."""

    def __init__(self, config: Config, devices=None, batch: dict | None = None):
        self.config = config
        self.s = trainer.setup(config, devices or one_device())
        self.lr_factor = np.float32(1.0)
        with mesh_lib.activate(self.s.mesh):
            self.state = trainer.init_state(self.s)
            self.batch = mesh_lib.global_batch(batch or synthetic_batch(config),
                                               self.s.batch_sharding)
            start = time.perf_counter()
            self.compiled = aot.compile_lowered(self.lower(), self.s.mesh.devices.flat)
            self.compile_s = time.perf_counter() - start

    def lower(self):
        """A fresh lowering of the step (a new jax.jit: nothing reused from earlier ones)."""
        with mesh_lib.activate(self.s.mesh):
            jitted = trainer.jit_train_step(self.s, self.config.model.n_loops)
            return jitted.lower(self.state, self.batch, self.lr_factor)

    def __call__(self) -> None:
        self.state, metrics = self.compiled(self.state, self.batch, self.lr_factor)
        jax.block_until_ready((self.state, metrics))

    @property
    def tokens(self) -> int:
        return self.config.train.batch_size * self.config.train.seq_len


def compile_seconds(config: Config, devices=None) -> float:
    """Seconds to lower and compile the trainer's step for `config` from a fresh jax.jit on
    abstract inputs (nothing allocated): what the trainer pays the first time it sees a shape.
    The setup (model, optimiser, shardings) is made before the clock starts."""
    s = trainer.setup(config, devices or one_device())
    state = trainer.abstract_state(s)
    batch = aot.abstract_batch(config, s.batch_sharding)
    lr = jax.ShapeDtypeStruct((), np.float32, sharding=mesh_lib.replicated(s.mesh))
    with mesh_lib.activate(s.mesh):
        start = time.perf_counter()
        lowered = trainer.jit_train_step(s, config.model.n_loops).lower(state, batch, lr)
        aot.compile_lowered(lowered, s.mesh.devices.flat)
        return time.perf_counter() - start


def step_memory(config: Config, devices=None) -> dict:
    """XLA's buffer assignment of the compiled step (aot.memory: arguments, outputs, aliased,
    temporaries, code, total bytes), compiled on abstract inputs."""
    devices = devices or one_device()
    lowered, _ = aot.lower(config, devices)
    return aot.memory(aot.compile_lowered(lowered, devices))
