"""Checkpoints: model, optimiser and data-iterator state saved together by one orbax
CheckpointManager (asynchronous), so a resumed run continues bit-for-bit where it stopped.

With them, what the host has tracked of every step so far, which metrics.jsonl (logged steps
only, every train.log_every) cannot give back: the unigram counts of the training targets (a
JSON list), so that the run's unigram entropy covers every step, not only those since the last
resume, and the host-side watch (the divergence rule's smoothed loss and strikes, the gradient
norms of the oscillation window), so that a resumed run decides and logs as one that never
stopped. Storing them is exact and costs two small files.

    checkpoints/STEP/state     the TrainState (step, params, opt_state): orbax's StandardSave
    checkpoints/STEP/data      the grain data iterator's state
    checkpoints/STEP/unigram   the counts (JSON)
    checkpoints/STEP/watch     the watch (JSON; checkpoints before 2026-12-06 have none)

`restore_params` reads the parameters alone (no optimiser, no data state) onto any shardings:
what evaluation needs (load.py).

Restoring verifies by restoring: a newest checkpoint that fails (truncated, files missing, a
write cut short by a full disk or a kill) is moved aside to `checkpoints/bad-STEP-TIME`, never
deleted, and the previous one is used. A second failure in a row is no damaged file but
something systematic: CheckpointError, and nothing more is moved.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

import grain
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint.checkpoint_managers import preservation_policy as preservation


class CheckpointError(Exception):
    """No checkpoint could be restored (the message is one line)."""


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    state: object
    unigram_counts: np.ndarray | None  # None: a checkpoint written before the counts were kept
    watch: dict | None  # None: a checkpoint written before the watch was kept


class _NoThreadTracebacks(logging.Filter):
    """Drops orbax's log record of an OSError raised in its save thread (a full disk): the same
    error reaches the trainer at the next save or at close, which reports it in one line, where
    orbax's record would print the whole traceback first."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, OSError) and "orbax" in record.pathname)


_QUIET = _NoThreadTracebacks()


class Checkpointer:
    """The run's checkpoints: the newest `keep` of them, and every one in `keep_steps` (a
    cooldown trunk's branch points). `read_only`: another run's checkpoints, read and never
    written, moved or deleted (a branch reading its trunk's while the trunk trains on)."""

    def __init__(self, directory: epath.Path, keep: int, keep_steps: Sequence[int] = (),
                 read_only: bool = False):
        logging.getLogger("absl").addFilter(_QUIET)  # once: a Filter is added only once
        policies = [preservation.LatestN(max(keep, 1))]
        if keep_steps:
            policies.append(preservation.CustomSteps(list(keep_steps)))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=preservation.AnyPreservationPolicy(policies), create=not read_only,
            read_only=read_only, enable_async_checkpointing=True)
        self.directory = epath.Path(directory)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator, unigram_counts: np.ndarray,
             watch: dict) -> None:
        self.manager.save(step, force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=grain.checkpoint.CheckpointSave(data_iterator),
            unigram=ocp.args.JsonSave([int(c) for c in unigram_counts]),
            watch=ocp.args.JsonSave(watch),
        ))

    def restore(self, step: int, abstract_state, data_iterator) -> Restored:
        """Restores into `abstract_state` (ShapeDtypeStructs carrying their shardings), so each
        array lands directly on its devices; the data iterator is restored in place."""
        items = dict(state=ocp.args.StandardRestore(abstract_state),
                     data=grain.checkpoint.CheckpointRestore(data_iterator))
        kept = {name for name in ("unigram", "watch")
                if (self.directory / str(step) / name).exists()}
        items.update({name: ocp.args.JsonRestore() for name in kept})
        restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        counts = np.asarray(restored.unigram, np.int64) if "unigram" in kept else None
        return Restored(step, restored.state, counts,
                        restored.watch if "watch" in kept else None)

    def restore_latest(self, abstract_state, data_iterator,
                       warn: Callable[[str], None]) -> Restored | None:
        """The newest checkpoint that restores (see the module docstring), or None if none does;
        `warn` gets one line for each checkpoint moved aside, as it is moved."""
        for attempt, step in enumerate(sorted(self.manager.all_steps(), reverse=True)):
            try:
                return self.restore(step, abstract_state, data_iterator)
            except Exception as e:  # orbax and tensorstore raise many types for a damaged file
                problem = one_line(e)
                if attempt:
                    raise CheckpointError(
                        f"checkpoint {step} does not restore either ({problem}); a second bad "
                        f"checkpoint in a row is not a damaged file, so it is left in place"
                    ) from e
                warn(f"checkpoint {step} does not restore ({problem}); moved to "
                     f"{self._move_aside(step).name}")
        return None

    def _move_aside(self, step: int) -> epath.Path:
        bad = self.directory / f"bad-{step}-{time.strftime('%Y%m%dT%H%M%S')}"
        (self.directory / str(step)).rename(bad)
        self.manager.reload()  # forget the step it had listed
        return bad

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def restore_params(directory: epath.Path, step: int, abstract_params):
    """The parameters of checkpoint `step` alone, into `abstract_params` (ShapeDtypeStructs
    carrying the shardings wanted: any mesh, not the one that trained them)."""
    item = {"params": abstract_params}
    args = ocp.args.PyTreeRestore(item=item, partial_restore=True,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(item))
    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.restore(epath.Path(directory) / str(step) / "state", args=args)["params"]


def one_line(e: BaseException) -> str:
    """An exception as one line of a message: its type and its message's first line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def abstract_like(tree, shardings):
    """Shapes and dtypes of `tree` with `shardings` attached. optax's masked states (Muon's
    recipe masks its AdamW and Muon parts) hold an empty `MaskedNode` where the sharding tree,
    derived from the parameters' names, has a sharding: those stay empty."""
    def attach(x, s):
        if isinstance(x, optax.MaskedNode):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

    return jax.tree.map(attach, tree, shardings, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
