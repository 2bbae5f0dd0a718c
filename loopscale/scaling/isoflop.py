"""Chinchilla approach 2 (IsoFLOP): the loss-optimal size per compute budget, then power laws
through those minima; the whole fit (`fit_isoflop`) and its bootstrap (`bootstrap_isoflop`).

The two halves are their own modules: budget_minima.py groups runs into budgets and finds each
budget's minimum (parabola or spline, edge flags, the per-budget spread that weights a fit);
frontier_laws.py fits N_opt, D_opt and L_opt against C through the usable minima. Their public
names are imported here too, as scaling/fit.py, plots.py and the tests read them from
`isoflop` (`iso.assign_budgets`, `iso.BudgetMinimum`, `iso.FIGURES`, ...).

Estimator bias (arXiv 2603.22339). Approach 2 reads each budget's optimum off a parabola in
ln N. L(ln N) is not symmetric about its minimum (it rises faster towards small N), so the
vertex of a least-squares parabola moves off the true minimum, the more so the wider the grid
and the more off-centre the grid sits around the optimum; since the grids' placement and the
curve's shape change with C, the bias changes with C and tilts the exponents. Three things
make that visible, none of which changes the headline (the parabola unless spline=True, the
Chinchilla protocol):
- every BudgetMinimum carries `centring` and `grid_dex` (where its minimum sits in its grid,
  how wide the grid is) and the other estimator's minimum (`alt`, `alt_params_opt`, ...);
- IsoFlopFit.alt_laws: the laws through the other estimator's minima, i.e. the laws the other
  choice of `spline` gives (a budget the spline cannot take, under 5 sizes, keeps its
  parabola minimum there as it would under spline=True); a weighted fit reuses the headline
  minima's weights for them, so the two differ only in the estimator;
- estimator_choice(fit) -> (method, reason): which estimator the headline uses and why, with
  a warning line (estimator_warning) when a used parabola minimum is off-centre (centring
  outside CENTRED_RANGE = [0.25, 0.75]) or its grid is wider than WIDE_GRID_DEX (1 decade),
  saying by how much the two estimators' `a` differ in this fit.
The bootstrap resamples the headline estimator only.

FLOP conventions (refit_under_convention). A table may give the same runs' compute under a
second convention (table.FLOPS_ATTN, flops_6n_attn: 6N plus the T x T attention matmuls, which
6N leaves out and which weigh most at small widths: T/6d of 6N, 33% at T=128, d=64). The
budgets (which runs are compared) and their minima stay those of the fit; each used budget's
compute becomes its runs' alternative compute at the optimum (ln C_alt interpolated against
ln N within the budget at ln N_opt, budget_minima.compute_at_optimum), and the laws are
refitted against it (frontier_laws.fit_laws's `compute`): a, b, alpha, the saturating law and
u change, alpha_N and alpha_U do not. When the alternative counts relatively more compute at
small N (as attention does), ln C_alt grows slower than ln C across budgets and a, b and
alpha come out larger under it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from loopscale.scaling import FitError
from loopscale.scaling.bootstrap import Bootstrap, design, run_bootstrap
from loopscale.scaling.budget_minima import (  # noqa: F401 (the three marked)
    BUDGET_TOLERANCE_DEX,  # not used here: fit.py reads it as iso.BUDGET_TOLERANCE_DEX
    SPLINE_MIN_SIZES,
    BudgetMinimum,
    assign_budgets,  # not used here: fit.py and plots.py read it as iso.assign_budgets
    budget_spread,
    compute_at_optimum,
    find_minima,
    find_minimum,  # not used here: the tests read it from isoflop
    resampled_minimum,
)
from loopscale.scaling.frontier_laws import FIGURES, FrontierLaws, fit_laws

MIN_FIGURES = ("params_opt", "tokens_opt", "loss_opt")
CENTRED_RANGE = (0.25, 0.75)  # centring outside it: an off-centre minimum (estimator_warning)
WIDE_GRID_DEX = 1.0  # a grid wider than this (log10 N_max/N_min) pulls a parabola


@dataclasses.dataclass(frozen=True)
class IsoFlopFit:
    minima: tuple[BudgetMinimum, ...]
    laws: FrontierLaws | None  # None when under two budgets are usable (see `reason`)
    method: str
    weighted: bool
    reason: str | None = None
    # The laws through the other estimator's minima (alt_minima); None with alt_reason.
    alt_laws: FrontierLaws | None = None
    alt_reason: str | None = None

    @property
    def n_used(self) -> int:
        return sum(m.used for m in self.minima)

    @property
    def alt_method(self) -> str:
        """The estimator of alt_laws: the one `method` is not."""
        return "parabola" if self.method == "spline" else "spline"

    @property
    def alt_minima(self) -> tuple[BudgetMinimum, ...]:
        """Per budget, the minimum the other choice of `spline` finds: the minimum's `alt`,
        or the minimum itself where the spline cannot be used (under 5 sizes, the parabola
        either way); with the headline minima's weights."""
        return tuple(_other_minimum(m, self.alt_method) for m in self.minima)

    @property
    def alt_n_used(self) -> int:
        return sum(m.used for m in self.alt_minima)


def _other_minimum(m: BudgetMinimum, alt_method: str) -> BudgetMinimum:
    if m.alt is None or m.alt_method != alt_method:
        return m
    return dataclasses.replace(m.alt, sd_log_params=m.sd_log_params,
                               sd_log_tokens=m.sd_log_tokens, sd_log_loss=m.sd_log_loss)


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
    fit = IsoFlopFit(minima=minima, laws=laws, method=method, weighted=weighted, reason=reason)
    try:
        alt_laws, alt_reason = fit_laws(fit.alt_minima, weighted), None
    except FitError as e:
        alt_laws, alt_reason = None, str(e)
    return dataclasses.replace(fit, alt_laws=alt_laws, alt_reason=alt_reason)


def estimator_warning(fit: IsoFlopFit) -> str | None:
    """One line when the used parabola minima are likely biased (off-centre: centring outside
    CENTRED_RANGE; or a grid wider than WIDE_GRID_DEX), with the two estimators' `a`; else
    None. See the module docstring."""
    parabola = [m for m in fit.minima if m.used and m.method == "parabola"]
    low, high = CENTRED_RANGE
    off = [m for m in parabola if not low <= m.centring <= high]
    wide = [m for m in parabola if m.grid_dex > WIDE_GRID_DEX]
    if not off and not wide:
        return None
    why = []
    if off:
        where = ", ".join(f"{m.budget:.3g} ({m.centring:.2f})" for m in off)
        why.append(f"{len(off)} of {len(parabola)} budgets off-centre (centring outside "
                   f"[{low:g}, {high:g}]: {where})")
    if wide:
        why.append(f"{len(wide)} of {len(parabola)} grids over {WIDE_GRID_DEX:g} decade wide "
                   f"(up to {max(m.grid_dex for m in wide):.2f} dex)")
    if fit.laws is not None and fit.alt_laws is not None:
        a, alt = fit.laws.a, fit.alt_laws.a
        other = sum(m.used and m.method == fit.alt_method for m in fit.alt_minima)
        note = "" if other == fit.alt_n_used else (
            f", {fit.alt_n_used - other} of its {fit.alt_n_used} budgets on the parabola, "
            f"under {SPLINE_MIN_SIZES} sizes")
        gap = (f"a = {a:.4f} ({fit.method}, {fit.n_used} budgets) vs {alt:.4f} "
               f"({fit.alt_method}{note}): they differ by {alt - a:+.4f}")
    elif fit.laws is not None:
        gap = f"no {fit.alt_method} laws to compare a with: {fit.alt_reason}"
    else:
        gap = f"no laws: {fit.reason}"
    return f"warning: parabola minima may be biased: {'; '.join(why)}; {gap}"


def estimator_choice(fit: IsoFlopFit) -> tuple[str, str]:
    """(method, reason): the headline's estimator and why, one line, plus estimator_warning's
    line (after a newline) when the parabola is likely biased. The choice is the user's; it is
    never switched here."""
    if fit.method == "spline":
        fallback = sum(m.used and m.method == "parabola" for m in fit.minima)
        reason = ("spline: chosen with spline=True (a smoothing spline through the mean loss "
                  "per size, not pulled by the curve's asymmetry on wide grids)")
        if fallback:
            reason += (f"; {fallback} used budgets under {SPLINE_MIN_SIZES} sizes take the "
                       "parabola")
    else:
        reason = ("parabola: the Chinchilla protocol (the default; spline=True chooses the "
                  "smoothing spline)")
    warning = estimator_warning(fit)
    return fit.method, reason if warning is None else f"{reason}\n{warning}"


def refit_under_convention(fit: IsoFlopFit, budgets: np.ndarray, params: np.ndarray,
                           flops_alt: np.ndarray | None
                           ) -> tuple[FrontierLaws | None, str | None]:
    """(laws, None), or (None, reason): the fit's laws refitted against each used budget's
    compute under another FLOP convention at its optimum (see the module docstring).

    `budgets`, `params`: the arrays the fit was made from; `flops_alt`: the same runs' compute
    under the other convention (e.g. the table's flops_6n_attn column), None when there is
    none. The minima and weights are the fit's; every run of a used budget needs a finite,
    positive flops_alt."""
    if fit.laws is None:
        return None, f"no IsoFLOP laws: {fit.reason}"
    if flops_alt is None:
        return None, "no compute under the other convention"
    flops_alt = np.asarray(flops_alt, dtype=float)
    compute, missing = [], []
    for m in fit.minima:
        if not m.used:
            compute.append(math.nan)
            continue
        own = budgets == m.budget
        c_alt = flops_alt[own]
        bad = int(np.sum(~(np.isfinite(c_alt) & (c_alt > 0))))
        if bad:
            missing.append(f"{bad} of {c_alt.size} runs of budget {m.budget:.3g}")
            compute.append(math.nan)
            continue
        compute.append(compute_at_optimum(m.params_opt, params[own], c_alt))
    if missing:
        return None, f"compute under the other convention missing or not positive for " \
                     f"{', '.join(missing)}"
    try:
        return fit_laws(fit.minima, fit.weighted, compute=compute), None
    except FitError as e:
        return None, str(e)


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
            m = resampled_minimum(m_full, idx, b, n, d, y, u, spline, brackets[m_full.budget])
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
