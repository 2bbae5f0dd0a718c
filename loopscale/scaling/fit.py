"""`loopscale fit`: every fit per family, bootstrap intervals, family comparison, the held-out
check and the recurrence law -> fit.json.

One module for one job, the command's result: running the fits per family, and the two views
of them that only this module defines (fit.json below, and the short printed table).

fit.json schema (version 2). Every figure X has its interval beside it as X_ci = [low, high]
(percentile cluster bootstrap at `options.level`, bootstrap.py), null without bootstrap, when
X itself is null, or when X is *not identified*: more than 10% of the bootstrap refits failed
for it, and then the fit object's `not_identified` maps X to the reason ("not identified (26%
of refits failed)"); an interval over the refits that survived would be too narrow. A figure
that could not be fitted is null. Numbers are plain JSON floats.

  schema_version     2
  table              source (file name), rows, fitted, excluded (counts),
                     params_column, tokens_column, loss_column,
                     flops    how C was obtained: "column flops" or "6*params*tokens"
                     budgets  "column budget" or "log10(flops) grouped within 0.02 dex"
  options            bootstrap (resamples), seed, level, spline, weighted, grid, huber_delta,
                     budget_tolerance_dex, target_loss, target_compute, holdout, e_bounds
  families.NAME      one per family (`all` when the table has no family column):
    runs, max_flops, fitted_flops ([low, high]: the compute range the fits used)
    isoflop          Chinchilla approach 2 (isoflop.py):
                       a, a_coef       N_opt = a_coef * C^a
                       b, b_coef       D_opt = b_coef * C^b
                       alpha, A        L_opt = A * C^-alpha
                       E, alpha_E, A_E L_opt = E + A_E * C^-alpha_E
                       alpha_N, A_N    L_opt = A_N * N_opt^-alpha_N
                       alpha_U, A_U    L_opt = A_U * U_opt^-alpha_U  } U = unique params at
                       u, u_coef       U_opt = u_coef * C^u        } the optimum; null
                                                                     without params_unique
                       not_identified {figure: reason}
                       method ("parabola" | "spline"), weighted, budgets_used,
                       skipped (null, or why no power law was fitted),
                       estimator {headline, reason, warning}: which per-budget estimator the
                         figures use and why; warning when a parabola is likely biased
                         (off-centre minima, grids over a decade wide)
                       alternative {method, budgets_used, skipped, the same laws}: the laws
                         through the other estimator's minima (spline beside parabola)
                       under_6n_attn {skipped, the same laws}: each budget's compute counted
                         under 6n_attn (the table's flops_6n_attn), point values
                       counts {params, params_meaning, flops, flop_convention}: what N and C
                         count, which every exponent is relative to
                       bootstrap {resamples, failed, failed_share, resampling (the unit:
                         "runs", or trunks with their branches), clusters, stratified}
                       minima: [{budget, runs, sizes, method, params_opt, tokens_opt,
                                 loss_opt (each with _ci), not_identified,
                                 params_unique_opt, on_edge, edge ("smallest",
                                 "largest" or null: which end), used, reason, centring (0:
                                 smallest size, 1: largest), grid_dex, alt_method,
                                 alt_params_opt, alt_loss_opt, alt_used,
                                 sd_log_params/tokens/loss (weighted fits)}]
    parametric       Chinchilla approach 3 (parametric.py):
                       E, A, B, alpha, beta   L = E + A/N^alpha + B/D^beta
                       G, a, b         N_opt = G (C/6)^a, D_opt = (C/6)^b / G  (C = 6ND)
                       not_identified, objective (summed Huber loss), residual_sd (nats),
                       lack_of_fit_90 ([low, high], Marin's Student-t interval) and its
                       _halfwidth, e_bounds, points, starts, converged, grid, counts,
                       skipped, bootstrap {..., warm_starts}
  comparison         exponents: {isoflop|parametric: {figure: {FAMILY: v, FAMILY_ci: [l, h]}}}
                     pairs: [{reference, other, target ("loss"|"compute"), target_compute,
                              extrapolation (null, or what lies outside the fitted budgets),
                              target_loss, compute_multiplier (IsoFLOP pure law),
                              target_loss_saturating, compute_multiplier_saturating,
                              target_loss_parametric, compute_multiplier_parametric,
                              unique_params_ratio, unique_params_saving,
                              unique_params_ratio_saturating, unique_params_saving_saturating
                              (each multiplier, ratio and saving with _ci), not_identified}]
                     (compare.py; the default target is the largest budget both fits used)
  holdout            (with --holdout) budget, spec, families.NAME: {predicted_loss,
                     predicted_loss_saturating, observed_loss, error, error_saturating,
                     predicted_n_opt, observed_n_opt, error_log_n_opt (each with _ci),
                     not_identified, predicted_loss_parametric, error_parametric,
                     train_budgets, observed_reason, skipped, bootstrap}   (holdout.py)
  recurrence         (tables at two or more loop counts) the iso-depth law: phi, E, A, B,
                     alpha, beta (each with _ci), n_runs, loop_counts, families, residual_sd,
                     r2, equivalent_params, optimal_loops, bootstrap, moe {stored, active}
                     (recurrence.py); at one loop count no object and a line in `warnings`
  excluded           [{row, run, family, status, reason}]: input rows not fitted
  warnings           [str]: e.g. a budget whose minimum is on the edge of its size grid

Seeds: the resamples of family F come from np.random.default_rng([seed, crc32(F), k]) with k
= 0 (IsoFLOP weights), 1 (IsoFLOP bootstrap), 2 (parametric bootstrap), 3 and 4 (the held-out
check's weights and bootstrap), so a family's intervals depend on the seed and its own runs
only, not on which other families are present.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from loopscale.errors import UsageError
from loopscale.scaling import FitError
from loopscale.scaling import compare as cmp
from loopscale.scaling import holdout as ho
from loopscale.scaling import isoflop as iso
from loopscale.scaling import parametric as par
from loopscale.scaling import recurrence as rec
from loopscale.scaling import table as tbl
from loopscale.scaling.bootstrap import Bootstrap
from loopscale.scaling.frontier_laws import FrontierLaws
from loopscale.scaling.jsonable import clean
from loopscale.scaling.runs import FamilyRuns, family_runs

SCHEMA_VERSION = 2


@dataclasses.dataclass(frozen=True)
class FitOptions:
    bootstrap: int = 1000
    seed: int = 0
    level: float = 0.95
    spline: bool = False
    weighted: bool = False
    grid: str = "hoffmann"
    huber_delta: float = par.HUBER_DELTA
    budget_tolerance: float = iso.BUDGET_TOLERANCE_DEX
    pairs: tuple[tuple[str, str], ...] | None = None  # None: every pair (compare.default_pairs)
    target_loss: float | None = None
    target_compute: float | None = None
    holdout: str | None = None  # None, "largest" or a budget: the held-out check (holdout.py)
    # Bounds on the parametric fit's E (either may be None; equal: E fixed), parametric.py.
    e_bounds: tuple[float | None, float | None] | None = None


@dataclasses.dataclass(frozen=True)
class FamilyFit:
    name: str
    runs: FamilyRuns
    isoflop: iso.IsoFlopFit
    isoflop_boot: Bootstrap | None
    parametric: par.ParametricFit | None
    parametric_skipped: str | None
    parametric_boot: Bootstrap | None
    # The IsoFLOP laws refitted with each budget's compute under 6n_attn (None: why not).
    isoflop_attn: FrontierLaws | None = None
    isoflop_attn_reason: str | None = None

    @property
    def n_runs(self) -> int:
        return self.runs.n_runs

    @property
    def max_flops(self) -> float:
        return float(self.runs.flops.max())

    def fitted_range(self) -> tuple[float, float]:
        """The compute the fits used: the IsoFLOP laws' used budgets, else the runs' compute."""
        used = [m.budget for m in self.isoflop.minima if m.used]
        if self.isoflop.laws is not None and used:
            return min(used), max(used)
        return float(self.runs.flops.min()), self.max_flops

    def figures(self) -> cmp.FamilyFigures:
        """The view compare.py works on."""
        laws, pfit = self.isoflop.laws, self.parametric
        return cmp.FamilyFigures(
            name=self.name, max_flops=self.max_flops, fitted=self.fitted_range(),
            isoflop=None if laws is None else laws.figures(),
            isoflop_samples=None if self.isoflop_boot is None else self.isoflop_boot.samples,
            isoflop_ci=None if self.isoflop_boot is None else self.isoflop_boot.intervals(),
            parametric=None if pfit is None else pfit.figures(),
            parametric_samples=None if self.parametric_boot is None
            else self.parametric_boot.samples,
            parametric_ci=None if self.parametric_boot is None
            else self.parametric_boot.intervals())


@dataclasses.dataclass(frozen=True)
class FitResult:
    table: tbl.ResultsTable
    options: FitOptions
    families: tuple[FamilyFit, ...]
    pairs: tuple[cmp.PairComparison, ...]
    warnings: tuple[str, ...]
    holdouts: tuple[ho.Holdout | None, ...] = ()  # per family (None: no runs at that budget)
    holdout_budget: float | None = None
    recurrence: dict[str, Any] | None = None  # fit.json's `recurrence` (recurrence.py)


def family_rng(seed: int, family: str, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(family.encode()), stream])


def fit_family(name: str, table: tbl.ResultsTable, options: FitOptions) -> FamilyFit:
    runs = family_runs(table, name, options.budget_tolerance)
    n, d, loss, unique = runs.params, runs.tokens, runs.loss, runs.unique
    budgets, clusters = runs.budgets, runs.clusters

    isofit = iso.fit_isoflop(budgets, n, d, loss, unique, options.spline, options.weighted,
                             family_rng(options.seed, name, 0))
    iso_boot = None
    if isofit.laws is not None and options.bootstrap > 0:
        iso_boot = iso.bootstrap_isoflop(isofit, budgets, n, d, loss, unique, options.bootstrap,
                                         family_rng(options.seed, name, 1), options.level,
                                         clusters)

    attn, attn_why = iso.refit_under_convention(isofit, budgets, n, runs.flops_attn)

    pfit, skipped, p_boot = None, None, None
    try:
        pfit = par.fit_parametric(n, d, loss, par.grid_starts(options.grid), options.huber_delta,
                                  e_bounds=options.e_bounds)
    except FitError as e:
        skipped = str(e)
    if pfit is not None and options.bootstrap > 0:
        p_boot = par.bootstrap_parametric(pfit, n, d, loss, options.bootstrap,
                                          family_rng(options.seed, name, 2),
                                          options.huber_delta, options.level, clusters)
    return FamilyFit(name=name, runs=runs, isoflop=isofit, isoflop_boot=iso_boot,
                     parametric=pfit, parametric_skipped=skipped, parametric_boot=p_boot,
                     isoflop_attn=attn, isoflop_attn_reason=attn_why)


def fit_results(table: tbl.ResultsTable, options: FitOptions = FitOptions()) -> FitResult:
    if options.holdout not in (None, ho.LARGEST):  # a budget the table lacks: before any fit
        ho.resolve_budget(options.holdout, np.concatenate(
            [family_runs(table, f, options.budget_tolerance).budgets for f in table.families]))
    families = tuple(fit_family(name, table, options) for name in table.families)
    by_name = {f.name: f for f in families}
    pairs = options.pairs if options.pairs is not None else cmp.default_pairs(table.families)
    comparisons = []
    for ref, other in pairs:
        if ref not in by_name or other not in by_name:
            missing = ref if ref not in by_name else other
            raise FitError(f"no family {missing!r} to compare (families: "
                           f"{', '.join(by_name)})")
        comparisons.append(cmp.compare_pair(by_name[ref].figures(), by_name[other].figures(),
                                            options.target_loss, options.target_compute,
                                            options.level))
    holdouts, budget = (), None
    if options.holdout is not None:
        budget = ho.resolve_budget(options.holdout,
                                   np.concatenate([f.runs.budgets for f in families]),
                                   [m for f in families for m in f.isoflop.minima])
        holdouts = tuple(_holdout(f, budget, options) for f in families)
    warnings = _warnings(families)
    recurrence = None
    if table.has_recurrence:
        recurrence = rec.recurrence_json(table, options.bootstrap, options.seed, options.level,
                                         budget_tolerance=options.budget_tolerance)
        if "phi" not in recurrence:  # a table at one loop count: no law, and why in one line
            warnings.append(f"no recurrence law: {recurrence['skipped']}")
            recurrence = None
    return FitResult(table=table, options=options, families=families,
                     pairs=tuple(comparisons), warnings=tuple(warnings),
                     holdouts=holdouts, holdout_budget=budget, recurrence=recurrence)


def _holdout(fam: FamilyFit, budget: float, options: FitOptions) -> ho.Holdout | None:
    if not np.isclose(fam.runs.budgets, budget, rtol=1e-9).any():
        return None
    return ho.fit_holdout(fam.runs, budget, options.spline, options.weighted, options.grid,
                          options.huber_delta, options.e_bounds, options.bootstrap,
                          family_rng(options.seed, fam.name, 3),
                          family_rng(options.seed, fam.name, 4), options.level)


def _warnings(families: Sequence[FamilyFit]) -> list[str]:
    out = []
    for fam in families:
        sparse = [m for m in fam.isoflop.minima if not m.used and m.n_sizes < 3]
        for m in fam.isoflop.minima:
            if not m.used and m.n_sizes >= 3:
                out.append(f"family {fam.name}: budget {m.budget:.3g}: {m.reason}; "
                           "left out of the IsoFLOP power laws")
        if sparse:
            # One line, not one per budget: a table that is not an IsoFLOP sweep has many.
            out.append(f"family {fam.name}: {len(sparse)} budget(s) with under 3 model sizes "
                       f"({', '.join(f'{m.budget:.3g}' for m in sparse[:5])}"
                       f"{', ...' if len(sparse) > 5 else ''}) left out of the IsoFLOP fit")
        if fam.isoflop.laws is None:
            out.append(f"family {fam.name}: no IsoFLOP fit: {fam.isoflop.reason}")
        else:
            biased = iso.estimator_warning(fam.isoflop)
            if biased:
                out.append(f"family {fam.name}: {biased.removeprefix('warning: ')}")
        if fam.parametric_skipped:
            out.append(f"family {fam.name}: no parametric fit: {fam.parametric_skipped}")
    return out


# --- fit.json -----------------------------------------------------------------------------

def to_json(result: FitResult) -> dict[str, Any]:
    t, o = result.table, result.options
    cols = t.columns
    doc = {
        "schema_version": SCHEMA_VERSION,
        "table": {
            "source": t.source, "rows": t.n_rows, "fitted": len(t.runs),
            "excluded": len(t.excluded), "params_column": cols.params,
            "tokens_column": cols.tokens, "loss_column": cols.loss, "flops": t.flops_source,
            "budgets": (f"column {cols.budget}" if t.has_budget else
                        f"log10(flops) grouped within {o.budget_tolerance:g} dex"),
        },
        "options": {
            "bootstrap": o.bootstrap, "seed": o.seed, "level": o.level, "spline": o.spline,
            "weighted": o.weighted, "grid": o.grid, "huber_delta": o.huber_delta,
            "budget_tolerance_dex": o.budget_tolerance, "target_loss": o.target_loss,
            "target_compute": o.target_compute, "holdout": o.holdout,
            "e_bounds": None if o.e_bounds is None else list(o.e_bounds),
        },
        "families": {f.name: _family_json(f, result) for f in result.families},
        "comparison": {
            "exponents": cmp.exponents_side_by_side([f.figures() for f in result.families]),
            "pairs": [p.to_json() for p in result.pairs],
        },
        "excluded": [e.to_json() for e in t.excluded],
        "warnings": list(result.warnings),
    }
    if o.holdout is not None:
        doc["holdout"] = _holdout_json(result)
    if result.recurrence is not None:
        doc["recurrence"] = result.recurrence
    return clean(doc)


def _holdout_json(result: FitResult) -> dict[str, Any]:
    families = {}
    for fam, h in zip(result.families, result.holdouts):
        if h is None:
            families[fam.name] = {"skipped": f"no runs at budget {result.holdout_budget:.3g}"}
            continue
        figures = h.figures()
        entry = _with_ci({k: figures[k] for k in ho.FIGURES}, h.boot)
        entry.update(
            predicted_loss_parametric=figures["predicted_loss_parametric"],
            error_parametric=figures["error_parametric"],
            train_budgets=list(h.train_budgets),
            observed_reason=None if h.observed.used else h.observed.reason,
            skipped=h.reason,
            bootstrap=None if h.boot is None else h.boot.to_json())
        families[fam.name] = entry
    return {"budget": result.holdout_budget, "spec": result.options.holdout,
            "families": families}


def fit_document(result: FitResult, source: str) -> dict[str, Any]:
    """fit.json's document (`to_json`), or UsageError when no family got any fit at all (too
    few budgets, sizes or runs): a table that cannot be fitted is bad input, not a result.
    `source` names the table in that message."""
    doc = to_json(result)
    fits = [fam[kind] for fam in doc["families"].values() for kind in ("isoflop", "parametric")]
    if fits and all(f["skipped"] for f in fits):
        raise UsageError(f"{source}: nothing could be fitted ({doc['warnings'][-1]})")
    return doc


def _with_ci(figures: dict[str, float], boot: Bootstrap | None) -> dict[str, Any]:
    """Each figure with its interval (X_ci), and `not_identified`: {X: why X_ci is null} for
    every fitted figure whose bootstrap failed too often (bootstrap.MAX_FAILED_SHARE)."""
    out: dict[str, Any] = {}
    reasons = {}
    for name, value in figures.items():
        out[name] = value
        finite = value is not None and math.isfinite(value)
        # No interval without a point: a resample cannot identify what the data did not.
        out[f"{name}_ci"] = None if boot is None or not finite else boot.interval(name)
        why = None if boot is None else boot.not_identified(name)
        if why and finite:
            reasons[name] = why
    out["not_identified"] = reasons
    return out


def _family_json(fam: FamilyFit, result: FitResult) -> dict[str, Any]:
    isofit, boot = fam.isoflop, fam.isoflop_boot
    laws = (isofit.laws.figures() if isofit.laws is not None
            else dict.fromkeys(iso.FIGURES, None))
    isoflop = _with_ci(laws, boot)
    method, why = iso.estimator_choice(isofit)
    isoflop.update(
        method=isofit.method, weighted=isofit.weighted, budgets_used=isofit.n_used,
        skipped=isofit.reason,
        estimator={"headline": method, "reason": why.split("\n")[0],
                   "warning": iso.estimator_warning(isofit) if isofit.laws else None},
        alternative={"method": isofit.alt_method, "budgets_used": isofit.alt_n_used,
                     "skipped": isofit.alt_reason,
                     **(isofit.alt_laws.figures() if isofit.alt_laws is not None
                        else dict.fromkeys(iso.FIGURES, None))},
        under_6n_attn={"skipped": fam.isoflop_attn_reason,
                       **(fam.isoflop_attn.figures() if fam.isoflop_attn is not None
                          else dict.fromkeys(iso.FIGURES, None))},
        counts=_counts(result),
        bootstrap=None if boot is None else boot.to_json(),
        minima=[_minimum_json(i, m, boot, result) for i, m in enumerate(isofit.minima)])

    pfit, pboot = fam.parametric, fam.parametric_boot
    figures = pfit.figures() if pfit is not None else dict.fromkeys(par.FIGURES, None)
    parametric = _with_ci(figures, pboot)
    parametric.update(
        objective=None if pfit is None else pfit.objective,
        residual_sd=None if pfit is None else pfit.residual_sd,
        lack_of_fit_90=None if pfit is None else list(pfit.lack_of_fit),
        lack_of_fit_90_halfwidth=None if pfit is None else
        (pfit.lack_of_fit[1] - pfit.lack_of_fit[0]) / 2.0,
        e_bounds=None if pfit is None else list(pfit.e_bounds),
        points=fam.n_runs, starts=None if pfit is None else pfit.n_starts,
        converged=None if pfit is None else pfit.n_converged, grid=result.options.grid,
        counts=_counts(result),
        skipped=fam.parametric_skipped,
        bootstrap=None if pboot is None else {
            **pboot.to_json(), "warm_starts": len(pfit.warm_starts),
            # How alpha and beta move together across the resamples: near +1 they trade off
            # along a ridge the runs cannot resolve, while a = beta/(alpha+beta) is held better.
            "alpha_beta_spearman": pboot.rank_correlation("alpha", "beta")})
    return {"runs": fam.n_runs, "max_flops": fam.max_flops,
            "fitted_flops": list(fam.fitted_range()), "isoflop": isoflop,
            "parametric": parametric}


# What each parameter column of `collect` counts (flops.py), for fit.json's `counts`.
PARAMS_MEANING = {
    "params_active": "active per token (MoE: top_k experts), per loop pass, embeddings included",
    "params_unique": "stored, each physical layer once, embeddings excluded",
    "params_effective": "stored, per loop pass, embeddings excluded",
    "params_active_nonembedding": "active per token, per loop pass, embeddings excluded",
    "params_total": "stored, embeddings included",
}


def _counts(result: FitResult) -> dict[str, Any]:
    """What N and C count: every exponent is relative to them."""
    t = result.table
    return {"params": t.columns.params,
            "params_meaning": PARAMS_MEANING.get(t.columns.params, "as the table gives it"),
            "flops": t.flops_source, "flop_convention": list(t.flop_conventions) or None}


def _minimum_json(i: int, m: iso.BudgetMinimum, boot: Bootstrap | None,
                  result: FitResult) -> dict[str, Any]:
    out: dict[str, Any] = {"budget": m.budget, "runs": m.n_runs, "sizes": m.n_sizes,
                           "method": m.method}
    for name in iso.MIN_FIGURES:
        out[name] = getattr(m, name)
        out[f"{name}_ci"] = None if boot is None else boot.interval(iso.minimum_figure(i, name))
    why = {name: boot.not_identified(iso.minimum_figure(i, name)) for name in iso.MIN_FIGURES
           if boot is not None and m.used}
    out["not_identified"] = {k: v for k, v in why.items() if v}
    if result.table.has_unique:
        out["params_unique_opt"] = m.params_unique_opt
    out.update(on_edge=m.on_edge, edge=None if m.edge is None else m.edge.value, used=m.used,
               reason=m.reason, centring=m.centring, grid_dex=m.grid_dex, alt_method=m.alt_method, alt_params_opt=m.alt_params_opt,
               alt_loss_opt=m.alt_loss_opt, alt_used=m.alt_used)
    if result.options.weighted:
        out.update(sd_log_params=m.sd_log_params, sd_log_tokens=m.sd_log_tokens,
                   sd_log_loss=m.sd_log_loss)
    return out


# --- the printed table --------------------------------------------------------------------

SUMMARY = {"isoflop": ("a", "b", "alpha", "E", "alpha_E", "alpha_N"),
           "parametric": ("E", "A", "B", "alpha", "beta", "a", "b")}


def summary_table(doc: dict[str, Any]) -> str:
    """A short text table of fit.json's main figures and comparisons."""
    t = doc["table"]
    level = f"{100 * doc['options']['level']:g}% CI"
    lines = [(f"{t['source']}: {t['fitted']} runs fitted, {t['excluded']} excluded; "
              f"N = {t['params_column']}, C = {t['flops']}"),
             f"{'family':<14}{'fit':<12}{'figure':<10}{'value':>12}  {level}"]
    for name, fam in doc["families"].items():
        for approach, figures in SUMMARY.items():
            fit = fam[approach]
            if fit.get("skipped") and all(fit.get(f) is None for f in figures):
                lines.append(f"{name:<14}{approach:<12}skipped: {fit['skipped']}")
                continue
            for fig in figures:
                lines.append(f"{name:<14}{approach:<12}{fig:<10}{_num(fit.get(fig)):>12}  "
                             f"{_interval(fit.get(fig + '_ci'), fit['not_identified'].get(fig))}")
    for p in doc["comparison"]["pairs"]:
        at = (f"C={_num(p['target_compute'])}" if p["target"] == "compute"
              else f"L={_num(p['target_loss'])}")
        parts = [f"{label} x{_num(p[key])} "
                 f"{_interval(p[key + '_ci'], p['not_identified'].get(key))}".rstrip()
                 for label, key in (("compute (pure law)", "compute_multiplier"),
                                    ("saturating", "compute_multiplier_saturating"),
                                    ("parametric", "compute_multiplier_parametric"),
                                    ("unique params", "unique_params_ratio"),
                                    ("saturating", "unique_params_ratio_saturating"))
                 if p[key] is not None]
        lines.append(f"{p['other']} vs {p['reference']} at {at}: " + "; ".join(parts)
                     + (f" ({p['extrapolation']})" if p["extrapolation"] else ""))
    if "holdout" in doc:
        h = doc["holdout"]
        for name, f in h["families"].items():
            if f.get("error") is None:
                why = f.get("skipped") or f.get("observed_reason") or "not identified"
                lines.append(f"holdout C={_num(h['budget'])} {name}: no IsoFLOP check ({why})")
                continue
            lines.append(f"holdout C={_num(h['budget'])} {name}: predicted L_opt "
                         f"{_num(f['predicted_loss'])}, observed {_num(f['observed_loss'])}, "
                         f"error {_num(f['error'])} "
                         f"{_interval(f['error_ci'], f['not_identified'].get('error'))}")
    if "recurrence" in doc:
        from loopscale.scaling.recurrence import report_lines

        lines.append(report_lines(doc["recurrence"])[0])
    return "\n".join(lines)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


def _interval(ci: Any, why: str | None = None) -> str:
    if why:
        return why
    return "" if ci is None else f"[{ci[0]:.4g}, {ci[1]:.4g}]"
