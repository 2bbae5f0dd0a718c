"""Chinchilla approach 3: L(N, D) = E + A / N^alpha + B / D^beta, fitted in log space.

The protocol is Hoffmann et al. 2022 as replicated by Besiroglu et al. 2024 (their notebook):
  log L_hat = LSE(a - alpha log N, b - beta log D, e),  A = exp(a), B = exp(b), E = exp(e),
  objective = sum over runs of Huber_delta(log L_hat - log L), delta = 1e-3,
minimised with scipy's L-BFGS-B from every start of a grid, keeping the best converged result
(then polished with tight tolerances; see _TIGHT for why).
The Hoffmann grid (the default) is alpha, beta in {0, 0.5, 1, 1.5, 2}, e in {-1, -0.5, 0, 0.5,
1}, a, b in {0, 5, ..., 25}: 4,500 starts. No bounds, as in the notebook (unless `e_bounds`).

Bootstrap refits search a full grid too, made cheap by variable projection (`varpro_starts`).
For fixed (alpha, beta), L = E + A N^-alpha + B D^-beta is linear in (E, A, B), so the best
(E, A, B) >= 0 is a small non-negative least-squares problem. It is solved exactly, for every
point of a 101 x 101 grid alpha, beta in {0, 0.02, ..., 2} at once (the Hoffmann range, 50x
finer), by enumerating the active sets of the three coefficients in closed form: ~10 ms per
resample, where 4,500 L-BFGS-B starts take ~30 s. The least squares are weighted by 1/L^2, so
they measure relative residuals, the first-order log residuals of the Huber objective. The
best few distinct local minima of that profile over the grid (N_VARPRO_SEEDS of them, at least
VARPRO_SEPARATION apart in alpha or beta) become starts theta = (log A, log B, log E, alpha,
beta) for the Huber log-space L-BFGS-B fit, run to convergence (_TIGHT), and the best result
is kept. A coefficient that the least squares put at 0 starts at a floor (FLOOR of the
smallest loss, at the runs' geometric-mean N or D for A and B) so that its log is finite. The
full-data optimum (`warm_starts[0]`) is one more start, and so is any other of the full
fit's distinct optima whose exponents lie outside the grid. On Chinchilla (200 resamples) the
grid's starts alone reach the best objective of grid plus all warm starts on 198 resamples
and stall 3e-7 (relative) short of it in the Huber objective's flat, kinked valley on 2; the
full-data optimum as an extra start closes those.
Why: the earlier refits started only from the full-data optima, so a resample whose best
basin lay elsewhere was refitted in the wrong basin (see the tests for a law where that
happens); the grid over (alpha, beta) finds every basin of the profile on each resample, and
(E, A, B) need no grid at all because they are solved for. The full-data fit keeps the
Hoffmann grid: it is the published protocol, and its figures are pinned to the replication's.

Bounds on E: `e_bounds=(E_min, E_max)`, either None, bounds e = log E in L-BFGS-B; E_min ==
E_max fixes E, which then leaves the search (four free parameters, E a constant) and is
reported exactly. The grid's least squares respect the same bounds (for fixed E they fit
L - E for A and B). Bounds that are not positive numbers, or E_min > E_max, are a FitError.

Goodness of fit, per fit, over the runs it fitted (attributes, not bootstrap figures):
- `residual_sd`: the standard deviation (ddof=1) of the residuals r = L - L_hat, in nats;
- `lack_of_fit`: Marin's 90% lack-of-fit interval (marin-community/marin issue #8096, which
  asks for "the 90% lack-of-fit interval (Student-t, n-2 dof for the 4-point fit, see
  #6757)" on its two-parameter envelope fit): +-t_{0.95, n-p} s around the law, where
  s = sqrt(sum r^2 / (n - p)) is the residual standard error and p the number of fitted
  parameters (5, or 4 with E fixed). With Gaussian residuals 90% of runs lie within it.

Speed (this is what keeps 4,500 starts plus 1,000 bootstrap refits near a minute on 2 cores):
- the objective and its analytic gradient are one vectorised numpy pass over the runs, and the
  gradient is handed to L-BFGS-B (jac=True), so no finite differences;
- OpenBLAS is held to one thread while fitting: L-BFGS-B does its 5x5 algebra through BLAS,
  and with OpenBLAS threads each call paid a thread wake-up (measured on the 2-core machine:
  300 grid starts took 16.7 s with OpenBLAS's 2 threads, 0.7-2.4 s with 1);
- bootstrap refits run a handful of tight L-BFGS-B fits from the variable-projection starts
  above instead of 4,500; `loopscale bench --only=fit_seconds` times it all.

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
from scipy.optimize import minimize
from scipy.special import stdtrit  # Student-t quantile; scipy.stats adds ~0.3 s of import
from threadpoolctl import threadpool_limits

from loopscale.scaling import FitError
from loopscale.scaling.bootstrap import Bootstrap, design, run_bootstrap

HUBER_DELTA = 1e-3
FIGURES = ("E", "A", "B", "alpha", "beta", "G", "a", "b")
# Bootstrap warm starts: the full-data optimum plus this many other distinct grid optima,
# "distinct" meaning some coordinate of (a, b, e, alpha, beta) differs by more than
# WARM_START_SEPARATION from every one kept. The Chinchilla optimum lies in a flat valley whose
# near-equal optima differ by a few hundredths in a and b; the separation skips those and
# keeps other basins.
N_EXTRA_WARM_STARTS = 3
WARM_START_SEPARATION = 0.25
# Variable projection (see the module docstring): the (alpha, beta) grid, how many of its
# local minima seed a refit and how far apart (in alpha or beta) they must be, and the floor,
# relative to the smallest loss, for a coefficient the least squares set to 0.
EXPONENT_GRID = np.linspace(0.0, 2.0, 101)
N_VARPRO_SEEDS = 4
VARPRO_SEPARATION = 0.1
FLOOR = 1e-3
LACK_OF_FIT_LEVEL = 0.90

EBounds = tuple[float | None, float | None]


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
    # objective; bootstrap refits start from these (besides the variable-projection grid).
    warm_starts: tuple[tuple[float, ...], ...]
    # Goodness of fit over the fitted runs (see the module docstring), in nats.
    residual_sd: float = float("nan")
    lack_of_fit: tuple[float, float] = (float("nan"), float("nan"))
    e_bounds: EBounds = (None, None)  # (E_min, E_max), None: unbounded on that side

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


def check_e_bounds(e_bounds: tuple | None) -> EBounds:
    """(E_min, E_max) with None for an open side; FitError unless each given bound is a
    positive finite number and E_min <= E_max."""
    if e_bounds is None:
        return (None, None)
    try:
        low, high = e_bounds
    except (TypeError, ValueError):
        raise FitError(f"e_bounds must be a pair (E_min, E_max), got {e_bounds!r}") from None
    out = []
    for name, v in (("E_min", low), ("E_max", high)):
        if v is not None:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise FitError(f"{name} = {v!r} is not a number") from None
            if not (np.isfinite(v) and v > 0):
                raise FitError(f"{name} = {v} is not a positive finite number")
        out.append(v)
    if out[0] is not None and out[1] is not None and out[0] > out[1]:
        raise FitError(f"E_min = {out[0]} is above E_max = {out[1]}")
    return (out[0], out[1])


class _Space:
    """The searched coordinates under E bounds: theta = (a, b, e, alpha, beta) itself, or,
    with E fixed, (a, b, alpha, beta) with e = log E a constant; L-BFGS-B bounds on e."""

    def __init__(self, e_bounds: EBounds):
        self.E_min, self.E_max = e_bounds
        self.fixed = self.E_min is not None and self.E_min == self.E_max
        self.e_min = -np.inf if self.E_min is None else float(np.log(self.E_min))
        self.e_max = np.inf if self.E_max is None else float(np.log(self.E_max))
        self.e_fixed = self.e_min if self.fixed else None
        self.n_free = 4 if self.fixed else 5
        if self.fixed or e_bounds == (None, None):
            self.bounds = None  # exactly the notebook's unbounded L-BFGS-B
        else:
            e = (None if self.E_min is None else self.e_min,
                 None if self.E_max is None else self.e_max)
            self.bounds = [(None, None), (None, None), e, (None, None), (None, None)]

    def starts(self, thetas: np.ndarray) -> np.ndarray:
        """Starts in search coordinates, e clipped into its bounds, duplicates dropped (first
        kept, order kept)."""
        if self.fixed:
            xs = thetas[:, [0, 1, 3, 4]]
        elif self.bounds is not None:
            xs = thetas.copy()
            xs[:, 2] = np.clip(xs[:, 2], self.e_min, self.e_max)
        else:
            xs = thetas
        _, first = np.unique(xs, axis=0, return_index=True)
        return xs if first.size == len(xs) else xs[np.sort(first)]

    def theta(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return np.insert(x, 2, self.e_fixed) if self.fixed else x

    def E(self, e: float) -> float:
        """E = exp(e), exactly the bound when e sits on it."""
        if self.E_max is not None and e >= self.e_max:
            return self.E_max
        if self.E_min is not None and e <= self.e_min:
            return self.E_min
        with np.errstate(over="ignore"):
            return float(np.exp(e))


class _Objective:
    """Huber loss of log-space residuals and its gradient, vectorised over the runs.

    u (3 x n) = M @ theta stacks the three LSE terms; r = LSE(u) - log L; with c = clip(r, -d, d)
    Huber(r) = c (r - c/2) and dHuber/dr = c; dLSE/du = softmax(u). With e fixed, M loses the
    e column and the e term is a constant offset.
    """

    def __init__(self, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, delta: float,
                 e_fixed: float | None = None):
        x, y = np.log(params), np.log(tokens)
        n = x.size
        zero, one = np.zeros(n), np.ones(n)
        m = np.concatenate([
            np.stack([one, zero, zero, -x, zero], axis=1),
            np.stack([zero, one, zero, zero, -y], axis=1),
            np.stack([zero, zero, one, zero, zero], axis=1),
        ])
        self.offset = None
        if e_fixed is not None:
            self.offset = m[:, 2] * e_fixed
            m = np.ascontiguousarray(m[:, [0, 1, 3, 4]])
        self.m = m
        self.target = np.log(loss)
        self.n = n
        self.delta = delta

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        u = self.m @ theta
        if self.offset is not None:
            u = u + self.offset
        u = u.reshape(3, self.n)
        top = u.max(axis=0)
        ex = np.exp(u - top)
        s = ex.sum(axis=0)
        r = top + np.log(s) - self.target
        c = np.clip(r, -self.delta, self.delta)
        value = float(c @ (r - 0.5 * c))
        grad = self.m.T @ (ex * (c / s)).ravel()
        return value, grad


def _checked(params, tokens, loss) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    params, tokens, loss = (np.asarray(v, dtype=float) for v in (params, tokens, loss))
    if params.size < 6:
        raise FitError(f"{params.size} runs; the parametric fit needs at least 6")
    if np.unique(params).size < 2 or np.unique(tokens).size < 2:
        raise FitError("the parametric fit needs at least two distinct N and two distinct D")
    return params, tokens, loss


def fit_parametric(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                   starts: np.ndarray | None = None, delta: float = HUBER_DELTA,
                   tight: bool = False, e_bounds: tuple | None = None) -> ParametricFit:
    """Fits L(N, D) from every start (default: the Hoffmann grid) and keeps the best.

    With tight=False (the grid protocol) each start runs with scipy's default tolerances, as
    in the reference notebook, and then the best distinct endpoints are polished with tight
    ones. With tight=True (bootstrap refits) every start runs tight. `e_bounds` = (E_min,
    E_max), either None, bounds E; E_min == E_max fixes it (see the module docstring). Starts
    are (a, b, e, alpha, beta) rows; with E bounded their e is clipped into the bounds.
    """
    params, tokens, loss = _checked(params, tokens, loss)
    space = _Space(check_e_bounds(e_bounds))
    starts = grid_starts() if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    if starts.ndim != 2 or starts.shape[1] != 5:
        raise ValueError(f"starts must be rows of (a, b, e, alpha, beta), got {starts.shape}")
    xs = space.starts(starts)
    objective = _Objective(params, tokens, loss, delta, space.e_fixed)
    with single_threaded_blas():
        results = [r for r in (_solve(objective, s, tight, space.bounds) for s in xs)
                   if r is not None]
        n_converged = sum(ok for _, ok, _ in results)
        if results and not tight:
            best = _distinct([x for _, _, x in _ranked(results)])
            results += [r for r in (_solve(objective, np.array(t), True, space.bounds)
                                    for t in best) if r]
    if not results:
        raise FitError("no start reached a finite optimum")
    ranked = _ranked(results)
    value, _, x = ranked[0]
    a, b, e, alpha, beta = space.theta(x)
    with np.errstate(over="ignore"):  # a runaway coefficient is inf, reported as null
        A, B = (float(np.exp(v)) for v in (a, b))
    warm = tuple(tuple(float(v) for v in space.theta(k))
                 for k in _distinct([x for _, _, x in ranked]))
    fit = ParametricFit(
        E=space.E(e), A=A, B=B, alpha=float(alpha), beta=float(beta), objective=value,
        n_points=params.size, n_starts=len(xs), n_converged=n_converged, warm_starts=warm,
        e_bounds=(space.E_min, space.E_max))
    sd, lof = _goodness(fit, params, tokens, loss, space.n_free)
    return dataclasses.replace(fit, residual_sd=sd, lack_of_fit=lof)


def _goodness(fit: ParametricFit, params, tokens, loss, n_free: int):
    """(residual_sd, lack_of_fit) of L - L_hat in nats; see the module docstring."""
    with np.errstate(all="ignore"):
        r = loss - fit.predict(params, tokens)
        if not np.all(np.isfinite(r)):
            return float("nan"), (float("nan"), float("nan"))
        dof = r.size - n_free
        s = float(np.sqrt(r @ r / dof))
        half = float(stdtrit(dof, 0.5 + LACK_OF_FIT_LEVEL / 2)) * s
    return float(np.std(r, ddof=1)), (-half, half)


# L-BFGS-B's ftol is relative to max(|f|, 1), and this objective is ~1e-3 (a sum of Huber
# terms of log residuals), so the default ftol (2.2e-9) is in effect a relative 2e-6: from a
# warm start it stops after a few steps in the flat valley of the Chinchilla optimum,
# which made bootstrap intervals too narrow (alpha 0.331-0.366 against 0.317-0.373 from
# refits run to convergence). These tolerances run to convergence.
_TIGHT = {"ftol": 1e-15, "gtol": 1e-12}


def _solve(objective: _Objective, start: np.ndarray, tight: bool, bounds=None):
    """(objective value, converged, x) from one start, None if it left the finite range."""
    res = minimize(objective, start, jac=True, method="L-BFGS-B", bounds=bounds,
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


# --- variable projection ------------------------------------------------------------------


def _profile(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray, e_bounds: EBounds,
             grid: np.ndarray = EXPONENT_GRID):
    """For every (alpha, beta) = (grid[i], grid[j]): the (E, A, B) minimising
    sum_k w_k (L_k - E - A N_k^-alpha - B D_k^-beta)^2, w = 1/L^2, subject to A, B >= 0 and
    E within e_bounds (E >= 0 where unbounded below), and that minimum.

    Exact: the optimum of this convex problem is the unconstrained least squares on its free
    set (E free or at a bound; A, B free or 0), so the feasible candidate of least residual
    among all those sets is it. Each set's solution is closed-form, vectorised over the grid.
    Returns (sse, E, A, B), each len(grid) x len(grid).
    """
    x, y = np.log(params), np.log(tokens)
    w = 1.0 / loss ** 2
    p = np.exp(-np.outer(grid, x))  # N^-alpha, one row per alpha
    q = np.exp(-np.outer(grid, y))
    m = grid.size
    e_low = 0.0 if e_bounds[0] is None else e_bounds[0]
    e_high = np.inf if e_bounds[1] is None else e_bounds[1]
    best = np.full((m, m), np.inf)
    out = [np.zeros((m, m)) for _ in range(3)]  # E, A, B
    tiny = 1e-10  # relative: a column (pair) closer than this to degenerate is skipped

    def offer(sse, e, a, b, ok):
        sse, e, a, b, ok = (np.broadcast_to(v, best.shape) for v in (sse, e, a, b, ok))
        take = ok & (a >= 0) & (b >= 0) & (e >= e_low) & (e <= e_high) & (sse < best)
        best[take] = sse[take]
        for arr, v in zip(out, (e, a, b)):
            arr[take] = v[take]

    def solve(pp, qq, pq, rp, rq, zz, mean_p=None, mean_q=None, mean_z=None, e0=None):
        """The four (A, B) free sets for the normal equations (pp, qq, pq; rp, rq; zz), with
        E = mean_z - A mean_p - B mean_q (E free, centred sums) or E = e0."""
        def e_of(a, b):
            if e0 is not None:
                return e0
            return mean_z - a * mean_p[:, None] - b * mean_q[None, :]

        with np.errstate(all="ignore"):
            cross = pp[:, None] * qq[None, :]
            det = cross - pq ** 2
            a = (rp[:, None] * qq[None, :] - rq[None, :] * pq) / det
            b = (rq[None, :] * pp[:, None] - rp[:, None] * pq) / det
            offer(zz - a * rp[:, None] - b * rq[None, :], e_of(a, b), a, b,
                  np.isfinite(a) & np.isfinite(b) & (det > tiny * cross))
            a1 = (rp / pp)[:, None]
            offer(zz - (rp ** 2 / pp)[:, None], e_of(a1, 0.0), a1, 0.0,
                  (pp > tiny * p2)[:, None])
            b1 = (rq / qq)[None, :]
            offer(zz - (rq ** 2 / qq)[None, :], e_of(0.0, b1), 0.0, b1,
                  (qq > tiny * q2)[None, :])
            offer(zz, e_of(0.0, 0.0), 0.0, 0.0, True)

    pw = p * w
    p2, q2 = (p * pw).sum(axis=1), (q * q * w).sum(axis=1)  # uncentred sums of squares
    fixed = e_bounds[0] is not None and e_bounds[0] == e_bounds[1]
    if not fixed:  # E free: centre on the weighted means and solve for A, B
        total = w.sum()
        mean_p, mean_q, mean_l = p @ w / total, q @ w / total, loss @ w / total
        pc, qc, lc = p - mean_p[:, None], q - mean_q[:, None], loss - mean_l
        pcw = pc * w
        solve((pcw * pc).sum(axis=1), (qc * qc * w).sum(axis=1), pcw @ qc.T,
              pcw @ lc, qc @ (w * lc), float(w @ lc ** 2), mean_p, mean_q, mean_l)
    # E at a bound (or at 0, where unbounded below): fit L - E0 for A, B
    pq = pw @ q.T
    for e0 in sorted({e_low, *(() if e_bounds[1] is None else (e_bounds[1],))}):
        z = loss - e0
        solve(p2, q2, pq, pw @ z, q @ (w * z), float(w @ z ** 2), e0=e0)
    return (best, *out)


def varpro_starts(params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                  e_bounds: tuple | None = None, n_seeds: int = N_VARPRO_SEEDS) -> np.ndarray:
    """Starts (a, b, e, alpha, beta), one per row, from the variable-projection grid: the
    best `n_seeds` local minima over EXPONENT_GRID^2 of the least-squares profile (`_profile`),
    at least VARPRO_SEPARATION apart in alpha or beta; see the module docstring."""
    params, tokens, loss = _checked(params, tokens, loss)
    bounds = check_e_bounds(e_bounds)
    sse, E, A, B = _profile(params, tokens, loss, bounds)
    grid, m = EXPONENT_GRID, EXPONENT_GRID.size
    padded = np.pad(sse, 1, constant_values=np.inf)
    local = np.isfinite(sse)
    for di, dj in itertools.product((-1, 0, 1), repeat=2):
        if di or dj:
            local &= sse <= padded[1 + di:1 + di + m, 1 + dj:1 + dj + m]
    cells = np.flatnonzero(local)
    cells = cells[np.argsort(sse.ravel()[cells], kind="stable")]
    # An exponent whose coefficient is 0 is immaterial: such a minimum repeats along that
    # axis, and matches any other minimum there.
    kept: list[tuple[float | None, float | None]] = []
    rows = []
    floor = FLOOR * float(loss.min())
    gx, gy = float(np.mean(np.log(params))), float(np.mean(np.log(tokens)))
    for cell in cells:
        i, j = divmod(int(cell), m)
        key = (grid[i] if A[i, j] > 0 else None, grid[j] if B[i, j] > 0 else None)
        if any(all(u is None or v is None or abs(u - v) < VARPRO_SEPARATION
                   for u, v in zip(key, k)) for k in kept):
            continue
        kept.append(key)
        al, be = grid[i], grid[j]
        rows.append((np.log(max(A[i, j], floor * np.exp(al * gx))),
                     np.log(max(B[i, j], floor * np.exp(be * gy))),
                     np.log(max(E[i, j], floor)), al, be))
        if len(rows) == n_seeds:
            break
    return np.array(rows, dtype=float).reshape(-1, 5)


def refit_starts(full: ParametricFit, params: np.ndarray, tokens: np.ndarray,
                 loss: np.ndarray, e_bounds: tuple | None = None) -> np.ndarray:
    """A bootstrap refit's starts: the variable-projection starts of these runs, the full-data
    optimum (`full.warm_starts[0]`), and any other of `full.warm_starts` whose alpha or beta
    lies outside EXPONENT_GRID (a basin the grid does not cover)."""
    starts = [varpro_starts(params, tokens, loss, e_bounds)]
    warm = np.array(full.warm_starts, dtype=float).reshape(-1, 5)
    if len(warm):
        low, high = EXPONENT_GRID[0], EXPONENT_GRID[-1]
        outside = np.any((warm[1:, 3:] < low) | (warm[1:, 3:] > high), axis=1)
        starts += [warm[:1], warm[1:][outside]]
    return np.concatenate(starts)


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
                         clusters: np.ndarray | None = None,
                         e_bounds: tuple | None = None) -> Bootstrap:
    """Refits on `n_resamples` resamples of the runs' clusters (`clusters`: one label per
    row, None: every run alone; see bootstrap.py), each searched from the variable-projection
    grid of that resample plus the full-data optimum (`refit_starts`), run to convergence.

    `e_bounds`: the bounds on E of every refit; None takes the full fit's (`full.e_bounds`),
    so refits are bounded as the fit they resample.
    """
    params, tokens, loss = (np.asarray(v, dtype=float) for v in (params, tokens, loss))
    bounds = full.e_bounds if e_bounds is None else check_e_bounds(e_bounds)

    def refit(idx: np.ndarray) -> dict[str, float] | None:
        n, d, l_ = params[idx], tokens[idx], loss[idx]
        try:
            return fit_parametric(n, d, l_, starts=refit_starts(full, n, d, l_, bounds),
                                  delta=delta, tight=True, e_bounds=bounds).figures()
        except FitError:
            return None

    with single_threaded_blas():
        return run_bootstrap(refit, FIGURES, design(params.size, clusters), n_resamples, rng,
                             level=level)
