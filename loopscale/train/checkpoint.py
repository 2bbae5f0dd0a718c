"""Checkpoints: model, optimiser and data-iterator state saved together by one orbax
CheckpointManager (asynchronous), so a resumed run continues bit-for-bit where it stopped."""

from __future__ import annotations

import grain
import jax
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
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
