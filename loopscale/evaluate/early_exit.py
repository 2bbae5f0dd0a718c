"""Training-free early exit (the sparse-layers study's Table 7): per token, exit at the first
candidate exit whose logit-lens distribution has entropy below tau; sweep tau; report
perplexity against the FLOPs the skipped depth saves.

Candidates. A looped model (K > 1) may exit only at its loop boundaries 1 .. K-1; a model
without loops (K = 1) at any of its intermediate layers 1 .. L-1. The last candidate is always
the full model. A candidate's distribution is the model's own readout (final norm and
unembedding, model.readout) of the stream there, and the token's loss is that distribution's
cross-entropy of its target.

How exits are simulated. The model runs in full once; each token's prediction is then read at
its exit. So the keys and values a skipped token leaves at the depth it skipped are the ones
the full pass computed, as if the token had gone on for attention's sake only: later tokens
attend to full-depth keys and values. A deployed early exit must either compute those (saving
only the skipped token's FFN work) or copy the exit state into them (changing what later
tokens see); the figures here are therefore the study's training-free upper bound for quality
at a given saving, not a measured serving speed-up.

FLOPs saved. Forward FLOPs per token under the run's own `flop_convention` (flops.py): a layer
use costs the same at every depth, so a token exiting after u of the K*L layer uses saves
(K*L - u) * layer_use / forward_total. The logit-lens check at each candidate a token passes
costs an unembedding (2 * D * V per token, more than a layer at small widths); the study does
not charge it and neither do the headline figures, but `check_cost` gives it as a share of the
forward pass so the reader can.

Tau is swept over thresholds in nats from 0 (nobody exits) to just above ln V (everybody exits
at the first candidate), placed at the quantiles of the early candidates' entropies on the
first held-out batch (`tau_grid`); the saving grows with tau, and perplexity at 5/10/20/30%
saved is interpolated (log-perplexity linear in the saving) between the grid points around
it; `bracket_P` gives those two points' savings, so a coarse interpolation shows. The sums
are taken on the devices (one jitted step per held-out batch, in the train step's micro-batches
and `train.ce_chunk` positions at a time), so it runs at paper scale on the run's mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import FlopConvention, ModelConfig, TrainConfig
from loopscale.train.eval_loss import map_position_chunks, summed_over_micro_batches
from loopscale.errors import UsageError
from loopscale.flops import flops_per_token
from loopscale.model import LoopedLM
from loopscale.train.step import readout_fn

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

N_TAU = 161  # grid points; the study sweeps tau without saying how finely
SAVED_TARGETS = (5, 10, 20, 30)  # percent of forward FLOPs saved: the study's Table 7 columns


def tau_grid(vocab_size: int, sample: np.ndarray) -> np.ndarray:
    """Entropy thresholds (nats), increasing: 0 (nobody exits), just above ln V (the largest
    entropy a distribution can have: everybody exits at the first candidate), and between them
    the quantiles of `sample` (entropies at the early candidates on held-out tokens), so the
    thresholds sit where tokens' exits change and the saving grows in small steps even when
    the entropies crowd near ln V (an undertrained model) or near 0."""
    values = np.unique(sample)
    # Midway between neighbouring sampled entropies, not on them: a threshold equal to a
    # token's entropy would make its exit hang on rounding.
    inner = 0.5 * (values[:-1] + values[1:])
    if inner.size > N_TAU - 2:
        inner = inner[np.linspace(0, inner.size - 1, N_TAU - 2).round().astype(int)]
    return np.unique(np.concatenate([[0.0], inner, [math.log(vocab_size) * 1.001]]))


@dataclasses.dataclass(frozen=True)
class Candidates:
    """Where a model may exit: `uses[c]` layer uses done at candidate c (the last: all)."""

    uses: tuple[int, ...]
    at_loops: bool  # loop boundaries (looped) or layers (not looped)

    @classmethod
    def of(cls, cfg: ModelConfig, n_loops: int) -> Candidates:
        L = cfg.n_unique
        if n_loops > 1:
            return cls(tuple(L * (k + 1) for k in range(n_loops)), True)
        return cls(tuple(range(1, L + 1)), False)


def layer_use_flops(cfg: ModelConfig, seq_len: int, convention: FlopConvention
                    ) -> tuple[float, float]:
    """(forward FLOPs of one layer use, of the whole forward pass) per token under
    `convention`: a layer use is what one more loop of a one-layer block adds."""
    one = flops_per_token(dataclasses.replace(cfg, n_unique=1, n_loops=1), seq_len, convention)
    two = flops_per_token(dataclasses.replace(cfg, n_unique=1, n_loops=2), seq_len, convention)
    return (two - one) / 3.0, flops_per_token(cfg, seq_len, convention) / 3.0


def _per_candidate(params, micro, model: LoopedLM, cands: Candidates, n_loops: int,
                   chunk: int) -> tuple[jax.Array, jax.Array]:
    """Each token's logit-lens entropy (nats) and loss at every candidate: (C, B, T) each."""
    if not cands.at_loops:
        model = model.clone(collect_layers=True)
    readout = readout_fn(model, params)
    out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
    hidden_CxBxTxD = out.loop_hidden if cands.at_loops else out.layer_hidden[0]

    def per_chunk(h_CxBxcxD, targets_Bxc):
        entropy, loss = [], []
        for c in range(len(cands.uses)):
            logp_BxcxV = jax.nn.log_softmax(readout(h_CxBxcxD[c]).astype(jnp.float32), -1)
            entropy.append(-jnp.sum(jnp.exp(logp_BxcxV) * logp_BxcxV, -1))
            loss.append(-jnp.take_along_axis(logp_BxcxV, targets_Bxc[..., None], -1)[..., 0])
        return jnp.stack(entropy), jnp.stack(loss)  # (C, B, c) each

    return map_position_chunks(per_chunk, hidden_CxBxTxD, micro["targets"], chunk)


def entropy_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int
                 ) -> dict[str, jax.Array]:
    """The entropies at the early candidates (C-1, b, T) of the batch's first micro-batch and
    its mask: the sample `tau_grid` places its thresholds by."""
    cands = Candidates.of(model.cfg, n_loops)
    micro = jax.tree.map(lambda x: x[:x.shape[0] // train.grad_accum], batch)
    entropy_CxBxT, _ = _per_candidate(params, micro, model, cands, n_loops, train.ce_chunk)
    return {"entropy": entropy_CxBxT[:-1], "mask": micro["mask"]}


def exit_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int,
              taus: jax.Array) -> dict[str, jax.Array]:
    """Sums over a batch, per tau: the exit's token loss, the layer uses done, and how many
    tokens left at each candidate."""
    cands = Candidates.of(model.cfg, n_loops)
    uses_C = jnp.asarray(cands.uses, jnp.float32)
    C = len(cands.uses)

    def sums(micro):
        entropy_CxBxT, loss_CxBxT = _per_candidate(params, micro, model, cands, n_loops,
                                                   train.ce_chunk)
        # First candidate below tau; the last candidate (the full model) always takes the rest.
        below_NxCxBxT = entropy_CxBxT[None, :-1] < taus[:, None, None, None]
        below_NxCxBxT = jnp.concatenate(
            [below_NxCxBxT, jnp.ones_like(below_NxCxBxT[:, :1])], axis=1)
        exit_NxBxT = jnp.argmax(below_NxCxBxT, axis=1)
        mask_BxT = micro["mask"].astype(jnp.float32)
        loss_NxBxT = jnp.take_along_axis(loss_CxBxT[None], exit_NxBxT[:, None], axis=1)[:, 0]
        return {"loss_sum": jnp.sum(loss_NxBxT * mask_BxT, (1, 2)),
                "uses_sum": jnp.sum(uses_C[exit_NxBxT] * mask_BxT, (1, 2)),
                "exits": jnp.stack([jnp.sum((exit_NxBxT == c) * mask_BxT, (1, 2))
                                    for c in range(C)], axis=1),  # (N, C)
                "weight": jnp.sum(mask_BxT)}

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def _at_saved(saved: np.ndarray, log_ppl: np.ndarray, target: float) -> float | None:
    """Perplexity at `target` saved, log-perplexity linear in the saving between the grid
    points around it; None beyond the largest saving (everybody at the first candidate)."""
    if target > saved.max() + 1e-12:
        return None
    first = np.unique(saved, return_index=True)[1]  # the smallest tau reaching each saving
    return float(math.exp(np.interp(target, saved[first], log_ppl[first])))


def _bracket(saved: np.ndarray, target: float) -> list[float] | None:
    """The savings of the grid points either side of `target` (None beyond the largest)."""
    if target > saved.max() + 1e-12:
        return None
    return [float(saved[saved <= target].max()), float(saved[saved >= target].min())]


def summarise(sums: dict, taus: np.ndarray, cands: Candidates, layer_use: float,
              forward: float, check: float) -> dict:
    """The JSON figures from the summed `exit_step` outputs over the held-out batches."""
    n = max(float(sums["weight"]), 1.0)
    total_uses = cands.uses[-1]
    loss = np.asarray(sums["loss_sum"], np.float64) / n
    saved = (total_uses - np.asarray(sums["uses_sum"], np.float64) / n) * layer_use / forward
    log_ppl = np.minimum(loss, 700.0)
    table = {f"ppl_at_{p}": _at_saved(saved, log_ppl, p / 100) for p in SAVED_TARGETS}
    brackets = {f"bracket_{p}": _bracket(saved, p / 100) for p in SAVED_TARGETS}
    return {
        "candidates": "loop boundaries" if cands.at_loops else "layers",
        "candidate_uses": list(cands.uses), "tau": taus.tolist(), "loss": loss.tolist(),
        "ppl": np.exp(log_ppl).tolist(), "flops_saved": saved.tolist(),
        "exit_share": (np.asarray(sums["exits"]) / n).tolist(),
        "ppl_full": float(math.exp(min(loss[0], 700.0))),
        "max_saved": float(saved.max()), **table, "brackets": brackets,
        "check_cost": check / forward, "tokens": float(sums["weight"]),
    }


def plot(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    saved = 100 * np.asarray(result["flops_saved"])
    ax.plot(saved, result["ppl"], marker=".", markersize=3)
    points = [(p, result[f"ppl_at_{p}"]) for p in SAVED_TARGETS if result[f"ppl_at_{p}"]]
    if points:
        ax.scatter(*zip(*points), color="C3", zorder=3, label="5/10/20/30% saved")
        ax.legend(fontsize="small")
    ax.set(xlabel="forward FLOPs saved (%)", ylabel="held-out perplexity", yscale="log",
           title=title)
    fig.tight_layout()
    return fig


def early_exit(run: Loaded) -> dict:
    """Entropy-threshold early exit at the trained loop count (early_exit.py)."""
    c = run.config
    cands = Candidates.of(c.model, c.model.n_loops)
    if len(cands.uses) < 2:
        raise UsageError(f"--what=early_exit needs a looped model or more than one layer; "
                         f"{c.name} has one layer and one loop")
    sample = run.sums(entropy_step, max_batches=1)
    taus = tau_grid(c.model.vocab_size, np.asarray(sample["entropy"])[
        :, np.asarray(sample["mask"], bool)])
    sums = run.sums(functools.partial(exit_step, taus=jnp.asarray(taus, jnp.float32)))
    layer_use, forward = layer_use_flops(c.model, c.train.seq_len, c.flop_convention)
    check = 2.0 * c.model.d_model * c.model.vocab_size
    return summarise(sums, taus, cands, layer_use, forward, check)
