"""The device mesh and the rules that map the model's logical axis names onto it.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with parameters and optimiser
state sharded), `tensor` (heads, FFN width, vocabulary), `expert` (MoE experts; batch too, so
expert-parallel devices still split the batch). A size of -1 takes the devices left over.
"""

from __future__ import annotations

import math

import jax
import jax.experimental.mesh_utils
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loopscale.config.schema import MeshConfig
from loopscale.errors import UsageError

AXES = ("data", "fsdp", "tensor", "expert")

# Logical name -> mesh axes, tried in order. flax skips a mesh axis already used by an earlier
# dimension of the same array, so activations (batch on data+fsdp) keep `embed` unsharded
# while parameters shard `embed` over fsdp.
LOGICAL_RULES = (
    ("batch", ("data", "fsdp", "expert")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("expert", "expert"),
    ("layers", None),
)


def mesh_shape(cfg: MeshConfig, n_devices: int) -> tuple[int, ...]:
    sizes = [cfg.data, cfg.fsdp, cfg.tensor, cfg.expert]
    if sizes.count(-1) > 1:
        raise UsageError("at most one mesh axis may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise UsageError(f"mesh sizes {dict(zip(AXES, sizes))} must be positive or -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % known:
            raise UsageError(f"{n_devices} devices cannot fill mesh {dict(zip(AXES, sizes))}")
        sizes[sizes.index(-1)] = n_devices // known
    if math.prod(sizes) != n_devices:
        raise UsageError(f"mesh {dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices, "
                         f"{n_devices} are available")
    return tuple(sizes)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(cfg, len(devices))
    try:
        grid = jax.experimental.mesh_utils.create_device_mesh(shape, devices)
    except (AssertionError, ValueError, NotImplementedError):
        grid = np.asarray(devices).reshape(shape)
    return Mesh(grid, AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over every data-parallel mesh axis."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp", "expert")))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (scalars such as the step's LR multiplier)."""
    return NamedSharding(mesh, PartitionSpec())


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]


def check_divisible(abstract_params, shardings) -> None:
    """Every sharded parameter axis must split evenly over its mesh axes; say which does not
    (XLA's own error names neither the parameter nor the config field)."""
    def check(path, x, sharding):
        for dim, axes in zip(x.shape, sharding.spec):
            axes = (axes,) if isinstance(axes, str) else axes or ()
            parts = math.prod(sharding.mesh.shape[a] for a in axes)
            if dim % parts:
                raise UsageError(f"parameter {jax.tree_util.keystr(path)} of shape {x.shape} cannot "
                                 f"be split {parts} ways over mesh axes {axes}; change the mesh "
                                 f"or the model shape")
    jax.tree_util.tree_map_with_path(check, abstract_params, shardings)
