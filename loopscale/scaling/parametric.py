"""Chinchilla approach 3: L(N, D) = E + A / N^alpha + B / D^beta, fitted in log space.

The protocol is Hoffmann et al. 2022 as replicated by Besiroglu et al. 2024 (their notebook):
  log L_hat = LSE(a - alpha log N, b - beta log D, e),  A = exp(a), B = exp(b), E = exp(e),
  objective = sum over runs of Huber_delta(log L_hat - log L), delta = 1e-3,
minimised with scipy's L-BFGS-B from every start of a grid, keeping the best converged result
(then polished with tight tolerances; see _TIGHT for why).
The Hoffmann grid (the default) is alpha, beta in {0, 0.5, 1, 1.5, 2}, e in {-1, -0.5, 0, 0.5,
1}, a, b in {0, 5, ..., 25}: 4,500 starts. No bounds, as in the notebook.

Speed (this is what keeps 4,500 starts plus 1,000 bootstrap refits near a minute on 2 cores):
- the objective and its analytic gradient are one vectorised numpy pass over the runs, and the
  gradient is handed to L-BFGS-B (jac=True), so no finite differences;
- OpenBLAS is held to one thread while fitting: L-BFGS-B does its 5x5 algebra through BLAS,
  and with OpenBLAS threads each call paid a thread wake-up (measured on the 2-core machine:
  300 grid starts took 16.7 s with OpenBLAS's 2 threads, 0.7-2.4 s with 1);
- bootstrap refits (`bootstrap_parametric`) start from `ParametricFit.warm_starts`, the
  full-data optimum and the next few distinct local optima the grid found, instead of the
  whole grid, and run to convergence (_TIGHT); `loopscale bench --only=fit_seconds` times it all.

The compute-optimal allocation under C = 6 N D (d/dN of L at fixed C set to zero):
  N_opt = G (C/6)^a,  D_opt = (C/6)^b / G,  G = (alpha A / (beta B))^(1/(alpha+beta)),
  a = beta / (alpha + beta),  b = alpha / (alpha + beta).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterator

import numpy as np
from threadpoolctl import threadpool_limits
from scipy.optimize import minimize

from loopscale.scaling import FitError
from loopscale.scaling.bootstrap import Bootstrap, design, run_bootstrap

HUBER_DELTA = 1e-3
FIGURES = ("E", "A", "B", "alpha", "beta", "G", "a", "b")
# Bootstrap warm starts: the full-data optimum plus this many other distinct grid optima,
# "distinct" meaning some coordinate of (a, b, e, alpha, beta) differs by more than
# WARM_START_SEPARATION from every one kept. The Chinchilla optimum lies in a flat valley whose
# near-equal optima differ by a few hundredths in a and b; the separation skips those and
# keeps other basins, which is what protects a resample whose best basin changed.
N_EXTRA_WARM_STARTS = 3
WARM_START_SEPARATION = 0.25


@dataclasses.dataclass(frozen=True)
class ParametricFit:
    E: float
    A: float
    B: float
    alpha: float
    beta: float
    objective: float  # summed Huber loss at the optimum
    n_points: int
    n_starts: int
    n_converged: int
    # (a, b, e, alpha, beta) of the optimum first, then other distinct local optima by
    # objective; bootstrap refits start from these.
    warm_starts: tuple[tuple[float, ...], ...]

    @property
    def has_allocation(self) -> bool:
        """The fit is unbounded (no bounds, as in the notebook), so an exponent can come out
        <= 0 on poor data: then loss does not fall with N (or D) and no compute-optimal
        allocation exists; G, a and b are NaN (null in fit.json), not complex numbers."""
        return self.alpha > 0 and self.beta > 0

    @property
    def G(self) -> float:
        if not self.has_allocation:
            return float("nan")
        ratio = self.alpha * self.A / (self.beta * self.B)
        return float(ratio ** (1.0 / (self.alpha + self.beta)))

    @property
    def a(self) -> float:
        return self.beta / (self.alpha + self.beta) if self.has_allocation else float("nan")

    @property
    def b(self) -> float:
        return self.alpha / (self.alpha + self.beta) if self.has_allocation else float("nan")

    def figures(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in FIGURES}

    def predict(self, params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.E + self.A / np.power(params, self.alpha) + self.B / np.power(tokens, self.beta)

    def compute_optimal(self, flops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N_opt, D_opt) at compute C, with C = 6 N D."""
        c6 = np.asarray(flops, dtype=float) / 6.0
        return self.G * c6 ** self.a, c6 ** self.b / self.G

    def frontier(self, flops: np.ndarray) -> np.ndarray:
        """The loss at the compute-optimal allocation."""
        n, d = self.compute_optimal(flops)
        return self.predict(n, d)


def grid_starts(name: str = "hoffmann") -> np.ndarray:
    """Starting points (a, b, e, alpha, beta), one per row.

    `hoffmann`: the 4,500-point grid above. `small`: 108 points spanning the same region, for
    quick looks and tests; it is not the published protocol.
    """
    if name == "hoffmann":
        alphas = betas = np.arange(0.0, 2.5, 0.5)
        es = np.arange(-1.0, 1.5, 0.5)
        a_s = b_s = np.arange(0.0, 30.0, 5.0)
    elif name == "small":
        alphas = betas = np.array([0.25, 0.75])
        es = np.array([-1.0, 0.0, 1.0])
        a_s = b_s = np.array([0.0, 10.0, 20.0])
    else:
        raise ValueError(f"unknown grid {name!r} (hoffmann, small)")
    # Same nesting as the reference notebook (alpha, beta, e, a, b), so ties break alike.
    rows = [(a, b, e, al, be) for al, be, e, a, b in itertools.product(alphas, betas, es, a_s, b_s)]
    return np.array(rows, dtype=float)


class _Objective:
    """Huber loss of log-space residuals and its gradient, vectorised over the runs.

    u (3 x n) = M @ theta stacks the three LSE terms; r = LSE(u) - log L; with c = clip(r, -d, d)
    Huber(r) = c (r - c/2) and dHuber/dr = c; dLSE/du = softmax(u).
    """

    def __init__(self, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, delta: float):
        x, y = np.log(params), np.log(tokens)
        n = x.size
        zero, one = np.zeros(n), np.ones(n)
        self.m = np.concatenate([
            np.stack([one, zero, zero, -x, zero], axis=1),
            np.stack([zero, one, zero, zero, -y], axis=1),
            np.stack([zero, zero, one, zero, zero], axis=1),
        ])
        self.target = np.log(loss)
        self.n = n
        self.delta = delta

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        u = (self.m @ theta).reshape(3, self.n)
        top = u.max(axis=0)
        ex = np.exp(u - top)
        s = ex.sum(axis=0)
        r = top + np.log(s) - self.target
        c = np.clip(r, -self.delta, self.delta)
        value = float(c @ (r - 0.5 * c))
        grad = self.m.T @ (ex * (c / s)).ravel()
        return value, grad


def fit_parametric(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                   starts: np.ndarray | None = None, delta: float = HUBER_DELTA,
                   tight: bool = False) -> ParametricFit:
    """Fits L(N, D) from every start (default: the Hoffmann grid) and keeps the best.

    With tight=False (the grid protocol) each start runs with scipy's default tolerances, as
    in the reference notebook, and then the best distinct endpoints are polished with tight
    ones. With tight=True (bootstrap refits from warm starts) every start runs tight.
    """
    params, tokens, loss = (np.asarray(v, dtype=float) for v in (params, tokens, loss))
    if params.size < 6:
        raise FitError(f"{params.size} runs; the parametric fit needs at least 6")
    if np.unique(params).size < 2 or np.unique(tokens).size < 2:
        raise FitError("the parametric fit needs at least two distinct N and two distinct D")
    starts = grid_starts() if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    objective = _Objective(params, tokens, loss, delta)
    with single_threaded_blas():
        results = [r for r in (_solve(objective, s, tight) for s in starts) if r is not None]
        n_converged = sum(ok for _, ok, _ in results)
        if results and not tight:
            best = _distinct([x for _, _, x in _ranked(results)])
            results += [r for r in (_solve(objective, np.array(t), True) for t in best) if r]
    if not results:
        raise FitError("no start reached a finite optimum")
    ranked = _ranked(results)
    value, _, (a, b, e, alpha, beta) = ranked[0]
    with np.errstate(over="ignore"):  # a runaway coefficient is inf, reported as null
        E, A, B = (float(np.exp(v)) for v in (e, a, b))
    return ParametricFit(
        E=E, A=A, B=B, alpha=float(alpha),
        beta=float(beta), objective=value, n_points=params.size, n_starts=len(starts),
        n_converged=n_converged, warm_starts=_distinct([x for _, _, x in ranked]))


# L-BFGS-B's ftol is relative to max(|f|, 1), and this objective is ~1e-3 (a sum of Huber
# terms of log residuals), so the default ftol (2.2e-9) is in effect a relative 2e-6: from a
# warm start it stops after a few steps in the flat valley of the Chinchilla optimum,
# which made bootstrap intervals too narrow (alpha 0.331-0.366 against 0.317-0.373 from
# refits run to convergence). These tolerances run to convergence.
_TIGHT = {"ftol": 1e-15, "gtol": 1e-12}


def _solve(objective: _Objective, start: np.ndarray, tight: bool):
    """(objective value, converged, theta) from one start, None if it left the finite range."""
    res = minimize(objective, start, jac=True, method="L-BFGS-B",
                   options=_TIGHT if tight else None)
    if not (np.isfinite(res.fun) and np.all(np.isfinite(res.x))):
        return None
    # A tight run that ends on a line-search failure has hit float precision, not diverged:
    # it counts as converged, so the lowest objective wins among tight runs.
    return float(res.fun), bool(res.success) or tight, res.x


def _ranked(results: list) -> list:
    # The reference notebook keeps only converged starts; fall back to all if none converged.
    pool = [r for r in results if r[1]] or results
    return sorted(pool, key=lambda r: r[0])


def _distinct(thetas: list[np.ndarray], extra: int = N_EXTRA_WARM_STARTS) -> tuple:
    """The first theta and up to `extra` more, each far from every one kept before it."""
    kept: list[np.ndarray] = []
    for theta in thetas:
        if all(np.max(np.abs(theta - k)) > WARM_START_SEPARATION for k in kept):
            kept.append(theta)
            if len(kept) > extra:
                break
    return tuple(tuple(float(v) for v in k) for k in kept)


# --- BLAS threads -------------------------------------------------------------------------
# threadpoolctl does this properly when it is installed; otherwise talk to the OpenBLAS
# libraries numpy and scipy load (their wheels name the entry points with these prefixes).


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Holds BLAS to one thread inside the block: the objective's small matrix products are
    ~20x slower when OpenBLAS spreads them over threads."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def bootstrap_parametric(full: ParametricFit, params: np.ndarray, tokens: np.ndarray,
                         loss: np.ndarray, n_resamples: int, rng: np.random.Generator,
                         delta: float = HUBER_DELTA, level: float = 0.95,
                         clusters: np.ndarray | None = None) -> Bootstrap:
    """Refits on `n_resamples` resamples of the runs' clusters (`clusters`: one label per
    row, None: every run alone; see bootstrap.py), each from `full.warm_starts` only.

    Warm starts instead of the grid: a resample moves the optimum a little, so the full-data
    optimum is the natural start, and the other distinct grid optima cover a resample whose
    best basin changed. This is ~1,000x fewer starts per refit than the grid.
    """
    params, tokens, loss = (np.asarray(v, dtype=float) for v in (params, tokens, loss))
    starts = np.array(full.warm_starts)

    def refit(idx: np.ndarray) -> dict[str, float] | None:
        try:
            return fit_parametric(params[idx], tokens[idx], loss[idx], starts=starts,
                                  delta=delta, tight=True).figures()
        except FitError:
            return None

    with single_threaded_blas():
        return run_bootstrap(refit, FIGURES, design(params.size, clusters), n_resamples, rng,
                             level=level)
