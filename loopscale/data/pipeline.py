"""Grain assembly shared by every source: order, batching, per-process sharding, iterator state.

Order. The global example stream is a pure function of the seed: a finite training source is
shuffled with `MapDataset.shuffle(seed)` and repeated forever (grain reshuffles every epoch,
seeding epoch e with seed + e); the permutation task is already an endless i.i.d. stream.
Evaluation is the first `eval_batches * batch_size` examples of the eval split, in order.

Sharding. Global batch g is examples [g*B, (g+1)*B) of that stream. The stream is cut into
local batches of B/P examples and process p keeps local batches p, p+P, p+2P, ...: its share of
every global batch, reading nothing else. Concatenating the processes' batches in process order
gives the global batch, whatever P is.

Reading. Order, batching and sharding act on example *indices*; each local batch of indices is
then read in one call (`Examples.read`), so a file source answers a batch with one batched read
(text.PackedRecords: one fancy index of a memory-mapped array) and turns it into arrays with one
vectorised step.

State. `Dataset.iterator()` returns a grain `DatasetIterator`; `get_state()`/`set_state()` are
a small JSON-able dict. With orbax, save it beside the train state:

    import grain, orbax.checkpoint as ocp
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state),
        data=grain.checkpoint.CheckpointSave(data_iter)))
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        data=grain.checkpoint.CheckpointRestore(data_iter)))  # sets data_iter's state in place

(grain's handler names its file after `jax.process_index()`, so each host restores its own.)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from loopscale.errors import UsageError

SPLITS = ("train", "eval")


@dataclasses.dataclass(frozen=True)
class Examples:
    """An indexed set of examples (`length` may be sys.maxsize: endless generated data), read a
    batch at a time: `read(indices)` returns the examples at those indices, stacked."""

    length: int
    read: Callable[[np.ndarray], Any]


def stack(items: Sequence[Any]) -> Any:
    """Items (arrays or flat dicts of arrays) -> one batch with a new leading axis."""
    if isinstance(items[0], dict):
        return {k: np.stack([item[k] for item in items]) for k in items[0]}
    return np.stack(items)


@dataclasses.dataclass(frozen=True)
class Dataset:
    """What the trainer gets from `make_dataset`."""

    ds: grain.IterDataset
    vocab_size: int
    split: str
    local_batch_size: int
    num_batches: int | None  # eval: batches each process yields; train: None (endless)

    def iterator(self) -> grain.DatasetIterator:
        """A fresh iterator at the start of the stream; restore a checkpoint with set_state."""
        return iter(self.ds)


def _default_absl_flags() -> None:
    """grain's worker processes read absl flags (profiling switches); the loopscale command line
    parses its own flags privately, so unless some entry point parsed the global ones, mark
    them parsed so that grain sees its defaults instead of raising UnparsedFlagAccessError."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def local_batch_size(batch_size: int, process_index: int, process_count: int) -> int:
    if process_count < 1 or not 0 <= process_index < process_count:
        raise UsageError(f"process_index={process_index} is not in [0, {process_count})")
    if batch_size % process_count:
        raise UsageError(
            f"train.batch_size={batch_size} is not divisible by the {process_count} processes"
        )
    return batch_size // process_count


def ordered(examples: grain.MapDataset, split: str, seed: int, n_eval: int) -> grain.MapDataset:
    """The global example stream of a split (see the module docstring), here of indices."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    if split == "eval":
        if len(examples) < n_eval:
            raise UsageError(
                f"the eval split holds {len(examples)} sequences, fewer than "
                f"train.eval_batches * train.batch_size = {n_eval}"
            )
        return examples[:n_eval]
    if len(examples) >= sys.maxsize:  # already endless (generated data)
        return examples
    if len(examples) == 0:
        raise UsageError("the training split is empty")
    # grain's shuffle seeds are 32-bit; shuffle before repeat so epochs do not mix.
    return examples.shuffle(seed=seed % 2**32).repeat()


def assemble(
    examples: Examples,
    *,
    vocab_size: int,
    split: str,
    seed: int,
    batch_size: int,
    eval_batches: int,
    process_index: int,
    process_count: int,
    worker_count: int,
) -> Dataset:
    """Examples -> this process's batches."""
    b_local = local_batch_size(batch_size, process_index, process_count)
    stream = ordered(grain.MapDataset.range(examples.length), split, seed, eval_batches * batch_size)
    index_batches = stream.batch(b_local, drop_remainder=True)[process_index::process_count]
    batches = index_batches.map(examples.read)
    # A few threads and a short prefetch: data is small and CPUs are shared with the trainer.
    ds = batches.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))
    if worker_count > 0:
        _default_absl_flags()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    num_batches = eval_batches if split == "eval" else None
    return Dataset(ds, vocab_size, split, b_local, num_batches)
