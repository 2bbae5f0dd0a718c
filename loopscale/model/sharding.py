"""The mesh axes and the rules that map the model's logical axis names onto them.

They live with the model (which names the axes, and whose dropless MoE shards over the batch
axes) and are read by the trainer (parallel/mesh.py builds the mesh and puts the rules in context).
"""

import jax
from jax.sharding import AbstractMesh

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


def current_platform() -> str:
    """The platform the model is being traced for: the mesh in context's (a TPU topology when
    `loopscale compile` compiles for one on this CPU), else JAX's default backend."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device.platform if device is not None else jax.default_backend()
