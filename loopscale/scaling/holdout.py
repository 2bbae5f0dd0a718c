"""Judge a fit by what it predicts: leave the largest (or a chosen) budget out, fit on the rest,
predict the held-out budget's compute-optimal loss and size, and compare with what its runs
measured (`loopscale fit --holdout=largest|BUDGET`).

Per family:
- train: every run at a smaller budget than the held-out one (leave-future-out: with the
  largest budget held out, every other budget; runs at larger budgets, e.g. ones whose grid
  did not bracket an optimum, never inform a prediction of a smaller one). The IsoFLOP fit
  (isoflop.fit_isoflop, same estimator and weighting as the main fit) gives L_opt(C) = A C^-alpha (pure law),
  E + A_E C^-alpha_E (saturating, 3+ training budgets) and N_opt(C) = a_coef C^a; the
  parametric fit (approach 3, same start grid) gives its frontier at C.
- observed: the held-out budget's own minimum (budget_minima.find_minimum, same estimator);
  None with the reason when its grid does not bracket a convex minimum.
- error = predicted - observed, in nats for the loss and in ln N_opt for the size.
Intervals: one cluster bootstrap over all the family's runs (bootstrap.py; trunks move with
all their branches, across the split), each resample refitting the training laws and the
held-out minimum together, so the error's interval carries both the fit's and the held-out
point's uncertainty. The parametric prediction gets its interval from the same resamples (so
the two predictions' intervals compare like with like): each refits approach 3 on the
resample's training rows, seeded as parametric.bootstrap_parametric seeds its refits (the
resample's variable-projection starts plus the point fit's optimum, tight, under the point
fit's bounds on E), not from the 4,500-start grid. The two refits fail independently: a
failed parametric refit is NaN in the parametric figures only, a failed IsoFLOP refit NaN in
the IsoFLOP ones only (a resample counts as failed outright when nothing could be refitted).
The resampled runs are the point fits' (every smaller budget, those without a usable minimum
too, plus the held-out one), drawn within each budget that has a minimum and, pooled, among
the others. A family without a training law but with a parametric prediction is still
bootstrapped, for the parametric interval. More than 10% of refits failing for a figure
makes it not identified, as everywhere.

Marin's leave-future-out check (their 1e21 prediction: 2.606 against 2.599 observed) is the
model for this: a law that cannot predict a budget it has not seen should not be trusted to
extrapolate further.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from loopscale.errors import UsageError
from loopscale.scaling import FitError
from loopscale.scaling import isoflop as iso
from loopscale.scaling import parametric as par
from loopscale.scaling.bootstrap import Bootstrap, design, run_bootstrap
from loopscale.scaling.budget_minima import (
    BUDGET_TOLERANCE_DEX,
    BudgetMinimum,
    find_minimum,
    resampled_minimum,
)
from loopscale.scaling.frontier_laws import FrontierLaws, fit_laws
from loopscale.scaling.runs import FamilyRuns

LARGEST = "largest"
# Figures of a held-out check, each with a bootstrap interval where the bootstrap can give one.
FIGURES = ("predicted_loss", "predicted_loss_saturating", "observed_loss", "error",
           "error_saturating", "predicted_n_opt", "observed_n_opt", "error_log_n_opt",
           "predicted_loss_parametric", "error_parametric")
# The training law's figures kept per resample, for the prediction band of the figure.
BAND_FIGURES = ("A", "alpha")


@dataclasses.dataclass(frozen=True)
class Holdout:
    family: str
    budget: float  # the held-out budget
    train: iso.IsoFlopFit  # the IsoFLOP fit on every other budget
    observed: BudgetMinimum  # the held-out budget's own minimum
    parametric: par.ParametricFit | None  # approach 3 on the training runs
    boot: Bootstrap | None
    reason: str | None  # why there is no prediction (no training law), or None

    @property
    def train_budgets(self) -> tuple[float, ...]:
        return tuple(m.budget for m in self.train.minima if m.used)

    def figures(self) -> dict[str, float]:
        laws = self.train.laws
        figures = dict.fromkeys(FIGURES, math.nan)
        if self.observed.used:
            figures.update(observed_loss=self.observed.loss_opt,
                           observed_n_opt=self.observed.params_opt)
        if laws is not None:
            figures.update(predictions(laws, self.budget, self.observed))
        figures.update(parametric_predictions(self.parametric, self.budget, self.observed))
        return figures


def predicts(pfit: par.ParametricFit | None) -> bool:
    """Whether approach 3 gives a prediction: a fit with a compute-optimal allocation."""
    return pfit is not None and pfit.has_allocation


def parametric_predictions(pfit: par.ParametricFit | None, budget: float,
                           observed: BudgetMinimum) -> dict[str, float]:
    """Approach 3's frontier at `budget` and its error against `observed` (NaN where there is
    no fit, no allocation or no usable held-out minimum)."""
    loss = math.nan
    if predicts(pfit):
        with np.errstate(all="ignore"):  # a degenerate refit's frontier: inf/NaN, a failure
            loss = float(pfit.frontier(np.array(budget)))
    seen = observed.loss_opt if observed.used else math.nan
    return {"predicted_loss_parametric": loss, "error_parametric": loss - seen}


def predictions(laws: FrontierLaws, budget: float, observed: BudgetMinimum) -> dict[str, float]:
    """The training laws' predictions at `budget` and their errors against `observed` (NaN
    where the held-out budget has no usable minimum or a law is not identified)."""
    seen = observed.used
    loss = observed.loss_opt if seen else math.nan
    n_opt = observed.params_opt if seen else math.nan
    pure = laws.A * budget ** -laws.alpha
    saturating = laws.E + laws.A_E * budget ** -laws.alpha_E
    n_pred = laws.a_coef * budget ** laws.a
    with np.errstate(all="ignore"):
        log_error = float(np.log(n_pred) - np.log(n_opt))
    return {"predicted_loss": pure, "predicted_loss_saturating": saturating,
            "observed_loss": loss, "error": pure - loss, "error_saturating": saturating - loss,
            "predicted_n_opt": n_pred, "observed_n_opt": n_opt, "error_log_n_opt": log_error,
            "A": laws.A, "alpha": laws.alpha}


def resolve_budget(spec: str, budgets: np.ndarray,
                   minima: Sequence[BudgetMinimum] = ()) -> float:
    """The budget `--holdout` names: `largest` (the largest budget whose own minimum, in the
    full fit of some family, is usable: a budget whose grid does not bracket its optimum has
    nothing to compare a prediction with), or a number matched to a budget of the table within
    BUDGET_TOLERANCE_DEX (UsageError naming the budgets otherwise)."""
    available = np.unique(budgets)
    if spec == LARGEST:
        usable = [m.budget for m in minima if m.used]
        if not usable:
            raise UsageError("--holdout largest: no budget has a usable minimum to predict")
        return float(max(usable))
    try:
        wanted = float(spec)
    except ValueError:
        raise UsageError(f"--holdout takes 'largest' or a budget in FLOPs, got {spec!r}") from None
    if wanted > 0:
        distance = np.abs(np.log10(available) - math.log10(wanted))
        if distance.min() <= BUDGET_TOLERANCE_DEX:
            return float(available[np.argmin(distance)])  # the nearest: budgets may sit closer
    listed = ", ".join(f"{b:.3g}" for b in available[:12])
    raise UsageError(f"--holdout {spec}: no such budget in the table (budgets: {listed}"
                     f"{', ...' if available.size > 12 else ''})")


def fit_holdout(runs: FamilyRuns, budget: float, spline: bool, weighted: bool, grid: str,
                huber_delta: float, e_bounds: tuple | None, n_resamples: int,
                rng_weights: np.random.Generator,
                rng_boot: np.random.Generator, level: float) -> Holdout:
    """The held-out check of one family at `budget` (see the module docstring)."""
    held = np.isclose(runs.budgets, budget, rtol=1e-9)
    train_runs, held_runs = runs.where(~held & (runs.budgets < budget)), runs.where(held)
    observed = find_minimum(budget, held_runs.params, held_runs.tokens, held_runs.loss,
                            held_runs.unique, spline)
    train = iso.fit_isoflop(train_runs.budgets, train_runs.params, train_runs.tokens,
                            train_runs.loss, train_runs.unique, spline, weighted, rng_weights)
    pfit = None
    try:
        pfit = par.fit_parametric(train_runs.params, train_runs.tokens, train_runs.loss,
                                  par.grid_starts(grid), huber_delta, e_bounds=e_bounds)
    except FitError:
        pass
    reason = None if train.laws is not None else f"no law on the other budgets: {train.reason}"
    boot = None
    # Without a training law the bootstrap still gives the parametric prediction's interval.
    if n_resamples > 0 and (train.laws is not None or predicts(pfit)):
        boot = _bootstrap(runs, held, train, observed, pfit, huber_delta, n_resamples,
                          rng_boot, level)
    return Holdout(runs.name, budget, train, observed, pfit, boot, reason)


def _bootstrap(runs: FamilyRuns, held: np.ndarray, train: iso.IsoFlopFit,
               observed: BudgetMinimum, pfit: par.ParametricFit | None, huber_delta: float,
               n_resamples: int, rng: np.random.Generator, level: float) -> Bootstrap:
    """Training minima, laws, approach 3 and the held-out minimum refitted on each cluster
    resample (see the module docstring)."""
    spline = train.method == "spline"
    kept = [m for m in train.minima if m.used]
    # Every run the point fits saw: the parametric fit trains on all the smaller budgets, also
    # those without a usable minimum (which the IsoFLOP refits then ignore).
    rows = np.flatnonzero(held | (runs.budgets < observed.budget))
    sub = runs.where(rows)
    x = np.log(sub.params)
    brackets = {b: (x[sub.budgets == b].min(), x[sub.budgets == b].max())
                for b in np.unique(sub.budgets)}
    training = sub.budgets < observed.budget

    def minimum(idx: np.ndarray, like: BudgetMinimum) -> BudgetMinimum:
        return resampled_minimum(like, idx, sub.budgets, sub.params, sub.tokens, sub.loss,
                                 sub.unique, spline, brackets[like.budget])

    def isoflop(idx: np.ndarray, seen: BudgetMinimum) -> dict[str, float] | None:
        if train.laws is None:
            return None
        try:
            laws = fit_laws([minimum(idx, m) for m in kept], train.weighted, train.laws)
        except FitError:
            return None
        return predictions(laws, observed.budget, seen)

    def parametric(idx: np.ndarray, seen: BudgetMinimum) -> dict[str, float] | None:
        if not predicts(pfit):
            return None
        idx = idx[training[idx]]
        n, d, loss = sub.params[idx], sub.tokens[idx], sub.loss[idx]
        try:
            refitted = par.fit_parametric(
                n, d, loss, starts=par.refit_starts(pfit, n, d, loss, pfit.e_bounds),
                delta=huber_delta, tight=True, e_bounds=pfit.e_bounds)
        except FitError:
            return None
        return parametric_predictions(refitted, observed.budget, seen)

    def refit(idx: np.ndarray) -> Mapping[str, float] | None:
        seen = minimum(idx, observed)
        iso_figures, par_figures = isoflop(idx, seen), parametric(idx, seen)
        if iso_figures is None and par_figures is None:
            return None
        # A figure missing here is NaN in this resample (run_bootstrap): a failure of that
        # figure alone. The held-out minimum needs neither law.
        observed_figures = {"observed_loss": seen.loss_opt if seen.used else math.nan,
                            "observed_n_opt": seen.params_opt if seen.used else math.nan}
        return {**observed_figures, **(iso_figures or {}), **(par_figures or {})}

    # Strata: each budget with a minimum (as before), and the budgets without one pooled: a
    # table like Chinchilla's has dozens of such budgets of one run each, and a stratum of one
    # cluster would make bootstrap.design give up stratifying the minima's budgets too.
    with_minimum = np.isin(sub.budgets, [m.budget for m in kept]) | (
        sub.budgets == observed.budget)
    plan = design(rows.size, sub.clusters, np.where(with_minimum, sub.budgets, -1.0))
    with par.single_threaded_blas():
        return run_bootstrap(refit, FIGURES + BAND_FIGURES, plan, n_resamples, rng,
                             level=level)
