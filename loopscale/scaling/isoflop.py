"""Chinchilla approach 2 (IsoFLOP): the loss-optimal size per compute budget, then power laws
through those minima; the whole fit (`fit_isoflop`) and its bootstrap (`bootstrap_isoflop`).

The two halves are their own modules: budget_minima.py groups runs into budgets and finds each
budget's minimum (parabola or spline, edge flags, the per-budget spread that weights a fit);
frontier_laws.py fits N_opt, D_opt and L_opt against C through the usable minima. Their public
names are imported here too, as scaling/fit.py, plots.py and the tests read them from
`isoflop` (`iso.assign_budgets`, `iso.BudgetMinimum`, `iso.FIGURES`, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from loopscale.scaling import FitError
from loopscale.scaling.bootstrap import Bootstrap, design, run_bootstrap
from loopscale.scaling.budget_minima import (  # noqa: F401 (the two marked)
    BUDGET_TOLERANCE_DEX,  # not used here: fit.py reads it as iso.BUDGET_TOLERANCE_DEX
    BudgetMinimum,
    assign_budgets,  # not used here: fit.py and plots.py read it as iso.assign_budgets
    budget_spread,
    find_minima,
    find_minimum,
)
from loopscale.scaling.frontier_laws import FIGURES, FrontierLaws, fit_laws

MIN_FIGURES = ("params_opt", "tokens_opt", "loss_opt")


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
                      n_resamples: int, rng: np.random.Generator, level: float = 0.95,
                      clusters: np.ndarray | None = None) -> Bootstrap:
    """Resamples clusters of runs (`clusters`: one label per row, None: every run alone; see
    bootstrap.py) within the budgets they span, and refits minima and laws.

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

    plan = design(rows.size, None if clusters is None else np.asarray(clusters)[rows], b)
    return run_bootstrap(refit, names, plan, n_resamples, rng, level=level)
