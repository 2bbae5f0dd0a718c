"""Log-likelihoods of continuations given contexts, batched on a run's mesh: the scorer of
`loopscale eval --what=mc`.

Each request (context, continuation) is tokenised with the run's own tokenizer the way
lm-evaluation-harness does it (context + continuation encoded whole, the continuation being
the tokens after the context's own encoding, which keeps a subword tokenizer's merges across
the boundary as the model saw them in training), opened with the end-of-document token (every
document in the packed training stream starts right after one), and left-truncated to the
model's `train.seq_len` + 1 tokens so the continuation is kept whole. Rows are padded on the
right (causal attention: padding after a row never changes its positions) into batches of
`train.batch_size` rows of `seq_len` positions, one compiled shape for every batch, and
`score_step` returns each row's sum of continuation log-probabilities and token count, in the
train step's micro-batches with the vocabulary read out `train.ce_chunk` positions at a time
(model/loss.py), so nothing beyond (micro-batch, chunk, V) logits is ever whole.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config import Config
from loopscale.config.schema import DataSource, ModelConfig, Tokenizer, TrainConfig
from loopscale.data import text, tfds_source
from loopscale.data.tokenizer import ByteTokenizer, TextTokenizer
from loopscale.errors import UsageError
from loopscale.model import LoopedLM
from loopscale.model.loss import token_losses
from loopscale.parallel import mesh as mesh_lib
from loopscale.train.step import micro_batches, readout_fn

_CORPORA = {DataSource.TEXT: text.text_corpus, DataSource.TFDS: tfds_source.tfds_corpus}


@dataclasses.dataclass(frozen=True)
class Request:
    context: str
    continuation: str


@dataclasses.dataclass(frozen=True)
class Scores:
    """Per request: the continuation's summed log-probability (nats), its tokens scored, and
    whether its context was cut to fit the model's sequence length."""

    logprob: np.ndarray  # (N,) float64
    tokens: np.ndarray  # (N,) int
    truncated: np.ndarray  # (N,) bool


def run_tokenizer(config: Config) -> TextTokenizer:
    """The tokenizer the run trained with (UsageError if its data is not text)."""
    data = config.data
    if data.source not in _CORPORA:
        raise UsageError(f"--what=mc needs a run trained on text; {config.name} trains on "
                         f"data.source={data.source.value}, which has no tokenizer for text")
    if data.tokenizer is Tokenizer.BYTE:
        return ByteTokenizer()  # no corpus needed (a run evaluated away from its text files)
    # A SentencePiece model is keyed by its corpus: the packed cache's, rebuilt if missing.
    return text.packed_corpus(_CORPORA[data.source](data), data, config.train.seq_len).tokenizer


def encode(tok: TextTokenizer, request: Request, seq_len: int) -> tuple[np.ndarray, int, bool]:
    """(tokens, continuation length, truncated): at most seq_len + 1 tokens, whose last
    `continuation length` ones are the continuation's."""
    whole = tok.encode(request.context + request.continuation)
    n_ctx = len(tok.encode(request.context))
    cont = whole[n_ctx:] if len(whole) > n_ctx else tok.encode(request.continuation)
    tokens = np.concatenate([[tok.eos_id], whole[:n_ctx], cont]).astype(np.int32)
    truncated = len(tokens) > seq_len + 1
    tokens = tokens[-(seq_len + 1):]
    return tokens, min(len(cont), len(tokens) - 1), truncated


def score_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
               ) -> dict[str, jax.Array]:
    """Per row: the sum of log P(target) over the masked positions, and their count (B,)."""
    readout = readout_fn(model, params)

    def rows(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
        ce_BxT, _ = token_losses(readout, out.exit_hidden[-1], micro["targets"], train.ce_chunk)
        mask_BxT = micro["mask"].astype(jnp.float32)
        return {"logprob": -jnp.sum(ce_BxT * mask_BxT, axis=1),
                "tokens": jnp.sum(mask_BxT, axis=1)}

    if train.grad_accum == 1:
        return rows(batch)
    parts = jax.lax.map(rows, micro_batches(batch, train.grad_accum))
    # Micro-batch i holds rows i, i + accum, ...: (accum, B/accum) back to the rows' order.
    return jax.tree.map(lambda x_AxR: x_AxR.T.reshape(-1), parts)


@functools.lru_cache(maxsize=8)
def _jitted(model: ModelConfig, train: TrainConfig, n_loops: int, mesh: jax.sharding.Mesh):
    """One compiled scorer per (model, train shape, mesh): evaluations in one process share it.
    Per-row results are tiny, so they come back replicated to every process."""
    return jax.jit(functools.partial(score_step, model=LoopedLM(model), train=train,
                                     n_loops=n_loops),
                   out_shardings=mesh_lib.replicated(mesh))


def _batches(encoded: list[tuple[np.ndarray, int, bool]], batch_size: int, seq_len: int):
    """Padded (batch_size, seq_len) batches of the encoded requests, in order; the last one
    filled up with empty rows (mask all false)."""
    for start in range(0, len(encoded), batch_size):
        inputs = np.zeros((batch_size, seq_len), np.int32)
        targets = np.zeros((batch_size, seq_len), np.int32)
        mask = np.zeros((batch_size, seq_len), bool)
        for row, (tokens, n_cont, _) in enumerate(encoded[start:start + batch_size]):
            n = len(tokens) - 1
            inputs[row, :n], targets[row, :n] = tokens[:-1], tokens[1:]
            mask[row, n - n_cont:n] = True
        yield {"inputs": inputs, "targets": targets, "mask": mask}


def loglikelihoods(config: Config, params, mesh: jax.sharding.Mesh, tok: TextTokenizer,
                   requests: Sequence[Request]) -> Scores:
    """Each request's continuation log-likelihood under the run's model at its trained loop
    count, in batches of the run's batch size on `mesh` (`params` sharded on it)."""
    t = config.train
    encoded = [encode(tok, r, t.seq_len) for r in requests]
    step = _jitted(config.model, t, config.model.n_loops, mesh)
    sharding = mesh_lib.batch_sharding(mesh)
    p, n_proc = jax.process_index(), jax.process_count()
    rows = t.batch_size // n_proc  # each process places its own block of every batch's rows
    logprob, tokens = [], []
    with mesh_lib.activate(mesh):
        for batch in _batches(encoded, t.batch_size, t.seq_len):
            local = {k: v[p * rows:(p + 1) * rows] for k, v in batch.items()}
            out = jax.device_get(step(params, mesh_lib.global_batch(local, sharding)))
            logprob.append(np.asarray(out["logprob"], np.float64))
            tokens.append(np.asarray(out["tokens"]))
    n = len(requests)
    return Scores(logprob=np.concatenate(logprob)[:n] if n else np.zeros(0),
                  tokens=np.rint(np.concatenate(tokens)[:n]).astype(int) if n else np.zeros(0, int),
                  truncated=np.array([e[2] for e in encoded], bool))
