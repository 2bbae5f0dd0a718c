"""A trained model from its run directory: the config and the parameters, nothing else.

Evaluation needs neither the optimiser state (twice the parameters, for Adam) nor the data
iterator, and it may run on another mesh than training did (a single host evaluating a pod's
run, or a pod evaluating a run trained elsewhere): the parameters are restored straight onto
the shardings that the model's logical axis names give on the mesh asked for.
"""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
from etils import epath
from jax.sharding import Mesh

from loopscale.config import Config
from loopscale.errors import UsageError
from loopscale.files import is_local
from loopscale.model import LoopedLM
from loopscale.rundir import checkpoint
from loopscale.rundir.run import CHECKPOINTS, checkpoint_steps, read_config
from loopscale.parallel import mesh as mesh_lib


def abstract_params(config: Config, mesh: Mesh):
    """The parameters' shapes and dtypes with their shardings on `mesh`, allocating nothing."""
    model = LoopedLM(config.model)
    with mesh_lib.activate(mesh):
        boxed = jax.eval_shape(lambda rng: model.init(rng, jnp.zeros((1, 1), jnp.int32))["params"],
                               jax.random.PRNGKey(0))
    shardings = mesh_lib.logical_shardings(boxed, mesh)
    unboxed = nn.unbox(boxed)
    mesh_lib.check_divisible(unboxed, shardings)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        unboxed, shardings)


def load_run(rundir: str | os.PathLike, step: int | None = None,
             mesh: Mesh | None = None) -> tuple[Config, object]:
    """(config, params) of the run in `rundir` at checkpoint `step` (default: the newest), the
    parameters sharded on `mesh` (default: the run's mesh config over this machine's devices).
    Bad input (no run, no checkpoint, a step that is not there) is a UsageError."""
    config = read_config(rundir)
    # orbax wants an absolute path; a gs:// one stays as it is.
    directory = epath.Path(os.path.abspath(rundir) if is_local(rundir) else rundir) / CHECKPOINTS
    available = checkpoint_steps(directory)
    if not available:
        raise UsageError(f"{rundir}: no checkpoint to load")
    if step is None:
        step = available[-1]
    elif step not in available:
        raise UsageError(f"{rundir}: no checkpoint at step {step} (there are: "
                         f"{', '.join(map(str, available))})")
    mesh = mesh_lib.make_mesh(config.mesh) if mesh is None else mesh
    return config, checkpoint.restore_params(directory, step, abstract_params(config, mesh))
