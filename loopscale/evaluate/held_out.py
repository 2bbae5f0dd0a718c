"""`loopscale eval --data=FILES`: held-out text of the user's choosing instead of the run's own
held-out split, for a run trained on text.

The files (comma-separated files or globs, one document per file, as `data.paths`) are
tokenised with the run's own tokenizer (evaluate/mc_score.run_tokenizer: the byte tokenizer,
or the SentencePiece model trained on the run's training split), packed as the trainer packs
(documents + eos cut into sequences of seq_len + 1 tokens, the tail dropped) and read in the
order the run's held-out split is read: the first `--batches` batches of the run's batch size,
each process its rows. All of it is held out by construction: loopscale never trains on these
files unless the run's `data.paths` names them, which the user can see in its config.json.
"""

from __future__ import annotations

from loopscale.config import Config, DataSource
from loopscale.config.schema import TrainConfig
from loopscale.data import text
from loopscale.data.pipeline import Dataset, Examples, assemble
from loopscale.errors import UsageError
from loopscale.evaluate.mc_score import run_tokenizer

WHERE = "--data"


def fingerprint(paths: str) -> dict:
    """What a measurement on `paths` depends on: the files' content (suite.py keeps a result
    only while it is unchanged). Reads the files, so a bad glob is refused before loading."""
    docs = text.file_documents(paths, WHERE)
    return {"data": text.content_key("files", docs).split(":", 1)[1][:20]}


def dataset(config: Config, train: TrainConfig, paths: str, process_index: int,
            process_count: int) -> Dataset:
    """The held-out batches of `paths` as the run would read its own held-out split."""
    if config.data.source is DataSource.PERMUTATION:
        raise UsageError(f"{WHERE} needs a run trained on text; {config.name} trains on "
                         f"data.source=permutation")
    tok = run_tokenizer(config)
    docs = [tok.encode(d) for d in text.file_documents(paths, WHERE)]
    records_NxS = text.pack(docs, tok.eos_id, train.seq_len)
    available = len(records_NxS) // train.batch_size
    if available < train.eval_batches:
        raise UsageError(f"{WHERE}={paths} holds {len(records_NxS)} sequences of "
                         f"{train.seq_len + 1} tokens: {available} batches of "
                         f"{train.batch_size}, fewer than the {train.eval_batches} asked for "
                         f"(--batches)")
    examples = Examples(len(records_NxS), lambda idx: text.lm_batch(records_NxS[idx]))
    return assemble(examples, vocab_size=tok.vocab_size, split="eval", seed=config.seed,
                    batch_size=train.batch_size, eval_batches=train.eval_batches,
                    process_index=process_index, process_count=process_count, worker_count=0)
