"""IsoFLOP across budgets: the power laws through the usable per-budget minima
(budget_minima.py), each a least-squares fit in log space.

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
own runs (budget_minima.budget_spread). The bootstrap of the whole fit (isoflop.py) reuses
these weights rather than re-deriving them.
C is each minimum's budget unless `compute` gives another value per minimum: the same budgets'
compute counted under another FLOP convention at the optimum (isoflop.refit_under_convention).
Only the laws against C change then (a, b, alpha, the saturating law, u); alpha_N and alpha_U
relate L to N and U and come out as they were.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit, least_squares

from loopscale.scaling import FitError
from loopscale.scaling.budget_minima import BudgetMinimum


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


def fit_laws(minima: Sequence[BudgetMinimum], weighted: bool = False,
             warm: FrontierLaws | None = None,
             compute: Sequence[float] | None = None) -> FrontierLaws:
    """The power laws through the used minima (FitError with fewer than two).

    `warm`: the full fit's laws, the start of a bootstrap refit's saturating law.
    `compute`: C of each minimum (one per entry of `minima`, used or not) in place of its
    budget, e.g. the budget's compute under another FLOP convention."""
    if compute is not None and len(compute) != len(minima):
        raise ValueError(f"{len(compute)} compute values for {len(minima)} minima")
    keep = [i for i, m in enumerate(minima) if m.used]
    used = [minima[i] for i in keep]
    if len(used) < 2:
        raise FitError(f"{len(used)} usable budget minima (the power laws need 2)")
    c = (np.array([m.budget for m in used]) if compute is None
         else np.array([compute[i] for i in keep], dtype=float))
    try:
        return _fit_laws(used, c, weighted, warm)
    except (RuntimeError, ValueError, np.linalg.LinAlgError) as e:
        # scipy's "optimal parameters not found" and the like: the data cannot carry the law.
        raise FitError(f"power-law fit failed: {str(e).splitlines()[0]}") from e


def _fit_laws(used: Sequence[BudgetMinimum], c: np.ndarray, weighted: bool,
              warm: FrontierLaws | None) -> FrontierLaws:
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
