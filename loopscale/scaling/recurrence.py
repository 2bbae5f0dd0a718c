"""The iso-depth recurrence law (Schwethelm et al. 2026, arXiv 2604.21106):

    L = E + A (N_once + r^phi N_rec)^(-alpha) + B D^(-beta)

N_rec: the looped block's parameters (stored once, used r times); N_once: every other parameter
(flops.param_counts' params_rec and params_once, split as the paper's code splits its models:
the vocabulary matrices, final norm and any unlooped layers once, the recurrent block r times;
here a layer's norm gains belong to its layer); r: the loop count; D: training tokens. phi in
[0, 1] prices a reuse: 0, a loop pass adds nothing; 1, it is worth as much as new parameters.
N_once + r^phi N_rec is a looped model's *parameter-equivalent size*, the unique parameters a
non-looped model needs for the same loss.

The fit (`fit_recurrence`), like parametric.py (Hoffmann et al. 2022):
  log L_hat = LSE(a - alpha log(N_once + r^phi N_rec), b - beta log D, e),
  A = exp(a), B = exp(b), E = exp(e), objective = sum over runs of Huber_delta(log L_hat -
  log L), delta = 1e-3, minimised by scipy's L-BFGS-B with the analytic gradient; phi is held
  in [0, 1] and alpha, beta >= 0 by L-BFGS-B's bounds (a loop pass worth less than nothing, or
  more than a new layer, is outside the law).
The starts come from variable projection: for fixed exponents (alpha, beta, phi) the law is
linear in (E, A, B), so on a grid of the three exponents (EXPONENT_GRID: 12 x 12 x 11 points)
the best non-negative (E, A, B) is a 3-variable NNLS in relative (1/L-weighted) linear error,
solved for every grid point at once (`_projected_grid`: the exact active-set solution, every
subset of the three coefficients tried). The best N_SEEDS grid points that are at least
SEED_SEPARATION apart in some exponent seed the Huber fit, and the lowest objective wins
(with delta = 1e-3 the objective is nearly L1 in the residuals and has shallow local minima,
so one seed is not enough: on noisy synthetic sweeps the second or fifth seed sometimes wins).
A fit costs ~40 ms of one core (the grid ~3 ms, each polish ~10 ms), so every bootstrap refit
searches the whole grid again (no warm starts: a resample's optimum may lie in another basin,
and phi's valley is often flat); 1,000 resamples take ~40 s per group.
Internally log N and log D are centred (a, b re-expressed at the runs' mean sizes), which
decorrelates a from alpha and b from beta and lets L-BFGS-B converge in tens of steps.

What the data must hold (`FitError` otherwise, one line): MIN_RUNS runs, two or more distinct
loop counts (at one r, phi multiplies N_rec by a constant that A absorbs), three or more
distinct (N_once, N_rec, r) (the N term has three parameters: A, alpha, phi), looped runs with
N_rec > 0, and two or more token counts.

Compute-optimal loops (`RecurrenceFit.optimal_loops`): at a budget C a backbone (N_once, N_rec)
looped r times trains D = C / (6 (N_once + r N_rec_active)) tokens (the 6N count with the
vocabulary matrices, the sweep's `6n_emb` convention; N_rec_active: the block's parameters per
token, top_k experts for MoE), so looping buys equivalent size at the price of tokens; the best
r in 1..max_loops minimises the law's loss. `best_loops` takes the best (backbone, r) over
several backbones.

fit.json's `recurrence` object (`recurrence_json`): the law fitted across the runs that share a
backbone kind: dense runs (Base and Looped) together at the top level, MoE runs (MoE and
Looped-MoE) together under "moe", there with stored N_rec ("stored") and with active N_rec
("active"). A run is MoE when its params_rec_active < params_rec, else (no such column on the
table's runs) when its ffn is "moe", else (neither column) every run is one group. Keys:
  phi, E, A, B, alpha, beta (each with X_ci: the percentile bootstrap interval at `level`, null
  without bootstrap or when not identified), n_runs, loop_counts, families, residual_sd (nats,
  SD of L - L_hat), r2 (of L), objective, params ("stored" | "active"), compute_params (what
  N_rec_active is in optimal_loops' compute: "params_rec_active", or "params_rec" when the
  table has no params_rec_active), max_loops,
  bootstrap: null or {resamples, failed, failed_share, resampling, clusters, stratified,
  not_identified: {figure: why}} (clusters of runs, a cooldown trunk with its branches, drawn
  within their loop count so no resample loses one),
  equivalent_params: [{run, family, n_loops, params_once, params_rec, equivalent}] per looped
  run, optimal_loops: [{budget, params_once, params_rec, n_loops, loss}] per budget of the
  group's runs (the table's budget column, else their compute grouped as isoflop groups it):
  the best of the group's backbones and loop counts up to max_loops, the largest r fitted (the
  law is not extrapolated past the loop counts it saw).
A group that cannot carry the law is {"skipped": "<why>"}; so is the whole object when the
table has no recurrence columns.

One law end to end (fit, bootstrap, fit.json object, report lines), as parametric.py is for
approach 3: the pieces share the law's parameterisation and are not used apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from loopscale.scaling import FitError
from loopscale.scaling import table as tbl
from loopscale.scaling.bootstrap import Bootstrap, design, run_bootstrap
from loopscale.scaling.budget_minima import BUDGET_TOLERANCE_DEX, assign_budgets
from loopscale.scaling.jsonable import clean
from loopscale.scaling.parametric import HUBER_DELTA, single_threaded_blas

FIGURES = ("phi", "E", "A", "B", "alpha", "beta")
MIN_RUNS = 8
# The variable-projection grid over the exponents (alpha, beta, phi).
EXPONENT_GRID = (
    np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.65, 0.8, 1.0]),
    np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.65, 0.8, 1.0]),
    np.linspace(0.0, 1.0, 11),
)
N_SEEDS = 4  # grid points polished by the Huber fit
SEED_SEPARATION = 0.15  # in some exponent, from every seed kept before
EXPONENT_BOUNDS = ((0.0, None), (0.0, None), (0.0, 1.0))  # alpha, beta, phi
# L-BFGS-B's ftol is relative to max(|f|, 1) and the objective is ~1e-4: run to convergence
# (parametric.py's _TIGHT, for the same reason).
_TIGHT = {"ftol": 1e-15, "gtol": 1e-12, "maxiter": 5000}
PARAMS_REC_ACTIVE, FFN = tbl.PARAMS_REC_ACTIVE, tbl.FFN


@dataclasses.dataclass(frozen=True)
class LoopChoice:
    """The compute-optimal loop count of one backbone at one budget, and what it gives."""

    budget: float
    params_once: float
    params_rec: float
    n_loops: int
    tokens: float
    loss: float

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "params_once": self.params_once,
                "params_rec": self.params_rec, "n_loops": self.n_loops, "loss": self.loss}


@dataclasses.dataclass(frozen=True)
class RecurrenceFit:
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    phi: float
    objective: float  # summed Huber loss at the optimum
    n_runs: int
    loop_counts: tuple[int, ...]  # the distinct r, sorted
    residual_sd: float  # nats: the SD of L - L_hat
    r2: float  # of L, in linear space
    n_starts: int  # exponent grid points projected
    n_polished: int  # of them, Huber fits run to convergence
    delta: float = HUBER_DELTA

    def figures(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in FIGURES}

    def equivalent_params(self, params_once, params_rec, n_loops) -> np.ndarray:
        """N_once + r^phi N_rec: the unique parameters a non-looped model needs for the same
        N term."""
        return (np.asarray(params_once, dtype=float)
                + np.power(np.asarray(n_loops, dtype=float), self.phi)
                * np.asarray(params_rec, dtype=float))

    def predict(self, params_once, params_rec, n_loops, tokens) -> np.ndarray:
        n = self.equivalent_params(params_once, params_rec, n_loops)
        return (self.E + self.A * np.power(n, -self.alpha)
                + self.B * np.power(np.asarray(tokens, dtype=float), -self.beta))

    def optimal_loops(self, budget: float, params_once: float, params_rec: float,
                      max_loops: int = 8, params_rec_active: float | None = None) -> LoopChoice:
        """The loop count r in 1..max_loops of least loss at compute `budget` for one backbone,
        with D = budget / (6 (N_once + r N_rec_active)) (N_rec_active defaults to N_rec)."""
        if max_loops < 1:
            raise ValueError(f"max_loops must be at least 1 (got {max_loops})")
        active = params_rec if params_rec_active is None else params_rec_active
        r = np.arange(1, int(max_loops) + 1)
        tokens = budget / (6.0 * (params_once + r * active))
        loss = self.predict(params_once, params_rec, r, tokens)
        k = int(np.argmin(loss))
        return LoopChoice(budget=float(budget), params_once=float(params_once),
                          params_rec=float(params_rec), n_loops=int(r[k]),
                          tokens=float(tokens[k]), loss=float(loss[k]))


def best_loops(fit: RecurrenceFit, budgets: Sequence[float],
               backbones: Sequence[tuple[float, float] | tuple[float, float, float]],
               max_loops: int = 8) -> list[LoopChoice]:
    """Per budget, the best (backbone, r) over `backbones`: (N_once, N_rec) or (N_once, N_rec,
    N_rec_active) each, r in 1..max_loops; ties go to the first backbone listed."""
    if not backbones:
        raise ValueError("no backbone to choose from")
    out = []
    for budget in budgets:
        choices = [fit.optimal_loops(budget, b[0], b[1], max_loops,
                                     b[2] if len(b) > 2 else None) for b in backbones]
        out.append(min(choices, key=lambda c: c.loss))
    return out


# --- the fit ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Data:
    once: np.ndarray
    rec: np.ndarray
    loops: np.ndarray
    log_loops: np.ndarray
    log_tokens: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    log_loss: np.ndarray
    x0: float  # mean log(N_once + N_rec): where a is re-expressed
    y0: float  # mean log D: where b is

    def log_equivalent(self, phi: float) -> tuple[np.ndarray, np.ndarray]:
        """(log(N_once + r^phi N_rec), its derivative in phi)."""
        reused = np.exp(phi * self.log_loops) * self.rec
        n = self.once + reused
        return np.log(n), reused * self.log_loops / n


def _check(params_once, params_rec, n_loops, tokens, loss) -> _Data:
    once, rec, loops, tokens, loss = (np.asarray(v, dtype=float).ravel()
                                      for v in (params_once, params_rec, n_loops, tokens, loss))
    n = once.size
    if not all(v.size == n for v in (rec, loops, tokens, loss)):
        raise ValueError("params_once, params_rec, n_loops, tokens and loss differ in length")
    values = np.stack([once, rec, loops, tokens, loss])
    if not np.all(np.isfinite(values)):
        raise ValueError("non-finite recurrence-law inputs")
    if np.any(once < 0) or np.any(rec < 0) or np.any(once + rec <= 0) or np.any(loops < 1) \
            or np.any(tokens <= 0) or np.any(loss <= 0):
        raise ValueError("recurrence-law inputs out of range (params >= 0, n_loops >= 1, "
                         "tokens and loss > 0)")
    if n < MIN_RUNS:
        raise FitError(f"{n} runs; the recurrence law has 6 parameters and needs at least "
                       f"{MIN_RUNS}")
    counts = np.unique(loops)
    if counts.size < 2:
        raise FitError(_one_loop_count(loops))
    if not np.any((loops > 1) & (rec > 0)):
        raise FitError("no looped run has looped-block parameters (params_rec = 0): phi is "
                       "not identified")
    sizes = np.unique(np.stack([once, rec, loops], axis=1), axis=0).shape[0]
    if sizes < 3:
        raise FitError(f"{sizes} distinct (params_once, params_rec, n_loops) in the table: the "
                       "law's N term (A, alpha, phi) needs three or more")
    if np.unique(tokens).size < 2:
        raise FitError("one token count in the table: the recurrence law needs two or more")
    log_tokens = np.log(tokens)
    return _Data(once=once, rec=rec, loops=loops, log_loops=np.log(loops),
                 log_tokens=log_tokens, tokens=tokens, loss=loss, log_loss=np.log(loss),
                 x0=float(np.mean(np.log(once + rec))), y0=float(np.mean(log_tokens)))


class _Objective:
    """Summed Huber loss of the log residuals and its gradient in
    theta = (a_c, b_c, e, alpha, beta, phi), with a = a_c + alpha x0 and b = b_c + beta y0.

    u_k are the three LSE terms; r = LSE(u) - log L; with c = clip(r, -delta, delta),
    Huber(r) = c (r - c/2), dHuber/dr = c, dLSE/du_k = softmax(u)_k, and
    d log N_eq / d phi = r^phi log r N_rec / N_eq. Written as separate small array operations:
    at tens of runs numpy's per-call cost is what an evaluation costs."""

    def __init__(self, data: _Data, delta: float):
        self.d = data
        self.delta = delta
        self.dy = data.log_tokens - data.y0
        self.log_r, self.which = np.unique(data.log_loops, return_inverse=True)

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        a_c, b_c, e, alpha, beta, phi = theta
        d = self.d
        reused = np.exp(phi * self.log_r)[self.which] * d.rec
        n = d.once + reused
        dx = np.log(n)
        dx -= d.x0
        u0 = a_c - alpha * dx
        u1 = b_c - beta * self.dy
        top = np.maximum(u0, u1)
        np.maximum(top, e, out=top)
        e0, e1, e2 = np.exp(u0 - top), np.exp(u1 - top), np.exp(e - top)
        s = e0 + e1
        s += e2
        r = np.log(s)
        r += top
        r -= d.log_loss
        c = np.minimum(np.maximum(r, -self.delta), self.delta)
        value = float(c @ r - 0.5 * (c @ c))
        k = c / s
        w0, w1 = e0 * k, e1 * k
        grad = np.array([w0.sum(), w1.sum(), e2 @ k, -(w0 @ dx), -(w1 @ self.dy),
                         -alpha * (w0 @ (reused * d.log_loops / n))])
        return value, grad


def _projected_grid(data: _Data, grid=EXPONENT_GRID) -> tuple[np.ndarray, np.ndarray]:
    """Every grid point (alpha, beta, phi) with its best (E, A, B) >= 0 in relative linear
    error, sum((L - E - A N_eq^-alpha - B D^-beta) / L)^2, and that error: (points (G, 6) as
    (alpha, beta, phi, E, A, B), errors (G,)).

    For one point this is NNLS with three columns; the optimum is the least-squares solution
    on some subset of the columns that comes out non-negative (its active set), so every
    subset is solved for all points at once from the 3 x 3 normal equations, and the feasible
    one of least error kept (at a subset's least-squares solution the error is n - c.z)."""
    alphas, betas, phis = grid
    w = 1.0 / data.loss
    log_n = np.stack([data.log_equivalent(p)[0] for p in phis])  # (P, n)
    f1 = np.exp(-alphas[None, :, None] * log_n[:, None, :]) * w  # (P, Al, n)
    f2 = np.exp(-betas[:, None] * data.log_tokens[None, :]) * w  # (Be, n)
    f0 = w
    shape = (phis.size, alphas.size, betas.size)
    gram = np.empty(shape + (3, 3))
    gram[..., 0, 0] = f0 @ f0
    gram[..., 0, 1] = gram[..., 1, 0] = (f1 @ f0)[:, :, None]
    gram[..., 0, 2] = gram[..., 2, 0] = (f2 @ f0)[None, None, :]
    gram[..., 1, 1] = np.einsum("pan,pan->pa", f1, f1)[:, :, None]
    gram[..., 2, 2] = np.einsum("bn,bn->b", f2, f2)[None, None, :]
    gram[..., 1, 2] = gram[..., 2, 1] = np.einsum("pan,bn->pab", f1, f2)
    z = np.empty(shape + (3,))
    z[..., 0] = f0.sum()
    z[..., 1] = f1.sum(axis=2)[:, :, None]
    z[..., 2] = f2.sum(axis=1)[None, None, :]

    best_gain = np.full(shape, -np.inf)
    best = np.zeros(shape + (3,))
    for k in (1, 2, 3):
        for subset in itertools.combinations(range(3), k):
            idx = np.array(subset)
            g = gram[..., idx[:, None], idx[None, :]]
            with np.errstate(all="ignore"):
                det_ok = np.abs(np.linalg.det(g)) > 1e-300
                c = np.linalg.solve(np.where(det_ok[..., None, None], g, np.eye(k)),
                                    z[..., idx][..., None])[..., 0]
            gain = np.einsum("...k,...k->...", c, z[..., idx])
            ok = det_ok & np.all(c >= 0, axis=-1) & np.isfinite(gain) & (gain > best_gain)
            best_gain = np.where(ok, gain, best_gain)
            full = np.zeros(shape + (3,))
            full[..., idx] = c
            best = np.where(ok[..., None], full, best)
    error = data.loss.size - best_gain  # (P, Al, Be)
    p_i, a_i, b_i = np.meshgrid(np.arange(phis.size), np.arange(alphas.size),
                                np.arange(betas.size), indexing="ij")
    points = np.stack([alphas[a_i], betas[b_i], phis[p_i], best[..., 0], best[..., 1],
                       best[..., 2]], axis=-1)
    return points.reshape(-1, 6), error.ravel()


def _seeds(points: np.ndarray, errors: np.ndarray, data: _Data, n_seeds: int) -> list:
    """Huber-fit starts theta from the best projected grid points, far enough apart."""
    order = np.argsort(errors, kind="stable")
    kept: list[np.ndarray] = []
    floor = 1e-6 * float(data.loss.min())  # a coefficient at 0 starts just above it
    for i in order:
        if not np.isfinite(errors[i]):
            break
        ex = points[i, :3]
        if all(np.max(np.abs(ex - k[:3])) > SEED_SEPARATION for k in kept):
            kept.append(points[i])
            if len(kept) >= n_seeds:
                break
    starts = []
    for alpha, beta, phi, E, A, B in kept:
        a, b, e = (math.log(max(v, floor)) for v in (A, B, E))
        starts.append(np.array([a - alpha * data.x0, b - beta * data.y0, e, alpha, beta, phi]))
    return starts


def fit_recurrence(params_once, params_rec, n_loops, tokens, loss, delta: float = HUBER_DELTA,
                   n_seeds: int = N_SEEDS, grid=EXPONENT_GRID) -> RecurrenceFit:
    """Fits the recurrence law to one row per run (see the module docstring); FitError when
    the runs cannot carry it, ValueError on malformed input."""
    data = _check(params_once, params_rec, n_loops, tokens, loss)
    objective = _Objective(data, delta)
    bounds = [(None, None)] * 3 + list(EXPONENT_BOUNDS)
    with single_threaded_blas():
        points, errors = _projected_grid(data, grid)
        starts = _seeds(points, errors, data, n_seeds)
        results = []
        for start in starts:
            res = minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds,
                           options=_TIGHT)
            if np.isfinite(res.fun) and np.all(np.isfinite(res.x)):
                results.append((float(res.fun), res.x))
    if not results:
        raise FitError("no start reached a finite optimum")
    value, (a_c, b_c, e, alpha, beta, phi) = min(results, key=lambda r: r[0])
    with np.errstate(over="ignore"):  # a runaway coefficient is inf, reported as null
        E, A, B = (float(np.exp(v)) for v in (e, a_c + alpha * data.x0, b_c + beta * data.y0))
    fit = RecurrenceFit(E=E, A=A, B=B, alpha=float(alpha), beta=float(beta), phi=float(phi),
                        objective=value, n_runs=int(data.loss.size),
                        loop_counts=tuple(_int(r) for r in np.unique(data.loops)),
                        residual_sd=math.nan, r2=math.nan, n_starts=int(errors.size),
                        n_polished=len(starts), delta=delta)
    with np.errstate(all="ignore"):
        resid = data.loss - fit.predict(data.once, data.rec, data.loops, data.tokens)
        total = float(np.sum((data.loss - data.loss.mean()) ** 2))
        r2 = 1.0 - float(resid @ resid) / total if total > 0 else math.nan
    return dataclasses.replace(fit, residual_sd=float(np.std(resid, ddof=1)), r2=r2)


def bootstrap_recurrence(full: RecurrenceFit, params_once, params_rec, n_loops, tokens, loss,
                         n_resamples: int, rng: np.random.Generator, level: float = 0.95,
                         clusters: np.ndarray | None = None,
                         stratify: bool = True) -> Bootstrap:
    """Refits on `n_resamples` resamples of the runs' clusters (`clusters`: one label per row,
    a cooldown trunk's branches sharing its label; None: every run alone; bootstrap.py), each
    from the whole exponent grid. With `stratify` the clusters are drawn within their loop
    count (as the IsoFLOP bootstrap draws within budgets), so no resample loses a loop count
    by chance; bootstrap.design falls back to one draw over all clusters when some loop count
    holds a single cluster. A refit the resample cannot carry counts as failed."""
    arrays = [np.asarray(v, dtype=float) for v in (params_once, params_rec, n_loops, tokens,
                                                   loss)]
    plan = design(arrays[0].size, clusters, arrays[2] if stratify else None)

    def refit(idx: np.ndarray) -> dict[str, float] | None:
        try:
            return fit_recurrence(*(v[idx] for v in arrays), delta=full.delta).figures()
        except FitError:
            return None

    with single_threaded_blas():
        return run_bootstrap(refit, FIGURES, plan, n_resamples, rng, level=level)


# --- fit.json's `recurrence` object ---------------------------------------------------------


def recurrence_json(table: tbl.ResultsTable, bootstrap: int = 0, seed: int = 0,
                    level: float = 0.95, delta: float = HUBER_DELTA,
                    budget_tolerance: float = BUDGET_TOLERANCE_DEX) -> dict[str, Any]:
    """fit.json's top-level `recurrence` object (module docstring). Its resamples come from
    np.random.default_rng([seed, crc32("recurrence"), k]), k = 0 (dense), 1 (MoE, stored N_rec),
    2 (MoE, active N_rec)."""
    if not table.has_recurrence:
        return {"skipped": "the table has no params_once, params_rec and n_loops columns "
                           "(`loopscale collect` writes them)"}
    runs = table.runs
    once, rec, loops = (runs[c].to_numpy(dtype=float)
                        for c in (tbl.PARAMS_ONCE, tbl.PARAMS_REC, tbl.N_LOOPS))
    with np.errstate(invalid="ignore"):
        usable = (np.isfinite(once) & np.isfinite(rec) & np.isfinite(loops) & (once >= 0)
                  & (rec >= 0) & (once + rec > 0) & (loops >= 1))
    if not usable.any():
        return {"skipped": "no fitted run has params_once, params_rec and n_loops"}
    active = (runs[PARAMS_REC_ACTIVE].to_numpy(dtype=float) if PARAMS_REC_ACTIVE in runs
              else None)
    if active is not None:
        with np.errstate(invalid="ignore"):
            usable &= np.isfinite(active) & (active >= 0)
        if not usable.any():
            return {"skipped": "no fitted run has params_once, params_rec, params_rec_active "
                               "and n_loops"}
    moe = _moe_mask(runs, rec, active)
    budgets = _budgets(table, budget_tolerance)
    rows = np.flatnonzero(usable)
    dense_rows = rows[~moe[rows]] if moe is not None else rows
    moe_rows = rows[moe[rows]] if moe is not None else rows[:0]

    def group(idx: np.ndarray, n_rec: np.ndarray, kind: str, stream: int, where: str) -> dict:
        if np.unique(loops[idx]).size < 2:
            return {"skipped": _one_loop_count(loops[idx], where)}
        rng = np.random.default_rng([seed, zlib.crc32(b"recurrence"), stream])
        return _group_json(runs.iloc[idx], once[idx], n_rec[idx],
                           (active if active is not None else rec)[idx], loops[idx],
                           budgets[idx], kind, active is not None, bootstrap, rng, level,
                           delta)

    if dense_rows.size:
        out = group(dense_rows, rec, "stored", 0,
                    "in the table" if moe is None else "among the dense runs")
    else:
        out = {"skipped": "no dense run (every run with recurrence inputs is MoE)"}
    if moe_rows.size:
        if np.unique(loops[moe_rows]).size < 2:
            out["moe"] = {"skipped": _one_loop_count(loops[moe_rows], "among the MoE runs")}
        else:
            where = "among the MoE runs"
            out["moe"] = {"stored": group(moe_rows, rec, "stored", 1, where),
                          "active": (group(moe_rows, active, "active", 2, where)
                                     if active is not None
                                     else {"skipped": "the table has no params_rec_active "
                                                      "column"})}
    return clean(out)


def _moe_mask(runs: pd.DataFrame, rec: np.ndarray, active: np.ndarray | None):
    """Which runs are MoE: a looped block with fewer active than stored parameters, else the
    ffn column; None when the table says neither (then every run is one group)."""
    if active is not None:
        with np.errstate(invalid="ignore"):
            return np.asarray(active < rec)
    if FFN in runs:
        return runs[FFN].astype(str).str.lower().eq("moe").to_numpy()
    return None


def _budgets(table: tbl.ResultsTable, tolerance: float) -> np.ndarray:
    flops = table.runs[tbl.FLOPS].to_numpy(dtype=float)
    if table.has_budget:
        return table.runs[tbl.BUDGET].to_numpy(dtype=float)
    return assign_budgets(flops, tolerance)


def _one_loop_count(loops: np.ndarray, where: str = "in the table") -> str:
    return (f"one loop count (r = {_int(np.unique(loops)[0])}) {where}: the recurrence law "
            "needs runs at two or more")


def _group_json(frame: pd.DataFrame, once: np.ndarray, rec: np.ndarray,
                rec_active: np.ndarray, loops: np.ndarray, budgets: np.ndarray, kind: str,
                has_active: bool, n_boot: int, rng: np.random.Generator, level: float,
                delta: float) -> dict[str, Any]:
    tokens = frame[tbl.TOKENS].to_numpy(dtype=float)
    loss = frame[tbl.LOSS].to_numpy(dtype=float)
    try:
        fit = fit_recurrence(once, rec, loops, tokens, loss, delta=delta)
    except FitError as e:
        return {"skipped": str(e)}
    boot = None
    if n_boot > 0:
        boot = bootstrap_recurrence(fit, once, rec, loops, tokens, loss, n_boot, rng, level,
                                    frame[tbl.CLUSTER].to_numpy())
    out: dict[str, Any] = {}
    for name, value in fit.figures().items():
        out[name] = value
        out[f"{name}_ci"] = None if boot is None else boot.interval(name)
    families = list(pd.unique(frame[tbl.FAMILY]))
    runs = frame[tbl.RUN].tolist()
    names = [r if r is not None else f"row {i}" for r, i in zip(runs, frame.index)]
    equivalent = fit.equivalent_params(once, rec, loops)
    max_loops = max(fit.loop_counts)
    backbones = list(dict.fromkeys(zip(once.tolist(), rec.tolist(),
                                       (rec if kind == "active" else rec_active).tolist())))
    chosen = best_loops(fit, sorted(set(budgets.tolist())), backbones, max_loops)
    out.update(
        n_runs=fit.n_runs, loop_counts=list(fit.loop_counts), families=families,
        residual_sd=fit.residual_sd, r2=fit.r2, objective=fit.objective, params=kind,
        compute_params=("params_rec_active" if has_active or kind == "active"
                        else "params_rec"),
        max_loops=max_loops,
        bootstrap=None if boot is None else {
            **boot.to_json(), "not_identified": boot.reasons()},
        equivalent_params=[
            {"run": names[i], "family": frame[tbl.FAMILY].iloc[i], "n_loops": _int(loops[i]),
             "params_once": once[i], "params_rec": rec[i], "equivalent": equivalent[i]}
            for i in range(len(frame)) if loops[i] > 1],
        optimal_loops=[c.to_json() for c in chosen])
    return out


def _int(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


# --- the report -----------------------------------------------------------------------------


def report_lines(rec: dict[str, Any]) -> list[str]:
    """Plain-text lines for the report: phi with its interval (or why there is none), each
    looped size's parameter-equivalent size, the compute-optimal loop count per budget."""
    lines = _group_lines("recurrence law", rec)
    moe = rec.get("moe")
    if isinstance(moe, dict):
        if "skipped" in moe:
            lines.append(f"recurrence law (MoE): skipped: {moe['skipped']}")
        else:
            for kind in ("stored", "active"):
                if kind in moe:
                    lines += _group_lines(f"recurrence law (MoE, {kind} N_rec)", moe[kind])
    return lines


def _group_lines(title: str, g: dict[str, Any]) -> list[str]:
    if "phi" not in g:
        return [f"{title}: skipped: {g.get('skipped', 'no fit')}"]
    why = (g.get("bootstrap") or {}).get("not_identified", {}).get("phi")
    ci = g.get("phi_ci")
    interval = (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f" ({why})" if why else "")
    loops = ", ".join(str(r) for r in g["loop_counts"])
    lines = [f"{title} ({', '.join(map(str, g['families']))}; {g['n_runs']} runs at r = "
             f"{loops}): phi = {_fmt(g['phi'], 3)}{interval}, alpha = {_fmt(g['alpha'], 3)}, "
             f"beta = {_fmt(g['beta'], 3)}, R^2 = {_fmt(g['r2'], 4)}, residual SD "
             f"{_fmt(g['residual_sd'], 3)} nats"]
    sizes: dict[tuple, list] = {}
    for e in g.get("equivalent_params", []):
        key = (e["family"], e["n_loops"], e["params_once"], e["params_rec"])
        sizes.setdefault(key, [e["equivalent"], 0])[1] += 1
    for (family, r, once, n_rec), (equiv, count) in sizes.items():
        stored = (once or 0) + (n_rec or 0)
        lines.append(f"  {family} r={r}: {_size(once)} once + {_size(n_rec)} looped "
                     f"({_size(stored)} stored) ~ {_size(equiv)} unique-equivalent "
                     f"({count} run{'s' if count != 1 else ''})")
    for c in g.get("optimal_loops", []):
        lines.append(f"  compute-optimal at C = {c['budget']:.3g}: r = {c['n_loops']} on "
                     f"{_size(c['params_once'])} once + {_size(c['params_rec'])} looped, "
                     f"L = {_fmt(c['loss'], 4)}")
    return lines


def _fmt(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _size(n: Any) -> str:
    if n is None:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"
