"""A tfds text dataset prepared locally (ArrayRecord, no download, no TensorFlow) and read back
through `tfds.data_source`."""

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import tensorflow_datasets as tfds

from loopscale.config import base_config, parse
from loopscale.data import make_dataset, tokenizer
from loopscale.errors import UsageError

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def doc(i: int) -> str:
    return f"<doc {i:03d}> " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(20 + i % 7))


# skip_registration: the loader must find the dataset from its prepared files alone, as it
# would for a dataset whose builder code is not imported.
class LoopscaleTinyText(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version("1.0.0")
    SPLITS: ClassVar[dict] = {"train": range(60), "test": range(100, 110)}

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {"body": tfds.features.Text(), "id": tfds.features.Scalar(np.int32)}
            ),
        )

    def _split_generators(self, dl_manager):
        return {name: self._generate_examples(ids) for name, ids in self.SPLITS.items()}

    def _generate_examples(self, ids):
        for i in ids:
            yield i, {"body": doc(i), "id": i}


class LoopscaleTinyTrainOnly(LoopscaleTinyText, skip_registration=True):
    SPLITS: ClassVar[dict] = {"train": range(60)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tfds")
    for cls in (LoopscaleTinyText, LoopscaleTinyTrainOnly):
        cls(data_dir=str(path), file_format="array_record").download_and_prepare()
    return path


def configs(tmp_path, data_dir, name="loopscale_tiny_text", key="body", seq_len=48):
    cfg = parse(base_config())
    data = dataclasses.replace(
        cfg.data,
        source=cfg.data.source.TFDS,
        tfds_name=name,
        tfds_data_dir=str(data_dir),
        tfds_text_key=key,
        cache_dir=str(tmp_path / "cache"),
        val_fraction=0.1,
    )
    train = dataclasses.replace(cfg.train, seq_len=seq_len, batch_size=4, eval_batches=2)
    return data, train


def doc_ids(batches) -> set[int]:
    tok = tokenizer.ByteTokenizer()
    found = set()
    for b in batches:
        for row in b["inputs"]:
            for part in tok.decode(row).split("<doc ")[1:]:
                if len(part) >= 3 and part[:3].isdigit():
                    found.add(int(part[:3]))
    return found


def test_train_and_held_out_splits(tmp_path, data_dir):
    data, train = configs(tmp_path, data_dir)
    tr, ev = make_dataset(data, train, 0, "train"), make_dataset(data, train, 0, "eval")
    assert tr.vocab_size == 256
    it = tr.iterator()
    batches = [next(it) for _ in range(12)]
    b = batches[0]
    assert b["inputs"].shape == (4, 48) and b["inputs"].dtype == np.int32
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
    # the text is what the builder wrote
    text = tokenizer.ByteTokenizer().decode(np.concatenate(b["inputs"]))
    assert any(w in text for w in WORDS)
    train_ids, eval_ids = doc_ids(batches), doc_ids(ev.iterator())
    assert train_ids and train_ids <= set(range(60))
    assert eval_ids and eval_ids <= set(range(100, 110))  # the dataset's own test split


def test_without_held_out_split_the_end_of_train_is_used(tmp_path, data_dir):
    data, train = configs(tmp_path, data_dir, name="loopscale_tiny_train_only")
    it = make_dataset(data, train, 0, "train").iterator()
    train_ids = doc_ids([next(it) for _ in range(30)])
    eval_ids = doc_ids(make_dataset(data, train, 0, "eval").iterator())
    assert eval_ids and train_ids and not train_ids & eval_ids
    assert eval_ids <= set(range(60))


def test_second_run_reuses_the_cache(tmp_path, data_dir, monkeypatch):
    from loopscale.data import tfds_source

    data, train = configs(tmp_path, data_dir)
    first = next(make_dataset(data, train, 3, "train").iterator())
    monkeypatch.setattr(tfds_source, "_read_documents", lambda *a: 1 / 0)
    again = next(make_dataset(data, train, 3, "train").iterator())
    np.testing.assert_array_equal(first["inputs"], again["inputs"])


def test_bad_names_are_usage_errors(tmp_path, data_dir):
    data, train = configs(tmp_path, data_dir, key="text")
    with pytest.raises(UsageError, match="tfds_text_key"):
        make_dataset(data, train, 0, "train")
    data, train = configs(tmp_path, data_dir, name="no_such_dataset_here")
    with pytest.raises(UsageError, match="tfds_name"):
        make_dataset(data, train, 0, "train")
