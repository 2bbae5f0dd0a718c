"""Tokenizers for the text sources: UTF-8 bytes (the default) or a SentencePiece model.

Both map a string to an int32 array and expose `vocab_size`, `eos_id` (appended after every
document when documents are packed) and `fingerprint` (part of the packed cache's key, so a
different tokenizer can never read another one's cache).

The SentencePiece model is trained here, on the corpus being packed, the first time it is
needed, and kept next to the packed caches under a name keyed by the corpus and the vocabulary
size; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from loopscale.config.schema import DataConfig, Tokenizer
from loopscale.errors import UsageError
from loopscale.files import write_atomic


class TextTokenizer(Protocol):
    vocab_size: int
    eos_id: int
    fingerprint: str

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256). Byte 0 (NUL) never occurs in real text, so it doubles
    as the end-of-document token and the vocabulary stays exactly 256."""

    vocab_size = 256
    eos_id = 0
    fingerprint = "byte-v1"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(int(i) for i in ids if int(i) != self.eos_id)
        return data.decode("utf-8", errors="replace")


class SentencePieceTokenizer:
    """A trained SentencePiece model (its serialized proto is the whole state)."""

    def __init__(self, model_proto: bytes):
        import sentencepiece as spm  # imported here: byte-level runs never need it

        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.vocab_size = int(self._sp.get_piece_size())
        self.eos_id = int(self._sp.eos_id())
        self.fingerprint = "spm-" + hashlib.sha256(model_proto).hexdigest()[:16]

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._sp.encode(text), dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids if int(i) != self.eos_id])

    def __getstate__(self) -> bytes:  # grain may pickle pipeline pieces into worker processes
        return self._proto

    def __setstate__(self, proto: bytes) -> None:
        self.__init__(proto)


# SentencePiece silently drops training sentences longer than max_sentence_length bytes, so long
# lines are cut into pieces of at most this many characters (4 bytes each at worst in UTF-8).
_SPM_MAX_CHARS = 4096


def _sentences(documents: Iterable[str]) -> Iterator[str]:
    for doc in documents:
        for line in doc.split("\n"):
            for start in range(0, len(line), _SPM_MAX_CHARS):
                piece = line[start : start + _SPM_MAX_CHARS]
                if piece.strip():
                    yield piece


def train_sentencepiece(documents: Iterable[str], vocab_size: int) -> SentencePieceTokenizer:
    """Trains a BPE SentencePiece model on `documents`; returns it (nothing is written)."""
    import sentencepiece as spm

    # Every byte gets a piece (byte_fallback), so any text round-trips; plus unk, eos and "\n".
    min_vocab = 256 + 3
    if vocab_size < min_vocab:
        raise UsageError(f"data.spm_vocab_size={vocab_size} must be at least {min_vocab}")
    spm.set_random_generator_seed(0)  # deterministic when SentencePiece samples sentences
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(documents),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            byte_fallback=True,
            # identity normalisation and kept whitespace: decode(encode(text)) == text
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            user_defined_symbols=["\n"],
            max_sentence_length=4 * _SPM_MAX_CHARS,
            unk_id=0,
            eos_id=1,
            bos_id=-1,
            pad_id=-1,
            num_threads=max(1, min(4, os.cpu_count() or 1)),
            minloglevel=2,
        )
    except RuntimeError as e:  # e.g. a corpus too small for the requested vocabulary
        raise UsageError(f"sentencepiece training failed: {str(e).splitlines()[0]}") from None
    return SentencePieceTokenizer(model.getvalue())


def make_tokenizer(
    data: DataConfig,
    corpus_key: str,
    documents: Callable[[], Iterable[str]],
    cache_dir: Path,
) -> TextTokenizer:
    """The configured tokenizer; a SentencePiece model is trained once per (corpus, vocab size)
    and reused from `cache_dir` afterwards. `documents` is only called when training."""
    if data.tokenizer is Tokenizer.BYTE:
        return ByteTokenizer()
    key = hashlib.sha256(f"{corpus_key}|bpe|{data.spm_vocab_size}".encode()).hexdigest()[:16]
    path = cache_dir / f"spm-{key}.model"
    if path.exists():
        return SentencePieceTokenizer(path.read_bytes())
    tok = train_sentencepiece(documents(), data.spm_vocab_size)
    write_atomic(path, tok.__getstate__())
    return tok
