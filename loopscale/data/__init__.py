"""Data for training and evaluation, as grain pipelines: `make_dataset` is the one entry point.

    ds = make_dataset(cfg.data, cfg.train, seed=cfg.seed, split="train",
                      process_index=jax.process_index(), process_count=jax.process_count())
    it = ds.iterator()          # grain DatasetIterator; it.get_state() / it.set_state(state)
    batch = next(it)            # dict of numpy arrays, leading dim train.batch_size // P

Every source yields `inputs` and `targets` (B, T) int32 and `mask` (B, T) bool (where the loss
counts). The permutation task adds `answer_pos`, `answer`, `start`, `hops` (B,) int32 and
`hop_labels` (B, hops_max) int32 + `hop_mask` (B, hops_max) bool (data/permutation.py).
`ds.vocab_size` is the number of token ids the data uses; the model's vocab must cover it.
Checkpointing the iterator with orbax: see data/pipeline.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from loopscale.config.schema import DataConfig, DataSource, TrainConfig
from loopscale.data import permutation, text, tfds_source
from loopscale.data.pipeline import Dataset, Examples, assemble, stack

__all__ = ["Dataset", "make_dataset"]


def _permutation(data: DataConfig, train: TrainConfig, seed: int, split: str):
    task = permutation.make_task(data, seed, split, train.seq_len)
    # Generated data: the train split is an endless index space, eval a finite one.
    n = sys.maxsize if split == "train" else train.eval_batches * train.batch_size
    return Examples(n, lambda indices: stack([task(int(i)) for i in indices])), task.vocab_size


def _packed(corpus_fn: Callable[[DataConfig], text.Corpus]):
    def build(data: DataConfig, train: TrainConfig, seed: int, split: str):
        packed = text.packed_corpus(corpus_fn(data), data, train.seq_len)
        path = packed.train_path if split == "train" else packed.val_path
        source = text.PackedRecords(path)
        examples = Examples(len(source),
                            lambda indices: text.lm_batch(source.__getitems__(indices)))
        return examples, packed.vocab_size

    return build


_SOURCES = {
    DataSource.PERMUTATION: _permutation,
    DataSource.TEXT: _packed(text.text_corpus),
    DataSource.TFDS: _packed(tfds_source.tfds_corpus),
}


def make_dataset(
    data: DataConfig,
    train: TrainConfig,
    seed: int,
    split: str,
    process_index: int = 0,
    process_count: int = 1,
) -> Dataset:
    """This process's batches of `split` ("train": endless, reshuffled every epoch; "eval":
    `train.eval_batches` fixed batches), in an order fixed by `seed`."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    examples, vocab_size = _SOURCES[data.source](data, train, seed, split)
    return assemble(
        examples,
        vocab_size=vocab_size,
        split=split,
        seed=seed,
        batch_size=train.batch_size,
        eval_batches=train.eval_batches,
        process_index=process_index,
        process_count=process_count,
        worker_count=data.worker_count,
    )
