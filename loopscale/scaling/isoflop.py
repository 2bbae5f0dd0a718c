"""Chinchilla approach 2 (IsoFLOP): the loss-optimal size per compute budget, then power laws.

Budgets. The table's `budget` column when it has one. Otherwise runs are grouped by compute:
sorted by log10 C, a run joins the current group while its log10 C is within `tolerance`
(default 0.02 dex, about 4.7%) of the group's first run, else it starts a new group; the
budget is the geometric mean of its group's C. Planned IsoFLOP runs land within a percent of
their budget (rounding of steps and widths) and budgets are spaced far wider than 0.02 dex.

Per budget, loss against x = ln N (N = the fitted parameter count):
- parabola (default): least-squares quadratic over the runs, minimum at its vertex;
- spline: a smoothing spline (scipy make_smoothing_spline, penalty by GCV) through the mean
  loss per size, minimised on a 2,001-point grid over the sampled sizes; it needs 5 sizes, and
  a budget with fewer falls back to the parabola (its `method` says which was used).
  Checked against Porian et al. 2024's per-budget optima (shared/data, 15 sweeps, 9-12 sizes
  over 1.5-2 decades): spline minima within 0.09 dex of theirs everywhere, while a parabola
  over so wide a grid is pulled by the curve's asymmetry (up to 0.3 dex off). Use the spline
  for wide grids; the parabola is the Chinchilla protocol for grids around the optimum.
A minimum is *on the edge* when the lowest (mean) loss observed is at the smallest or largest
size of the budget, or the fitted minimum lies outside the sampled sizes: the grid does not
bracket the optimum, so the minimum is an extrapolation. Edge minima, budgets whose loss is
not convex in ln N, and budgets with fewer than 3 sizes are kept in `minima` with used=False
and a reason, and left out of the power laws (fit.py adds a warning naming the budget).
D_opt: C is proportional to N*D within a budget, so ln D_opt = mean(ln N + ln D) - ln N_opt.

Power laws through the used minima, C = the budget (`FrontierLaws`):
  N_opt = a_coef C^a,  D_opt = b_coef C^b       log-log least squares (curve_fit)
  L_opt = A C^-alpha                             pure power law (log-log)
  L_opt = E + A_E C^-alpha_E                     saturating; least_squares with 0 <= E <
                                                 min L_opt, fitted to ln L; needs 3 budgets
  L_opt = A_N N_opt^-alpha_N                     the sparse-layers study's form (log-log)
  L_opt = A_U U_opt^-alpha_U                     U = unique parameters at the optimum
  U_opt = u_coef C^u                             (interpolated in ln U vs ln N within the
                                                 budget), when the table has params_unique
Weighting (optional): each budget weighs 1/sd^2 in every law, sd being the standard deviation
of the log of that law's y (ln N_opt, ln D_opt or ln L_opt) over a bootstrap of the budget's
own runs. The bootstrap of the whole fit reuses these weights rather than re-deriving them.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.interpolate import make_smoothing_spline
from scipy.optimize import OptimizeWarning, curve_fit, least_squares

from loopscale.scaling import FitError
from loopscale.scaling.bootstrap import Bootstrap, run_bootstrap

BUDGET_TOLERANCE_DEX = 0.02
SPLINE_MIN_SIZES = 5
SPLINE_GRID = 2001
WEIGHT_RESAMPLES = 200
MIN_FIGURES = ("params_opt", "tokens_opt", "loss_opt")


@dataclasses.dataclass(frozen=True)
class BudgetMinimum:
    budget: float
    n_runs: int
    n_sizes: int
    method: str  # "parabola" or "spline"
    params_opt: float  # NaN when the budget has no minimum
    tokens_opt: float
    loss_opt: float
    params_unique_opt: float  # NaN without a params_unique column
    on_edge: bool
    used: bool  # enters the power laws
    reason: str | None  # why not used
    # Standard deviations of ln N_opt, ln D_opt, ln L_opt over resamples of this budget's runs
    # (NaN unless the fit is weighted).
    sd_log_params: float = math.nan
    sd_log_tokens: float = math.nan
    sd_log_loss: float = math.nan


@dataclasses.dataclass(frozen=True)
class FrontierLaws:
    """The power laws through the used minima (NaN where not identifiable)."""

    a: float
    a_coef: float
    b: float
    b_coef: float
    alpha: float
    A: float
    E: float
    alpha_E: float
    A_E: float
    alpha_N: float
    A_N: float
    alpha_U: float
    A_U: float
    u: float
    u_coef: float

    def figures(self) -> dict[str, float]:
        return dataclasses.asdict(self)


FIGURES = tuple(f.name for f in dataclasses.fields(FrontierLaws))


@dataclasses.dataclass(frozen=True)
class IsoFlopFit:
    minima: tuple[BudgetMinimum, ...]
    laws: FrontierLaws | None  # None when under two budgets are usable (see `reason`)
    method: str
    weighted: bool
    reason: str | None = None

    @property
    def n_used(self) -> int:
        return sum(m.used for m in self.minima)


def assign_budgets(flops: np.ndarray, tolerance: float = BUDGET_TOLERANCE_DEX) -> np.ndarray:
    """The budget of each run (see the module docstring), in the runs' order."""
    logc = np.log10(np.asarray(flops, dtype=float))
    order = np.argsort(logc, kind="stable")
    group = np.empty(logc.size, dtype=int)
    anchor, current = -np.inf, -1
    for i in order:
        if logc[i] - anchor > tolerance:
            anchor, current = logc[i], current + 1
        group[i] = current
    budgets = np.empty(logc.size)
    for g in range(current + 1):
        members = group == g
        budgets[members] = 10.0 ** logc[members].mean()
    return budgets


def find_minimum(budget: float, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                 unique: np.ndarray | None = None, spline: bool = False,
                 bracket: tuple[float, float] | None = None) -> BudgetMinimum:
    """The loss-optimal size of one budget's runs, with its edge and usability flags.

    `bracket` (bootstrap refits): the ln N range of the full budget. A resample need not
    contain the grid's end sizes, so there the minimum is on the edge only when it falls
    outside the full grid; judged on the resample's own ends, about a third of resamples of a
    7-size budget would lose an end size and wrongly flag a well-bracketed minimum.
    """
    x, loss = np.log(params), np.asarray(loss, dtype=float)
    sizes, inverse = np.unique(x, return_inverse=True)
    mean_loss = np.bincount(inverse, weights=loss) / np.bincount(inverse)
    common = {"budget": float(budget), "n_runs": int(x.size), "n_sizes": int(sizes.size)}
    if sizes.size < 3:
        return _no_minimum(common, x, loss, f"{sizes.size} model sizes (a minimum needs 3)")
    method = "spline" if spline and sizes.size >= SPLINE_MIN_SIZES else "parabola"
    if method == "spline":
        grid = np.linspace(sizes[0], sizes[-1], SPLINE_GRID)
        curve = make_smoothing_spline(sizes, mean_loss)(grid)
        k = int(np.argmin(curve))
        x_opt, loss_opt = grid[k], float(curve[k])
        # The spline cannot extrapolate: a minimum at its own end is unbracketed, in a
        # bootstrap resample too.
        clipped = k in (0, grid.size - 1)
    else:
        c2, c1, c0 = np.polyfit(x, loss, 2)
        if not c2 > 0:
            return _no_minimum(common, x, loss, "loss is not convex in ln(params)")
        x_opt = -c1 / (2.0 * c2)
        loss_opt = float(c0 - c1 * c1 / (4.0 * c2))
        clipped = False
    low, high = (sizes[0], sizes[-1]) if bracket is None else bracket
    lowest = int(np.argmin(mean_loss))
    if not loss_opt > 0:
        # A flat, poorly fitted parabola can dip below zero between the sizes: no minimum.
        return _no_minimum(common, x, loss, "fitted minimum loss is not positive")
    if clipped or not low < x_opt < high:
        side = "smallest" if x_opt <= 0.5 * (sizes[0] + sizes[-1]) else "largest"
        edge = f"fitted minimum at or beyond the {side} size"
    elif bracket is None and lowest in (0, sizes.size - 1):
        edge = f"lowest loss at the {'smallest' if lowest == 0 else 'largest'} size"
    else:
        edge = None
    log_nd = np.mean(x + np.log(tokens))
    unique_opt = math.nan
    if unique is not None:
        log_u = np.bincount(inverse, weights=np.log(unique)) / np.bincount(inverse)
        unique_opt = float(np.exp(np.interp(x_opt, sizes, log_u)))
    return BudgetMinimum(
        **common, method=method, params_opt=float(np.exp(x_opt)),
        tokens_opt=float(np.exp(log_nd - x_opt)), loss_opt=loss_opt,
        params_unique_opt=unique_opt, on_edge=edge is not None, used=edge is None,
        reason=None if edge is None else f"minimum on the edge of the size grid ({edge})")


def _no_minimum(common: dict, x: np.ndarray, loss: np.ndarray, reason: str) -> BudgetMinimum:
    # Report the best run observed, so the table still says where this budget stood.
    best = int(np.argmin(loss))
    return BudgetMinimum(**common, method="parabola", params_opt=float(np.exp(x[best])),
                         tokens_opt=math.nan, loss_opt=float(loss[best]),
                         params_unique_opt=math.nan, on_edge=False, used=False, reason=reason)


def find_minima(budgets: np.ndarray, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                unique: np.ndarray | None = None, spline: bool = False
                ) -> tuple[BudgetMinimum, ...]:
    """One BudgetMinimum per budget, in increasing budget."""
    out = []
    for budget in np.unique(budgets):
        m = budgets == budget
        out.append(find_minimum(budget, params[m], tokens[m], loss[m],
                                None if unique is None else unique[m], spline))
    return tuple(out)


def fit_laws(minima: Sequence[BudgetMinimum], weighted: bool = False,
             warm: FrontierLaws | None = None) -> FrontierLaws:
    """The power laws through the used minima (FitError with fewer than two).

    `warm`: the full fit's laws, the start of a bootstrap refit's saturating law."""
    used = [m for m in minima if m.used]
    if len(used) < 2:
        raise FitError(f"{len(used)} usable budget minima (the power laws need 2)")
    try:
        return _fit_laws(used, weighted, warm)
    except (RuntimeError, ValueError, np.linalg.LinAlgError) as e:
        # scipy's "optimal parameters not found" and the like: the data cannot carry the law.
        raise FitError(f"power-law fit failed: {str(e).splitlines()[0]}") from e


def _fit_laws(used: Sequence[BudgetMinimum], weighted: bool,
              warm: FrontierLaws | None) -> FrontierLaws:
    c = np.array([m.budget for m in used])
    n = np.array([m.params_opt for m in used])
    d = np.array([m.tokens_opt for m in used])
    loss = np.array([m.loss_opt for m in used])
    u = np.array([m.params_unique_opt for m in used])
    sd_n, sd_d, sd_l = (_weights([getattr(m, f) for m in used]) if weighted else None
                        for f in ("sd_log_params", "sd_log_tokens", "sd_log_loss"))
    a_coef, a = _power_law(c, n, sd_n)
    b_coef, b = _power_law(c, d, sd_d)
    A, neg_alpha = _power_law(c, loss, sd_l)
    A_N, neg_alpha_N = _power_law(n, loss, sd_l)
    A_U, neg_alpha_U, u_coef, u_exp = math.nan, math.nan, math.nan, math.nan
    if np.all(np.isfinite(u)):
        A_U, neg_alpha_U = _power_law(u, loss, sd_l)
        u_coef, u_exp = _power_law(c, u, sd_n)  # U is a fixed multiple-ish of N: N's spread
    E, A_E, alpha_E = _saturating(c, loss, sd_l, warm)
    return FrontierLaws(a=a, a_coef=a_coef, b=b, b_coef=b_coef, alpha=-neg_alpha, A=A, E=E,
                        alpha_E=alpha_E, A_E=A_E, alpha_N=-neg_alpha_N, A_N=A_N,
                        alpha_U=-neg_alpha_U, A_U=A_U, u=u_exp, u_coef=u_coef)


def _weights(sds: Sequence[float]) -> np.ndarray | None:
    sds = np.array(sds, dtype=float)
    good = np.isfinite(sds) & (sds > 0)
    if not good.any():
        return None
    # A budget whose spread could not be measured gets the largest measured one (the most
    # cautious weight) instead of an infinite or undefined one.
    return np.where(good, sds, sds[good].max())


def _power_law(x: np.ndarray, y: np.ndarray, sigma: np.ndarray | None) -> tuple[float, float]:
    """(coef, exponent) of y = coef * x^exponent, least squares in log-log."""
    lx, ly = np.log(x), np.log(y)
    x0 = lx.mean()  # centred, so the intercept is not a far extrapolation to x = 1
    with warnings.catch_warnings():
        # Two budgets fit exactly and have no covariance estimate; that is not an error here.
        warnings.simplefilter("ignore", OptimizeWarning)
        (c, k), _ = curve_fit(_line, lx - x0, ly, p0=(ly.mean(), 0.0), sigma=sigma)
    return float(np.exp(c - k * x0)), float(k)


def _line(u: np.ndarray, c: float, k: float) -> np.ndarray:
    return c + k * u


def _saturating(c: np.ndarray, loss: np.ndarray, sigma: np.ndarray | None,
                warm: FrontierLaws | None = None) -> tuple[float, float, float]:
    """(E, A_E, alpha_E) of L = E + A_E C^-alpha_E fitted to ln L, or NaNs under 3 budgets.

    Starts: the log-log line of L - E for E in {0, 0.5, 0.9} x min L, since E is often weakly
    identified by a handful of budgets and least squares is local; a bootstrap refit starts
    from the full fit's solution (`warm`) instead, which is ~3x cheaper.
    """
    if c.size < 3:
        return math.nan, math.nan, math.nan
    z0 = np.log(c).mean()
    z = np.log(c) - z0  # centred for conditioning; A_E is moved back to C = 1 at the end
    target = np.log(loss)
    scale = np.ones_like(z) if sigma is None else 1.0 / sigma
    e_max = loss.min() * (1.0 - 1e-9)

    def residual(p: np.ndarray) -> np.ndarray:
        log_a, alpha, e = p
        return (np.log(e + np.exp(log_a - alpha * z)) - target) * scale

    def jacobian(p: np.ndarray) -> np.ndarray:
        log_a, alpha, e = p
        q = np.exp(log_a - alpha * z)
        total = e + q
        return np.stack([q / total, -z * q / total, 1.0 / total], axis=1) * scale[:, None]

    if warm is not None and np.isfinite(warm.E):
        starts = [np.array([math.log(warm.A_E) - warm.alpha_E * z0, warm.alpha_E,
                            min(warm.E, 0.999 * e_max)])]
    else:
        starts = []
        for frac in (0.0, 0.5, 0.9):
            e0 = frac * loss.min()
            slope, log_a0 = np.polyfit(z, np.log(loss - e0), 1)
            starts.append(np.array([log_a0, max(-slope, 1e-6), e0]))
    best = None
    for p0 in starts:
        try:
            res = least_squares(residual, p0, jac=jacobian,
                                bounds=([-np.inf, 0.0, 0.0], [np.inf, np.inf, e_max]))
        except ValueError:  # a start outside the finite range; the others may do
            continue
        if best is None or res.cost < best.cost:
            best = res
    if best is None:
        return math.nan, math.nan, math.nan
    log_a, alpha, e = best.x
    return float(e), float(np.exp(log_a + alpha * z0)), float(alpha)


def budget_spread(budget: float, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                  rng: np.random.Generator, spline: bool = False,
                  n_resamples: int = WEIGHT_RESAMPLES) -> tuple[float, float, float]:
    """sd of (ln N_opt, ln D_opt, ln L_opt) over resamples of one budget's runs."""
    rows = []
    for _ in range(n_resamples):
        idx = rng.integers(0, params.size, size=params.size)
        m = find_minimum(budget, params[idx], tokens[idx], loss[idx], spline=spline)
        if m.used:
            rows.append((math.log(m.params_opt), math.log(m.tokens_opt), math.log(m.loss_opt)))
    if len(rows) < 2:
        return math.nan, math.nan, math.nan
    sd = np.std(np.array(rows), axis=0, ddof=1)
    return float(sd[0]), float(sd[1]), float(sd[2])


def fit_isoflop(budgets: np.ndarray, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                unique: np.ndarray | None = None, spline: bool = False, weighted: bool = False,
                rng: np.random.Generator | None = None) -> IsoFlopFit:
    """Minima per budget and the power laws through them (laws None if under 2 usable)."""
    minima = find_minima(budgets, params, tokens, loss, unique, spline)
    if weighted:
        rng = np.random.default_rng(0) if rng is None else rng
        weighed = []
        for m in minima:
            if m.used:
                own = budgets == m.budget
                sd_n, sd_d, sd_l = budget_spread(m.budget, params[own], tokens[own], loss[own],
                                                 rng, spline)
                m = dataclasses.replace(m, sd_log_params=sd_n, sd_log_tokens=sd_d,
                                        sd_log_loss=sd_l)
            weighed.append(m)
        minima = tuple(weighed)
    method = "spline" if spline else "parabola"
    try:
        laws, reason = fit_laws(minima, weighted), None
    except FitError as e:
        laws, reason = None, str(e)
    return IsoFlopFit(minima=minima, laws=laws, method=method, weighted=weighted, reason=reason)


def minimum_figure(index: int, name: str) -> str:
    """The bootstrap sample name of one budget minimum's figure."""
    return f"minima.{index}.{name}"


def bootstrap_isoflop(full: IsoFlopFit, budgets: np.ndarray, params: np.ndarray,
                      tokens: np.ndarray, loss: np.ndarray, unique: np.ndarray | None,
                      n_resamples: int, rng: np.random.Generator, level: float = 0.95
                      ) -> Bootstrap:
    """Resamples runs within each budget and refits minima and laws.

    The budgets are those the full fit used; a budget whose resampled minimum is not usable
    (outside the budget's full size range, not convex, under 3 sizes) sits out that resample,
    and a resample with under two usable budgets counts as failed. Weights, if any, are the
    full fit's.
    """
    if full.laws is None:
        raise FitError(f"nothing to bootstrap: {full.reason}")
    spline = full.method == "spline"
    kept = [(i, m) for i, m in enumerate(full.minima) if m.used]
    rows = np.flatnonzero(np.isin(budgets, [m.budget for _, m in kept]))
    b, n, d, y = budgets[rows], params[rows], tokens[rows], loss[rows]
    u = None if unique is None else unique[rows]
    brackets = {m.budget: (np.log(n[b == m.budget]).min(), np.log(n[b == m.budget]).max())
                for _, m in kept}
    names = list(FIGURES) + [minimum_figure(i, f) for i, _ in kept for f in MIN_FIGURES]

    def refit(idx: np.ndarray) -> Mapping[str, float] | None:
        figures: dict[str, float] = {}
        minima = []
        for i, m_full in kept:
            sel = idx[b[idx] == m_full.budget]
            m = find_minimum(m_full.budget, n[sel], d[sel], y[sel],
                             None if u is None else u[sel], spline, brackets[m_full.budget])
            m = dataclasses.replace(m, sd_log_params=m_full.sd_log_params,
                                    sd_log_tokens=m_full.sd_log_tokens,
                                    sd_log_loss=m_full.sd_log_loss)
            minima.append(m)
            if m.used:
                figures.update({minimum_figure(i, f): getattr(m, f) for f in MIN_FIGURES})
        try:
            figures.update(fit_laws(minima, full.weighted, full.laws).figures())
        except FitError:
            return None
        return figures

    return run_bootstrap(refit, names, rows.size, n_resamples, rng, strata=b, level=level)
