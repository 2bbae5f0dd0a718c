"""The mesh axes and the rules that map the model's logical axis names onto them.

They live with the model (which names the axes, and whose dropless MoE shards over the batch
axes) and are read by the trainer (parallel/mesh.py builds the mesh and puts the rules in context).
"""

import jax
from jax.sharding import AbstractMesh, PartitionSpec

AXES = ("data", "fsdp", "tensor", "expert")

# Logical name -> mesh axes, tried in order; flax skips a mesh axis already used by an earlier
# dimension of the same array. Parameters and activations use separate names (as MaxText does)
# because one name cannot serve both: a parameter's `embed` axis is split over `fsdp` (ZeRO-3),
# while an activation's hidden axis must stay whole, its batch axis taking `fsdp` instead.
PARAM_RULES = (
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("expert", "expert"),
    ("layers", None),
    ("loops", None),  # per-loop parameters (loop_modulation=film), one row per loop index
)
# Activations: rows of the batch over every data-parallel axis (`expert` too, so expert-parallel
# devices still split the batch); heads, FFN width and vocabulary over `tensor`.
ACTIVATION_RULES = (
    ("act_batch", ("data", "fsdp", "expert")),  # first: BATCH_AXES reads it
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)
LOGICAL_RULES = PARAM_RULES + ACTIVATION_RULES
BATCH_AXES = ACTIVATION_RULES[0][1]


def free_batch_axes(mesh: AbstractMesh) -> tuple[str, ...]:
    """The mesh's data-parallel axes not already manual (none without a mesh in context), in
    the order of the activations' batch sharding, so a shard_map over them moves no data."""
    return tuple(a for a in BATCH_AXES if a in mesh.axis_names and a not in mesh.manual_axes)


def manual_batch_axes(mesh: AbstractMesh) -> tuple[str, ...]:
    """The data-parallel axes a shard_map in context has made manual (train/step.py
    `local_gradients`): a statistic of the whole batch must be reduced over them."""
    return tuple(a for a in BATCH_AXES if a in mesh.manual_axes)


def current_platform() -> str:
    """The platform the model is being traced for: the mesh in context's (a TPU topology when
    `loopscale compile` compiles for one on this CPU), else JAX's default backend."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device.platform if device is not None else jax.default_backend()


def _names(entry) -> tuple[str, ...]:
    """One PartitionSpec entry (None, an axis or a tuple of axes) as a tuple of axes."""
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def manual_part(spec: PartitionSpec, manual: tuple[str, ...]) -> PartitionSpec:
    """A stored partitioning limited to a shard_map's manual axes: a partial-auto shard_map's
    specs may name no other axis (the compiler keeps splitting the rest as stored)."""
    return PartitionSpec(*(tuple(a for a in _names(e) if a in manual) or None for e in spec))


def gather(w: jax.Array, spec: PartitionSpec) -> jax.Array:
    """Inside a shard_map: the whole array from this device's part of it (split as `spec`,
    manual axes only, says). Its transpose reduce-scatters a gradient back to the parts."""
    for dim, entry in enumerate(spec):
        if entry:
            w = jax.lax.all_gather(w, entry, axis=dim, tiled=True)
    return w


def reduce_to(g: jax.Array, spec: PartitionSpec, manual: tuple[str, ...]) -> jax.Array:
    """Inside a shard_map manual over `manual`: the sum over those axes of every device's
    whole `g`, left split as `spec` (manual axes only) says: a reduce-scatter over the axes
    that split it, then an all-reduce of the part over the others."""
    scattered: tuple[str, ...] = ()
    for dim, entry in enumerate(spec):
        if entry:
            g = jax.lax.psum_scatter(g, entry, scatter_dimension=dim, tiled=True)
            scattered += _names(entry)
    rest = tuple(a for a in manual if a not in scattered)
    return jax.lax.psum(g, rest) if rest else g
