"""The looped / MoE / muP model core (flax linen)."""

from loopscale.model.block import StreamEdit
from loopscale.model.loss import loss_loop_indices
from loopscale.model.mup import Role, lr_multipliers, param_roles
from loopscale.model.params import stack_layers, unstack_layers
from loopscale.model.transformer import LoopedLM, ModelOutputs

__all__ = [
    "LoopedLM", "ModelOutputs", "Role", "StreamEdit", "loss_loop_indices", "lr_multipliers",
    "param_roles", "stack_layers", "unstack_layers",
]
