"""A text dataset from TensorFlow Datasets, read through `tfds.data_source` (random access on the
ArrayRecord files of an already prepared `data_dir`; no TensorFlow and no download needed).

Each example's `data.tfds_text_key` feature is one document. The dataset's "train" split is the
training text; its "validation" split, else its "test" split, is the held-out text; a dataset
with neither has the end of "train" held out (`text.split_tail`). The documents then go
through the same tokenise-pack-cache path as local text (`text.packed_corpus`).
"""

from __future__ import annotations

import os

from loopscale.config.schema import DataConfig
from loopscale.data.text import Corpus
from loopscale.errors import UsageError

HELD_OUT_SPLITS = ("validation", "test")
_READ_CHUNK = 1024  # examples per bulk read (`__getitems__` reads a whole chunk in one call)


def _read_documents(name: str, data_dir: str | None, split: str, text_key: str) -> list[str]:
    import tensorflow_datasets as tfds

    source = tfds.data_source(name, data_dir=data_dir, split=split)
    docs: list[str] = []
    for start in range(0, len(source), _READ_CHUNK):
        for example in source.__getitems__(range(start, min(start + _READ_CHUNK, len(source)))):
            if text_key not in example:
                raise UsageError(
                    f"data.tfds_text_key={text_key!r} is not a feature of {name} "
                    f"(features: {', '.join(sorted(example))})"
                )
            value = example[text_key]
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            docs.append(str(value))
    return docs


def tfds_corpus(data: DataConfig) -> Corpus:
    """A `Corpus` over a prepared tfds dataset; its documents are read only on a cache miss."""
    import tensorflow_datasets as tfds  # imported here: a heavy import only tfds runs pay

    if not data.tfds_name:
        raise UsageError("data.source=tfds needs data.tfds_name")
    data_dir = os.path.expanduser(data.tfds_data_dir) if data.tfds_data_dir else None
    try:
        builder = tfds.builder(data.tfds_name, data_dir=data_dir)
        if not builder.is_prepared():  # a known dataset never downloaded here: no download now
            raise FileNotFoundError("it has not been prepared there")
        splits = dict(builder.info.splits)
    except Exception as e:  # noqa: BLE001 - tfds raises many types; all mean "not prepared"
        where = data_dir or "the default tfds data_dir"
        raise UsageError(
            f"data.tfds_name={data.tfds_name!r} is not a prepared dataset in {where}: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if "train" not in splits:
        raise UsageError(f"tfds dataset {data.tfds_name} has no train split ({', '.join(splits)})")
    held_out = next((s for s in HELD_OUT_SPLITS if s in splits), None)
    # The dataset's identity stands in for a content hash: hashing means reading everything,
    # which is exactly what a cache hit should avoid.
    sizes = ",".join(f"{s}={splits[s].num_examples}" for s in sorted(splits))
    key = (
        f"tfds:{builder.info.full_name}|{os.path.abspath(str(builder.data_dir))}|{sizes}"
        f"|{data.tfds_text_key}"
    )

    def read(split: str):
        return lambda: _read_documents(data.tfds_name, data_dir, split, data.tfds_text_key)

    val = read(held_out) if held_out else None
    return Corpus(key=key, documents=read("train"), val_documents=val)
