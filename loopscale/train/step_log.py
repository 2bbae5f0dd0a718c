"""What the host records of each train step it reads: the row (the step's own metrics, with the
learning rate, tokens, training FLOPs so far, step time, tokens/s, MFU and gradient oscillation
added on the host), the metrics log and progress bar it goes to, and the host-side watch that
rows and batches feed (divergence, gradient oscillation, unigram entropy), resumed from the
rows a checkpoint has seen. The loop that reads the steps is trainer.py.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable

import jax
import numpy as np

from loopscale import flops as flops_lib
from loopscale.config import Config
from loopscale.rundir.checkpoint import Restored
from loopscale.rundir.run import RunDirectory
from loopscale.train import diagnostics
from loopscale.train.peak import peak_flops


@dataclasses.dataclass(frozen=True)
class Pending:
    """A dispatched train step whose metrics the host has not read yet."""

    done: int  # the step count once it has run
    metrics: dict
    n_loops: int
    lr_factor: float
    dispatched: float  # time.time() when it was dispatched


def _host_row(metrics: dict) -> dict:
    """One step's metrics, already on the host, as a row's plain numbers and lists."""
    return {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist())
            for k, v in metrics.items()}


class Throughput:
    """The fields of a row that the host counts or times: lr, tokens, training FLOPs so far,
    step time, tokens/s and MFU."""

    def __init__(self, config: Config, accounting: dict, past_loops: Iterable[int]):
        """`past_loops`: the loop count of every step before the run's start."""
        self.config, self.train = config, config.train
        self.tokens_per_step = self.train.batch_size * self.train.seq_len
        # MFU counts model FLOPs, not recomputation or waste: `mfu` 6N per use with the
        # embedding and full attention matmuls, `mfu_maxtext` as MaxText counts (no embedding
        # lookup, causal attention: flops.maxtext_flops_per_token), both over one peak.
        self.model_flops_per_token = accounting["flops_per_token_by_convention"]["6n_attn"]
        self.maxtext_flops_per_token = flops_lib.maxtext_flops_per_token(config.model,
                                                                          self.train.seq_len)
        self.peak = peak_flops(self.train.peak_flops, config.model.dtype)
        self._flops_per_token: dict[int, float] = {}
        # Training compute spent so far, recomputed from the steps (the loop count of each step
        # is a function of seed and step), so it does not depend on which rows were logged.
        self.flops_done = sum(self.train_flops_per_token(n) for n in past_loops) \
            * self.tokens_per_step
        self.last_read = time.time()

    def train_flops_per_token(self, n_loops: int) -> float:
        if n_loops not in self._flops_per_token:
            model = dataclasses.replace(self.config.model, n_loops=n_loops)
            self._flops_per_token[n_loops] = flops_lib.step_flops_per_token(
                model, self.train.seq_len, self.config.flop_convention, self.train.bptt_loops)
        return self._flops_per_token[n_loops]

    def restart(self) -> None:
        """The host's wait so far (a compile) is no step's time."""
        self.last_read = time.time()

    def step_times(self, pending: list[Pending]) -> list[float]:
        """The time each of the steps just read took: from when the first could start (its
        dispatch, or the last read) to now, shared evenly, the host having read them at once."""
        now = time.time()
        elapsed = now - max(pending[0].dispatched, self.last_read)
        self.last_read = now
        return [elapsed / len(pending)] * len(pending)

    def fields(self, p: Pending, dt: float) -> dict:
        """Step p's fields, taken once its metrics are on the host; dt its time."""
        self.flops_done += self.train_flops_per_token(p.n_loops) * self.tokens_per_step
        tokens = self.tokens_per_step
        return dict(step=p.done, n_loops=p.n_loops, lr=self.train.lr * float(p.lr_factor),
                    tokens=p.done * tokens, flops=self.flops_done, step_time_s=dt,
                    tokens_per_s=tokens / dt,
                    mfu=self.model_flops_per_token * tokens / dt / self.peak,
                    mfu_maxtext=self.maxtext_flops_per_token * tokens / dt / self.peak)


class Health:
    """The host-side watch over a run: the divergence rule (it stops the run), gradient
    oscillation (logged) and the unigram entropy of the training targets (the collapse rule's
    plateau), resumed from what the checkpoint kept of every step before it: the unigram
    counts and the watch (`watch()`)."""

    def __init__(self, config: Config, data_vocab: int, restored: Restored, rows: list[dict]):
        vocab = max(config.model.vocab_size, data_vocab)
        self.divergence = diagnostics.DivergenceRule(
            ceiling=diagnostics.DivergenceRule.ceiling_for(vocab))
        self.oscillation = diagnostics.GradientOscillation()
        self.unigram = diagnostics.UnigramEntropy(vocab)
        # Counts of the steps before the start come from the checkpoint; a checkpoint written
        # before they were kept leaves the entropy unknown (None) rather than wrong.
        counts = restored.unigram_counts
        self.unigram_known = counts is not None and len(counts) in (0, vocab)
        if self.unigram_known and len(counts):
            self.unigram.counts[:] = counts
        if restored.watch is not None:
            self.divergence.resume(restored.watch["divergence"])
            for norm in restored.watch["grad_norms"]:
                self.oscillation.update(norm)
            return
        # A checkpoint written before the watch was kept: replayed over the rows it has seen,
        # which is exact only when every step was logged (train.log_every 1).
        for row in rows:
            if "grad_norm" in row:
                self.oscillation.update(row["grad_norm"])
                self.divergence.check(diagnostics.watched_loss(row))

    def watch(self) -> dict:
        """What a checkpoint keeps of the divergence rule and the oscillation window."""
        return {"divergence": self.divergence.state(),
                "grad_norms": [float(n) for n in self.oscillation.norms]}

    def entropy(self) -> float | None:
        return self.unigram.value() if self.unigram_known else None


class StepLog:
    """The run's rows: those kept from before the start, then one per train step read and one
    per evaluation. Train rows go to the run directory every train.log_every steps and at the
    last step, evaluations always; on a terminal, process 0 also shows a progress bar. A
    context manager: leaving it closes the bar."""

    def __init__(self, run: RunDirectory, rows: list[dict], config: Config,
                 throughput: Throughput, health: Health, start: int):
        self.run, self.rows, self.train = run, rows, config.train
        self.throughput, self.health = throughput, health
        self.start = self.done = start  # done: the step count of the last step read
        self.progress = None
        if jax.process_index() == 0 and sys.stderr.isatty():
            from tqdm import tqdm

            self.progress = tqdm(total=self.train.steps, initial=start, desc=config.name,
                                 unit="step")

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.close()

    def logged(self, done: int) -> bool:
        """Whether the step that brings the count to `done` is written to the run directory."""
        return done % self.train.log_every == 0 or done == self.train.steps

    def read(self, pending: list[Pending], extra: dict) -> str | None:
        """Waits for the steps in `pending` (dispatched in this order), fetching their metrics
        in one transfer, and takes their rows in order, `extra` joining the last one's; returns
        why the run diverged at the first step that did (the rows after it are not taken)."""
        fetched = jax.device_get([p.metrics for p in pending])
        for i, (p, metrics, dt) in enumerate(zip(pending, fetched,
                                                 self.throughput.step_times(pending))):
            row = _host_row(metrics)
            if "residual_norm" in row:  # a shared step's has room for every count: its last
                row["residual_norm"] = row["residual_norm"][-p.n_loops:]
            row.update(**self.throughput.fields(p, dt),
                       **self.health.oscillation.update(row["grad_norm"]),
                       **(extra if i == len(pending) - 1 else {}))
            self.done = p.done
            self.rows.append(row)
            if self.logged(p.done):
                self.run.log(row)
            if self.progress:
                self.progress.update(1)
                self.progress.set_postfix(loss=f"{row['loss']:.3f}")
            if reason := self.health.divergence.check(diagnostics.watched_loss(row)):
                return reason
        return None

    def evaluation(self, held_out: dict) -> None:
        """Logs a held-out evaluation at the last step read."""
        self._add({"step": self.done, **held_out})

    def final_evaluation(self, evaluate) -> dict:
        """The evaluation at train.steps: the row already logged (a finished run re-run, its
        summary.json lost, holds it), else `evaluate()`, logged now."""
        steps = self.train.steps
        final = next((r for r in self.rows if r["step"] == steps and "eval_loss" in r), None)
        if final is None:
            final = self._add({"step": steps, **evaluate()})
        return final

    def _add(self, row: dict) -> dict:
        self.rows.append(row)
        self.run.log(row)
        return row
