"""Training diagnostics of the two studies, and the rules that turn them into outcomes.

In the jitted step: routing overlap between loop passes (sparse-layers study). On the host:
gradient oscillation over a window, divergence (stop the run) and collapse (flag the run) rules
(FLT study). Every rule is stated in its docstring and recorded in summary.json.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


def routing_overlap(experts_KxLxBxTxk: jax.Array) -> dict[str, jax.Array]:
    """Per physical layer, a token's top-k expert set on pass t against pass t+1.

    Returns the shares of (token, layer) pairs whose sets are identical, share some but not all
    experts, or are disjoint, averaged over consecutive pass pairs and layers (the
    sparse-layers study compares passes 1 and 2; with more loops, every consecutive pair)."""
    a = experts_KxLxBxTxk[:-1, ..., :, None]
    b = experts_KxLxBxTxk[1:, ..., None, :]
    shared = jnp.sum(jnp.any(a == b, axis=-1), axis=-1)  # experts of pass t found in pass t+1
    k = experts_KxLxBxTxk.shape[-1]
    identical = jnp.mean(shared == k)
    disjoint = jnp.mean(shared == 0)
    return {"route_identical": identical, "route_partial": 1.0 - identical - disjoint,
            "route_disjoint": disjoint}


class GradientOscillation:
    """Standard deviation of the global gradient norm over the last `window` steps, relative to
    its mean (coefficient of variation, so it compares across runs of different scales), and the
    cosine between consecutive gradients when the step provides it."""

    def __init__(self, window: int = 50):
        self.norms = collections.deque(maxlen=window)

    def update(self, grad_norm: float) -> dict[str, float]:
        self.norms.append(grad_norm)
        values = np.asarray(self.norms)
        std = float(values.std()) if len(values) > 1 else 0.0
        mean = float(values.mean())
        return {"grad_norm_std": std, "grad_norm_cv": std / mean if mean > 0 else 0.0}


@dataclasses.dataclass
class DivergenceRule:
    """A run has diverged when (a) its loss is NaN or infinite; (b) a loss exceeds `ceiling`
    nats, which the trainer sets to 10 x ln(vocabulary), ten times the loss of guessing
    uniformly (a model that learns starts near ln(vocabulary) and never gets there, even on a
    spike); (c) the exponential moving average of the loss (factor 0.9) stays more than
    `margin` nats above its best value for `patience` consecutive steps; or (d) the run ends
    with that average more than `margin` nats above its first loss (a run shorter than
    `patience` that got worse than it started). (a)-(c) stop the run, (d) is checked at its end;
    each gives status `diverged`. The trainer feeds it the LM cross-entropy (`watched_loss`)."""

    margin: float = 2.0
    patience: int = 20
    ceiling: float = math.inf
    ema: float | None = None
    best: float = math.inf
    first: float | None = None
    strikes: int = 0

    def check(self, loss: float) -> str | None:
        if not math.isfinite(loss):
            return f"loss is {loss}"
        if loss > self.ceiling:
            return f"loss {loss:.4g} is over the ceiling of {self.ceiling:.3f} nats"
        self.first = loss if self.first is None else self.first
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss
        self.best = min(self.best, self.ema)
        self.strikes = self.strikes + 1 if self.ema > self.best + self.margin else 0
        if self.strikes >= self.patience:
            return (f"smoothed loss {self.ema:.3f} stayed over {self.margin} nats above its best "
                    f"{self.best:.3f} for {self.patience} steps")
        return None

    def state(self) -> dict:
        """The rule's running state as JSON (a best of inf, before any step, as None)."""
        return {"ema": self.ema, "best": None if math.isinf(self.best) else self.best,
                "first": self.first, "strikes": self.strikes}

    def resume(self, state: dict) -> None:
        """Takes up the running state `state()` gave."""
        self.ema, self.first, self.strikes = state["ema"], state["first"], state["strikes"]
        self.best = math.inf if state["best"] is None else state["best"]

    def check_end(self) -> str | None:
        """Rule (d), once the last step has been checked."""
        if self.ema is not None and self.ema > self.first + self.margin:
            return (f"the run ended with smoothed loss {self.ema:.3f}, over {self.margin} nats "
                    f"above its first loss {self.first:.3f}")
        return None

    @staticmethod
    def ceiling_for(vocab_size: int) -> float:
        return 10.0 * math.log(vocab_size)


def watched_loss(row: dict) -> float:
    """What the divergence rule reads from a logged training row: the LM cross-entropy `ce`,
    not the total objective `loss`, whose auxiliary terms (MoE balancing and z-losses, one CE
    per supervised loop or layer) move it away from the ln(vocabulary) scale the ceiling and
    the margin are set on; the total only when it is not finite, so that a NaN in an auxiliary
    term still stops the run at that step."""
    return row["ce"] if math.isfinite(row["loss"]) else row["loss"]


COLLAPSE_RULE = (
    "collapsed: after step 100, the mean training cross-entropy over the last 50 logged steps is "
    "within 0.05 nats of the unigram entropy of the training targets, and the last loop's "
    "residual norm grew more than 1.5x from step 100 to the end (PAPERS.md section 1)"
)


def collapsed(steps: list[int], losses: list[float], last_loop_residual: list[float],
              unigram_entropy: float) -> bool:
    """The FLT study's collapse (a high, flat loss with a still-growing residual norm), by
    COLLAPSE_RULE. It flags the run; it never stops it."""
    steps_arr = np.asarray(steps)
    after = steps_arr >= 100
    if not after.any() or steps_arr[-1] <= 100:
        return False
    tail = np.asarray(losses)[after][-50:]
    residual = np.asarray(last_loop_residual)[after]
    plateau = abs(float(tail.mean()) - unigram_entropy) < 0.05
    growing = residual[-1] > 1.5 * residual[0]
    return bool(plateau and growing)


def collapsed_run(rows: list[dict], unigram_entropy: float) -> bool:
    """COLLAPSE_RULE on a run's logged training rows. It reads their cross-entropy: the
    unigram entropy is a cross-entropy, and the total loss sits above it by the auxiliary
    terms (MoE balancing and router z-losses, about 0.014 nats at their default weights and a
    uniform router; the logit z-loss; with intermediate supervision one CE per supervised
    loop), enough to hide a plateau inside the rule's 0.05-nat band or fake one."""
    return collapsed([r["step"] for r in rows], [r["ce"] for r in rows],
                     [r["residual_norm"][-1] for r in rows], unigram_entropy)


class UnigramEntropy:
    """Entropy (nats) of the unigram distribution of the training targets seen so far: the
    loss of a model that ignores its context, the plateau a collapsed model sits on."""

    def __init__(self, vocab_size: int):
        self.counts = np.zeros(vocab_size, np.int64)

    def update(self, targets: np.ndarray, mask: np.ndarray) -> None:
        self.counts += np.bincount(targets[mask.astype(bool)].ravel(), minlength=len(self.counts))

    def value(self) -> float:
        p = self.counts[self.counts > 0] / max(1, self.counts.sum())
        return float(-(p * np.log(p)).sum())
