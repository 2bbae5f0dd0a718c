"""Held-out loss and perplexity at every loop exit (`ppl`) and at inference loop counts other
than the trained one (`loops`: 1 .. 2K, or the counts of `--loops`, beyond training too), with
their figures.

Test-time depth (`loops`), as Parcae fits it: L(r) = L_inf + (L_1 - L_inf) exp(-k (r - 1)),
the loss saturating at L_inf as the loop count r grows, at rate k per extra loop. Fitted by
least squares (scipy's curve_fit, k >= 0) to the measured counts, with 95% intervals from the
fit's covariance (normal approximation; they need more counts than the 3 parameters, and are
null otherwise), and its RMS residual: a model whose loss turns up past its trained count
does not saturate, and the residual says how far the curve misses. Beside it, the state per
loop at the largest count, in one forward pass over the held-out batches: the residual norm
(mean over tokens of ||x_t||) and the relative step ||x_t - x_{t-1}|| / ||x_{t-1}|| (mean over
tokens), which goes to 0 if the iteration converges to a fixed point and not if it drifts.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from loopscale.config.schema import TrainConfig
from loopscale.model import LoopedLM
from loopscale.train.eval_loss import summed_over_micro_batches

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded


def _ppl(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def ppl(run: Loaded) -> dict:
    per_exit, tokens = run.loss_per_exit(run.config.model.n_loops)
    return {"loss": per_exit[-1], "ppl": _ppl(per_exit[-1]), "n_loops": run.config.model.n_loops,
            "loss_per_exit": per_exit, "ppl_per_exit": [_ppl(x) for x in per_exit],
            "tokens": tokens}


def loops(run: Loaded) -> dict:
    """The looped block run fewer or more times than it was trained for: loop counts 1 .. 2K,
    or `run.loop_counts` with the trained count K added (a model without loops, K = 1, runs
    its whole stack that many times); the saturating fit and the state per loop (module
    docstring)."""
    trained = run.config.model.n_loops
    counts = (sorted(set(run.loop_counts) | {trained}) if run.loop_counts
              else list(range(1, 2 * trained + 1)))
    losses = [run.loss_per_exit(k)[0][-1] for k in counts]
    state = run.sums(state_step, n_loops=max(counts))
    n = state.pop("batches")
    return {"trained_loops": trained, "loop_counts": counts, "loss": losses,
            "ppl": [_ppl(x) for x in losses],
            "loss_at_trained": losses[counts.index(trained)],
            "saturating_fit": saturating_fit(counts, losses),
            "state_loops": list(range(1, max(counts) + 1)),
            **{name: (np.asarray(total) / n).tolist() for name, total in state.items()}}


def state_step(params, batch, *, model: LoopedLM, train: TrainConfig, n_loops: int) -> dict:
    """Sums over a batch's micro-batches of the stream's per-loop residual norm (K,) and
    relative step (K - 1,), each a mean over the micro-batch's tokens, and their count."""
    def sums(micro):
        out = model.apply({"params": params}, micro["inputs"], n_loops=n_loops, readout=False)
        x_KxBxTxD = out.loop_hidden.astype(jnp.float32)
        norms_KxBxT = jnp.linalg.norm(x_KxBxTxD, axis=-1)
        steps_KxBxT = jnp.linalg.norm(x_KxBxTxD[1:] - x_KxBxTxD[:-1], axis=-1)
        return {"residual_norm": out.residual_norm,
                "relative_step": jnp.mean(steps_KxBxT / norms_KxBxT[:-1], axis=(1, 2)),
                "batches": jnp.ones((), jnp.float32)}

    return summed_over_micro_batches(sums, batch, train.grad_accum)


def saturating(r, l_inf, l_1, k):
    return l_inf + (l_1 - l_inf) * np.exp(-k * (np.asarray(r, np.float64) - 1.0))


FIT_PARAMS = ("L_inf", "L_1", "k")


def saturating_fit(counts: list[int], losses: list[float]) -> dict:
    """L(r) = L_inf + (L_1 - L_inf) exp(-k (r - 1)) fitted to (counts, losses): each parameter
    with its 95% interval (null without spare degrees of freedom or finite covariance), the
    RMS residual, or the reason there is no fit."""
    r, y = np.asarray(counts, np.float64), np.asarray(losses, np.float64)
    if len(r) < 3 or not np.all(np.isfinite(y)):
        return {"fitted": False, "reason": f"{len(r)} loop counts with finite losses; the "
                                           "curve has 3 parameters"}
    start = (float(y.min()), float(y[0]), 1.0)
    with warnings.catch_warnings():  # no spare degrees of freedom: covariance inf, said below
        warnings.simplefilter("ignore", scipy.optimize.OptimizeWarning)
        try:
            values, cov = scipy.optimize.curve_fit(
                saturating, r, y, p0=start, bounds=([-np.inf, -np.inf, 0.0], np.inf),
                maxfev=20000)
        except RuntimeError as e:  # no convergence
            return {"fitted": False, "reason": str(e)}
    sd = np.sqrt(np.diag(cov)) if len(r) > 3 else np.full(3, np.inf)
    out = {"fitted": True, "dof": len(r) - 3,
           "rms_residual": float(np.sqrt(np.mean((saturating(r, *values) - y) ** 2)))}
    for name, value, s in zip(FIT_PARAMS, values, sd):
        ok = bool(np.isfinite(s))
        out[name] = float(value)
        out[f"{name}_interval"] = [float(value - 1.96 * s), float(value + 1.96 * s)] if ok \
            else None
    return out


def plot_ppl(result: dict, title: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    exits = range(1, len(result["ppl_per_exit"]) + 1)
    ax.plot(list(exits), result["ppl_per_exit"], marker="o")
    ax.set(xlabel="loop exit", ylabel="held-out perplexity", yscale="log", title=title)
    fig.tight_layout()
    return fig


def plot_loops(result: dict, title: str):
    """Held-out loss against the loop count with the saturating fit; the state per loop."""
    import matplotlib.pyplot as plt

    fig, (ax, ax_state) = plt.subplots(1, 2, figsize=(9, 3.5))
    counts = result["loop_counts"]
    ax.plot(counts, result["loss"], marker="o", linestyle="", label="measured")
    fit = result.get("saturating_fit", {})
    if fit.get("fitted"):
        r = np.linspace(1, max(counts), 200)
        ax.plot(r, saturating(r, *(fit[n] for n in FIT_PARAMS)),
                label=f"L_inf {fit['L_inf']:.3f}, k {fit['k']:.2f}")
    ax.axvline(result["trained_loops"], color="grey", linestyle=":", label="trained")
    ax.set(xlabel="inference loop count", ylabel="held-out loss", xscale="log", title=title)
    ax.legend(fontsize=7)
    if "state_loops" in result:
        loops_ = result["state_loops"]
        ax_state.plot(loops_, result["residual_norm"], marker=".", label="residual norm")
        twin = ax_state.twinx()
        twin.plot(loops_[1:], result["relative_step"], marker=".", color="C1",
                  label="relative step")
        twin.set(yscale="log", ylabel="||x_t - x_{t-1}|| / ||x_{t-1}||")
        ax_state.set(xlabel="loop", ylabel="mean ||x_t||")
        ax_state.legend(loc="upper left", fontsize=7)
        twin.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    return fig
