"""Checkpoints: model, optimiser and data-iterator state saved together by one orbax
CheckpointManager (asynchronous), so a resumed run continues bit-for-bit where it stopped."""

from __future__ import annotations

import grain
import jax
import optax
import orbax.checkpoint as ocp
from etils import epath


class Checkpointer:
    def __init__(self, directory: epath.Path, keep: int):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max(keep, 1), create=True, enable_async_checkpointing=True
        )
        self.manager = ocp.CheckpointManager(directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator) -> None:
        self.manager.save(step, force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
        ))

    def restore(self, step: int, abstract_state, data_iterator):
        """Restores into `abstract_state` (ShapeDtypeStructs carrying their shardings), so each
        array lands directly on its devices; the data iterator is restored in place."""
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=grain.checkpoint.CheckpointRestore(data_iterator),
        ))
        return restored.state

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree, shardings):
    """Shapes and dtypes of `tree` with `shardings` attached. optax's masked states (Muon's
    recipe masks its AdamW and Muon parts) hold an empty `MaskedNode` where the sharding tree,
    derived from the parameters' names, has a sharding: those stay empty."""
    def attach(x, s):
        if isinstance(x, optax.MaskedNode):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    return jax.tree.map(attach, tree, shardings, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
