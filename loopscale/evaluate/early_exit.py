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
forward pass so the reader can. What that forward pass counts is the convention's (the
result's `note` says it, and `embedding_in_share`): under `6n` (Kaplan) 2 x the active
non-embedding parameters, no vocabulary matrix; under `6n_emb` (the study's) 2 x params_active,
so the input embedding counts as a V x D matmul (2VD a token) though a lookup executes none,
which enlarges the denominator and shrinks every share saved, and the unembedding counts 2DV;
`6n_attn` adds attention's T x T matmuls to every layer use (`6n_attn_causal` half of them).
The router is in a layer use exactly when `model.count_router` is true.

Tau is swept over thresholds in nats from 0 (nobody exits) to just above ln V (everybody exits
at the first candidate), placed at the quantiles of the early candidates' entropies on the
first held-out batch (`tau_grid`); the saving grows with tau, and perplexity at 5/10/20/30%
saved is interpolated (log-perplexity linear in the saving) between the grid points around
it; `bracket_P` gives those two points' savings, so a coarse interpolation shows. The sums
are taken on the devices (one jitted step per held-out batch, in the train step's micro-batches
and `train.ce_chunk` positions at a time), so it runs at paper scale on the run's mesh.

Intervals. Every perplexity reported (`ppl_full`, `ppl_at_P`) comes with a 95% percentile
bootstrap interval (`*_low`, `*_high`) that resamples held-out sequences, not tokens: a
sequence's tokens share their context, so resampling tokens would make the interval too
narrow. It is the Poisson bootstrap (Hanley & MacGibbon 2006; Chamandy et al. 2012), the
streaming form of drawing sequences with replacement: in each of RESAMPLES replicates every
sequence counts Poisson(1) times. Its weights multiply per-sequence sums (the exit's loss and
layer uses, and the tokens, over each sequence, per tau) inside the jitted step, so a replicate
is one more column of sums added up over the held-out batches like the others: nothing per
sequence leaves the devices and the step's output is (RESAMPLES, taus) whatever the number of
sequences. A sequence's weights are drawn from a key folded with a hash of its tokens
(`replicate_weights`), not with its place in the split (the step sees only the trainer's
batch), so they do not depend on batching, micro-batching or the number of processes, and a
repeated sequence counts as one. A replicate's `ppl_at_P` is interpolated on its own curve (its
own savings and losses at the same taus), so the interval holds the uncertainty of both axes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import textwrap
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from loopscale.config.schema import FFNKind, FlopConvention, ModelConfig, TrainConfig
from loopscale.train.eval_loss import map_position_chunks
from loopscale.errors import UsageError
from loopscale.flops import flops_per_token, layer_use_flops as layer_use_training_flops
from loopscale.model import LoopedLM
from loopscale.train.step import micro_batches, readout_fn

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

N_TAU = 161  # grid points; the study sweeps tau without saying how finely
SAVED_TARGETS = (5, 10, 20, 30)  # percent of forward FLOPs saved: the study's Table 7 columns
CONFIDENCE = 0.95
# Bootstrap replicates. 500 place the 2.5% and 97.5% percentiles to within about 6% of the
# interval's half-width (the order statistics' spread). Not 1000: the step's output is then
# 1.3 MB ((RESAMPLES, N_TAU) sums of loss and uses), and XLA:TPU, past about that size,
# scheduled the Looped-MoE :paper step on v5p-128 with two more (B, chunk, V) buffers of the
# readout live (`loopscale compile --step=eval:early_exit`: 1.73 against 0.91 GB of
# temporaries a chip; 500 and 800: 0.91, as without the bootstrap).
RESAMPLES = 500
SEED = 0
# Log-perplexities are capped here before exp: past 709.78 math.exp raises OverflowError (and
# numpy's gives inf, which JSON cannot hold), and a diverged run's loss can be that large.
MAX_LOG_PPL = 700.0


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
    """Where a model may exit: `uses[c]` layer uses done at candidate c (the last: all).

    With a prelude and a coda (model.n_prelude, model.n_coda) the prelude is always run; an
    exit at a loop boundary runs the coda too (the model stopped after that loop,
    transformer.py), and without loops a core layer's exit reads its stream as the layers'
    exits do, skipping what follows, coda included, with the model's own output the last
    candidate."""

    uses: tuple[int, ...]
    at_loops: bool  # loop boundaries (looped) or layers (not looped)

    @classmethod
    def of(cls, cfg: ModelConfig, n_loops: int) -> Candidates:
        L, P, C = cfg.n_unique, cfg.n_prelude, cfg.n_coda
        if n_loops > 1:
            return cls(tuple(P + L * (k + 1) + C for k in range(n_loops)), True)
        return cls(tuple(P + layer for layer in range(1, L + 1)) + ((P + L + C,) if C else ()),
                   False)


# What the forward pass of each flop_convention counts (flops.py's module docstring), for the
# note that says what a share of "FLOPs saved" is a share of.
_EMBEDDING = ("the input embedding counted as a V x D matmul (2VD FLOPs a token, though a "
              "lookup executes none) and the unembedding (2DV)")
_COUNTS = {
    FlopConvention.KAPLAN: "2 x params_active_nonembedding a token: neither the input embedding "
                           "nor the unembedding, nor attention's T x T matmuls",
    FlopConvention.SPARSE_STUDY: f"2 x params_active a token: {_EMBEDDING}; attention's T x T "
                                 "matmuls not counted",
    FlopConvention.ATTENTION: f"2 x params_active a token, {_EMBEDDING}, plus attention's T x T "
                              "matmuls over the whole matrix (4 T n_heads d_head a layer use)",
    FlopConvention.ATTENTION_CAUSAL: f"2 x params_active a token, {_EMBEDDING}, plus half of "
                                     "attention's T x T matmuls (2 T n_heads d_head a layer "
                                     "use, a causal kernel's)",
}


def embedding_in_share(cfg: ModelConfig, forward: float, convention: FlopConvention) -> float:
    """The input embedding's share of the forward pass as `convention` counts it (0 where it
    is not counted): the part of the denominator a lookup does not really cost."""
    if convention is FlopConvention.KAPLAN:
        return 0.0
    return 2.0 * cfg.vocab_size * cfg.d_model / forward


def flops_note(cfg: ModelConfig, convention: FlopConvention, layer_use: float, forward: float,
               check: float) -> str:
    """One line saying what the saved shares are shares of, under the run's convention."""
    router = ""
    if cfg.ffn is FFNKind.MOE:
        router = (", the router counted" if cfg.count_router else
                  ", the router not counted (model.count_router=false)")
    embedding = embedding_in_share(cfg, forward, convention)
    return (f"FLOPs saved = skipped layer uses x {layer_use:.4g} FLOPs / {forward:.4g} FLOPs a "
            f"token, the forward pass as flop_convention={convention.value} counts it "
            f"({_COUNTS[convention]}{router}); the input embedding is {embedding:.1%} of it. "
            f"The lens check at each candidate a token passes (2DV, {check / forward:.1%} of "
            f"the forward pass) is not charged.")


def layer_use_flops(cfg: ModelConfig, seq_len: int, convention: FlopConvention
                    ) -> tuple[float, float]:
    """(forward FLOPs of one layer use, of the whole forward pass) per token under
    `convention`: a layer use is what one more loop of a one-layer block adds."""
    return (layer_use_training_flops(cfg, seq_len, convention) / 3.0,
            flops_per_token(cfg, seq_len, convention) / 3.0)


def _per_candidate(params, micro, model: LoopedLM, cands: Candidates, n_loops: int,
                   chunk: int) -> tuple[jax.Array, jax.Array]:
    """Each token's logit-lens entropy (nats) and loss at every candidate: (C, B, T) each."""
    if not cands.at_loops:
        model = model.clone(collect_layers=True)
    readout = readout_fn(model, params)
    out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False,
                      all_exits=True)
    hidden_CxBxTxD = out.exit_hidden if cands.at_loops else out.layer_hidden[0]
    if not cands.at_loops and model.cfg.n_coda:  # the model's own output, after the coda
        hidden_CxBxTxD = jnp.concatenate([hidden_CxBxTxD, out.exit_hidden[-1:]])

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


def replicate_weights(inputs_BxT: jax.Array) -> jax.Array:
    """(RESAMPLES, B) float32: each sequence's Poisson(1) count in every bootstrap replicate,
    drawn from a key folded with a hash of the sequence's tokens (the module docstring). The
    hash is linear mod 2^32 with odd multipliers per position, so two sequences differing in
    one token never share it."""
    hash_key, draw_key = jax.random.split(jax.random.key(SEED))
    multipliers_T = jax.random.bits(hash_key, inputs_BxT.shape[-1:], jnp.uint32) | jnp.uint32(1)
    hash_B = jnp.sum(inputs_BxT.astype(jnp.uint32) * multipliers_T, axis=-1, dtype=jnp.uint32)
    counts_BxR = jax.vmap(lambda h: jax.random.poisson(
        jax.random.fold_in(draw_key, h), 1.0, (RESAMPLES,)))(hash_B)
    return counts_BxR.T.astype(jnp.float32)


def _rows_over_micro_batches(fn, batch, accum: int):
    """`fn(micro_batch)` -> (per-row figures, leaves (..., b); sums), over the train step's
    `accum` micro-batches: the rows put back in the batch's order (..., B), the sums added."""
    if accum == 1:
        return fn(batch)
    rows, sums = jax.lax.map(fn, micro_batches(batch, accum))
    # micro_batches puts row q * accum + i at place q of micro-batch i: (accum, ..., b) -> (..., B)
    unsplit = lambda x: jnp.moveaxis(x, 0, -1).reshape(*x.shape[1:-1], -1)
    return jax.tree.map(unsplit, rows), jax.tree.map(lambda x: jnp.sum(x, 0), sums)


def exit_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int,
              taus: jax.Array) -> dict[str, jax.Array]:
    """Sums over a batch, per tau: the exit's token loss, the layer uses done, and how many
    tokens left at each candidate; and the same loss, uses and tokens in every bootstrap
    replicate (`boot_*`, (RESAMPLES, N) and (RESAMPLES,): per-sequence sums weighted by
    `replicate_weights`)."""
    cands = Candidates.of(model.cfg, n_loops)
    uses_C = jnp.asarray(cands.uses, jnp.float32)
    C = len(cands.uses)

    def per_sequence(micro):
        entropy_CxBxT, loss_CxBxT = _per_candidate(params, micro, model, cands, n_loops,
                                                   train.ce_chunk)
        # First candidate below tau; the last candidate (the full model) always takes the rest.
        below_NxCxBxT = entropy_CxBxT[None, :-1] < taus[:, None, None, None]
        # (N, 1, B, T) spelled out: with one candidate (the compile's one-layer cost point)
        # there is no earlier one to copy the shape from.
        n, _, b, t = below_NxCxBxT.shape
        below_NxCxBxT = jnp.concatenate([below_NxCxBxT, jnp.ones((n, 1, b, t), bool)], axis=1)
        exit_NxBxT = jnp.argmax(below_NxCxBxT, axis=1)
        mask_BxT = micro["mask"].astype(jnp.float32)
        loss_NxBxT = jnp.take_along_axis(loss_CxBxT[None], exit_NxBxT[:, None], axis=1)[:, 0]
        rows = {"loss": jnp.sum(loss_NxBxT * mask_BxT, -1),
                "uses": jnp.sum(uses_C[exit_NxBxT] * mask_BxT, -1),
                "weight": jnp.sum(mask_BxT, -1)}
        exits_NxC = jnp.stack([jnp.sum((exit_NxBxT == c) * mask_BxT, (1, 2)) for c in range(C)],
                              axis=1)
        return rows, {"exits": exits_NxC}

    # Per sequence over the whole batch, then weighted once: the replicates' (RESAMPLES, N)
    # sums are made once a batch, not once a micro-batch and stacked by the map (that kept
    # accum of them live: more than the step's own chunked vocabulary at small widths).
    rows, sums = _rows_over_micro_batches(per_sequence, batch, train.grad_accum)
    counts_RxB = replicate_weights(batch["inputs"])
    return {"loss_sum": jnp.sum(rows["loss"], -1), "uses_sum": jnp.sum(rows["uses"], -1),
            "exits": sums["exits"],  # (N, C)
            "weight": jnp.sum(rows["weight"]),
            "boot_loss": jnp.einsum("rb,nb->rn", counts_RxB, rows["loss"]),
            "boot_uses": jnp.einsum("rb,nb->rn", counts_RxB, rows["uses"]),
            "boot_weight": counts_RxB @ rows["weight"]}


def _reached(saved: np.ndarray, target: float) -> bool:
    """Whether some tau saves `target` (the largest saving: everybody at the first candidate);
    the slack keeps a target equal to it, up to rounding, in reach."""
    return target <= saved.max() + 1e-12


def _at_saved(saved: np.ndarray, log_ppl: np.ndarray, target: float) -> float | None:
    """Perplexity at `target` saved, log-perplexity linear in the saving between the grid
    points around it; None beyond the largest saving."""
    if not _reached(saved, target):
        return None
    first = np.unique(saved, return_index=True)[1]  # the smallest tau reaching each saving
    return float(math.exp(np.interp(target, saved[first], log_ppl[first])))


def _bracket(saved: np.ndarray, target: float) -> list[float] | None:
    """The savings of the grid points either side of `target` (None beyond the largest)."""
    if not _reached(saved, target):
        return None
    return [float(saved[saved <= target].max()), float(saved[saved >= target].min())]


def _curve(loss_sum, uses_sum, weight, total_uses: int, layer_use: float, forward: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """(loss, share of forward FLOPs saved) per tau from summed losses and uses (..., N) and
    the tokens they sum over (...)."""
    n = np.maximum(np.asarray(weight, np.float64), 1.0)[..., None]
    loss = np.asarray(loss_sum, np.float64) / n
    saved = (total_uses - np.asarray(uses_sum, np.float64) / n) * layer_use / forward
    return loss, saved


def _percentiles(values: list[float | None]) -> list[float | None]:
    """[low, high] of the CONFIDENCE percentile interval of the replicates' values (None: a
    replicate where the figure is out of reach; [None, None] if every one is)."""
    kept = np.asarray([v for v in values if v is not None], np.float64)
    if not kept.size:
        return [None, None]
    tail = 100 * (1 - CONFIDENCE) / 2
    return [float(v) for v in np.percentile(kept, [tail, 100 - tail])]


def intervals(sums: dict, total_uses: int, layer_use: float, forward: float,
              point: dict) -> dict:
    """`{figure}_low` / `{figure}_high` for `ppl_full` and each `ppl_at_P`, from the bootstrap
    replicates' sums (`boot_*`); None where the point figure is (a saving out of reach)."""
    loss_RxN, saved_RxN = _curve(sums["boot_loss"], sums["boot_uses"], sums["boot_weight"],
                                 total_uses, layer_use, forward)
    log_ppl_RxN = np.minimum(loss_RxN, MAX_LOG_PPL)
    figures = {"ppl_full": [float(math.exp(r[0])) for r in log_ppl_RxN]}
    for p in SAVED_TARGETS:
        figures[f"ppl_at_{p}"] = [_at_saved(s, r, p / 100) for s, r in zip(saved_RxN, log_ppl_RxN)]
    out = {}
    for name, values in figures.items():
        low, high = _percentiles(values) if point[name] is not None else (None, None)
        out[f"{name}_low"], out[f"{name}_high"] = low, high
    return out


def summarise(sums: dict, taus: np.ndarray, cands: Candidates, layer_use: float,
              forward: float, check: float) -> dict:
    """The JSON figures from the summed `exit_step` outputs over the held-out batches."""
    total_uses = cands.uses[-1]
    loss, saved = _curve(sums["loss_sum"], sums["uses_sum"], sums["weight"], total_uses,
                         layer_use, forward)
    log_ppl = np.minimum(loss, MAX_LOG_PPL)
    table = {f"ppl_at_{p}": _at_saved(saved, log_ppl, p / 100) for p in SAVED_TARGETS}
    brackets = {f"bracket_{p}": _bracket(saved, p / 100) for p in SAVED_TARGETS}
    n = max(float(sums["weight"]), 1.0)
    ppl_full = float(math.exp(log_ppl[0]))
    return {
        "candidates": "loop boundaries" if cands.at_loops else "layers",
        "candidate_uses": list(cands.uses), "tau": taus.tolist(), "loss": loss.tolist(),
        "ppl": np.exp(log_ppl).tolist(), "flops_saved": saved.tolist(),
        "exit_share": (np.asarray(sums["exits"]) / n).tolist(),
        "ppl_full": ppl_full,
        "max_saved": float(saved.max()), **table, "brackets": brackets,
        **intervals(sums, total_uses, layer_use, forward, {"ppl_full": ppl_full, **table}),
        "ci_level": CONFIDENCE, "ci_resamples": RESAMPLES,
        "ci_method": "Poisson bootstrap over held-out sequences, percentile interval",
        "check_cost": check / forward, "tokens": float(sums["weight"]),
    }


def plot(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    saved = 100 * np.asarray(result["flops_saved"])
    ax.plot(saved, result["ppl"], marker=".", markersize=3)
    points = [(p, result[f"ppl_at_{p}"]) for p in SAVED_TARGETS if result[f"ppl_at_{p}"]]
    if points:
        ax.scatter(*zip(*points), color="C3", zorder=3, label="5/10/20/30% saved")
    ax.set(xlabel="forward FLOPs saved (%)", ylabel="held-out perplexity", yscale="log",
           title=title)
    # The intervals at full depth (0 saved) and at each saving reached; a saving at the very
    # edge of reach may have none (every replicate just short of it).
    named = [("ppl_full", 0, result["ppl_full"]), *((f"ppl_at_{p}", p, v) for p, v in points)]
    bars = [(x, v, v - result[f"{n}_low"], result[f"{n}_high"] - v) for n, x, v in named
            if result[f"{n}_low"] is not None]
    if bars:
        x, v, below, above = zip(*bars)
        ax.errorbar(x, v, yerr=[below, above], fmt="none", color="C3", capsize=3, lw=1,
                    label=f"{result['ci_level']:.0%} interval (sequences resampled)")
    if points or bars:
        ax.legend(fontsize="small")
    fig.text(0.01, 0.01, textwrap.fill(result["note"], 115), fontsize=5.5, va="bottom")
    fig.tight_layout(rect=(0, 0.13, 1, 1))
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
    return {**summarise(sums, taus, cands, layer_use, forward, check),
            "embedding_in_share": embedding_in_share(c.model, forward, c.flop_convention),
            "note": flops_note(c.model, c.flop_convention, layer_use, forward, check)}
