"""The device mesh, with the model's logical axis rules (model/sharding.py) in context.

Mesh axes: `data` (pure data parallel), `fsdp` (data parallel with parameters and optimiser
state sharded), `tensor` (heads, FFN width, vocabulary), `expert` (MoE experts; batch too, so
expert-parallel devices still split the batch). A size of -1 takes the devices left over.
"""

from __future__ import annotations

import contextlib
import math

import flax.linen as nn
import jax
import jax.experimental.mesh_utils
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from loopscale.config.schema import MeshConfig
from loopscale.errors import UsageError
from loopscale.model.sharding import AXES, BATCH_AXES, LOGICAL_RULES
from loopscale.parallel import xla_cache


@contextlib.contextmanager
def activate(mesh: Mesh):
    """The mesh and the logical rules in context, so the model's `nn.with_logical_constraint`s
    take effect when it is traced (outside this context flax makes them no-ops and XLA
    propagates the parameters' shardings into the activations instead). Wrap every tracing of
    the model on a mesh in it: init, train step, eval step."""
    with jax.sharding.set_mesh(mesh), nn.logical_axis_rules(LOGICAL_RULES):
        yield


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


def n_slices(devices) -> int:
    """Slices (TPU pods joined over the data-centre network) the devices span; 1 elsewhere."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    """The (data, fsdp, tensor, expert) mesh over `devices`, laid out on the chips' physical
    interconnect. Devices spanning several slices get a hybrid mesh whose `data` axis crosses
    the slices, so only the data-parallel gradient reduction travels over the slow network."""
    devices = jax.devices() if devices is None else devices
    shape = mesh_shape(cfg, len(devices))
    slices = n_slices(devices)
    if slices > 1:
        if shape[0] % slices:
            raise UsageError(f"mesh.data={shape[0]} must be a multiple of the {slices} slices "
                             "(the data axis spans slices)")
        per_slice = (shape[0] // slices, *shape[1:])
        grid = jax.experimental.mesh_utils.create_hybrid_device_mesh(
            per_slice, (slices, 1, 1, 1), devices)
    else:
        try:
            grid = jax.experimental.mesh_utils.create_device_mesh(shape, devices)
        except (AssertionError, ValueError, NotImplementedError):
            grid = np.asarray(devices).reshape(shape)
    mesh = Mesh(grid, AXES)
    # Every run, evaluation and compile builds its mesh here, before compiling anything.
    xla_cache.off_for_cpu_collectives(mesh)
    return mesh


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over every data-parallel mesh axis."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (scalars such as the step's LR multiplier)."""
    return NamedSharding(mesh, PartitionSpec())


def global_batch(local: dict, sharding: NamedSharding) -> dict:
    """This process's rows of a batch (numpy) -> global arrays split by `sharding`. One
    process: the whole batch in one device_put (one transfer call for all its arrays, about a
    millisecond a step less than one call per array on a trivial model)."""
    if jax.process_count() == 1:
        return jax.device_put({k: np.asarray(v) for k, v in local.items()}, sharding)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in local.items()}


def data_parallel_size(mesh: Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The mesh axes one dimension of a PartitionSpec names (a name, a tuple, or None)."""
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def check_divisible(abstract_params, shardings) -> None:
    """Every sharded parameter axis must split evenly over its mesh axes; say which does not
    (XLA's own error names neither the parameter nor the config field)."""
    def check(path, x, sharding):
        for dim, entry in zip(x.shape, sharding.spec):
            axes = _axes(entry)
            parts = math.prod(sharding.mesh.shape[a] for a in axes)
            if dim % parts:
                name = jax.tree_util.keystr(path)
                hint = " (model.vocab_multiple pads the vocabulary)" if "embed" in name else ""
                raise UsageError(f"parameter {name} of shape {x.shape} cannot be split {parts} "
                                 f"ways over mesh axes {axes}; change the mesh or the model "
                                 f"shape{hint}")
    jax.tree_util.tree_map_with_path(check, abstract_params, shardings)


def zero1_shardings(shapes, shardings, mesh: Mesh):
    """ZeRO-1: each array's sharding with the `data` axis added on its first dimension that the
    extra split divides evenly (after the axes it has already), so each data-parallel rank
    holds and updates 1/data of it; an array no dimension of which divides stays as it was.
    The parameters' own sharding has no `data`, so XLA gathers the updated shares back; the
    collectives are its choice (compiled for v5p it kept all-reduces: docs/training.md)."""
    size = mesh.shape.get("data", 1)
    if size == 1:
        return shardings

    def split(shape, sharding):
        spec = list(sharding.spec) + [None] * (len(shape.shape) - len(sharding.spec))
        if any("data" in _axes(entry) for entry in spec):
            return sharding
        for dim, entry in enumerate(spec):
            axes = _axes(entry)
            split_by = math.prod(mesh.shape[a] for a in axes) * size
            if shape.shape[dim] % split_by == 0:
                spec[dim] = (*axes, "data")
                return NamedSharding(mesh, PartitionSpec(*spec))
        return sharding

    return jax.tree.map(split, shapes, shardings)


def logical_shardings(boxed, mesh: Mesh):
    """Shardings on `mesh` of a tree whose leaves carry logical axis names (nn.Partitioned:
    what `jax.eval_shape` of a model's init returns), by the logical rules."""
    return nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, LOGICAL_RULES)
