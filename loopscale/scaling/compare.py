"""Family comparison: exponents side by side, the compute multiplier between two families, and
unique-parameter savings at equal loss, each with a bootstrap interval.

Frontiers used (per family, from its fits), each giving its own multiplier:
- pure (`compute_multiplier`): L_opt(C) = A C^-alpha, the IsoFLOP power law through the budget
  minima, so the compute to reach loss L is C(L) = (A / L)^(1/alpha). It is the study's form,
  but a pure power law bends away from a saturating frontier, so two families compared far
  apart on it can be off (measured: x1.93 for a true x2.25 between synthetic families).
- saturating (`compute_multiplier_saturating`): L_opt(C) = E + A_E C^-alpha_E, so
  C(L) = ((L - E) / A_E)^(-1/alpha_E) for L > E; needs E to be identified (3+ budgets).
- parametric (`compute_multiplier_parametric`): at the compute-optimal allocation under
  C = 6ND, both terms of L(N, D) = E + A N^-alpha + B D^-beta fall as (C/6)^-gamma with
  gamma = alpha beta / (alpha + beta), so L_opt(C) = E + K (C/6)^-gamma with
  K = A G^-alpha + B G^beta, and C(L) = 6 ((L - E) / K)^(-1/gamma) for L > E (no loss at or
  below E is reachable: NaN).
- Unique parameters (tables with params_unique): `unique_params_ratio` from U_opt(L) =
  (A_U / L)^(1/alpha_U), the IsoFLOP law of loss against the unique parameters at the budget
  minima (the study's form, with the pure law's bias); `unique_params_ratio_saturating` from
  U_opt = u_coef C^u at the saturating frontier's C(L).

For a pair (reference R, other O) and a target loss L*: multiplier = C_O(L*) / C_R(L*),
how many times the reference's compute the other family needs for the same loss (> 1: the
other is less compute-efficient); unique_params_ratio = U_O(L*) / U_R(L*) and
unique_params_saving = 1 - that ratio. With a target compute C* instead, L* = L_R(C*). Without
either, C* is the largest budget that the fits of both families used (`FamilyFigures.fitted`:
the IsoFLOP laws' largest used budget, or the largest compute of the runs when there is no
IsoFLOP law), never a budget a fit left out. A target outside either family's fitted range
(compute outside its used budgets; for a target loss, the other family's C(L*) outside them)
is an extrapolation, said in `extrapolation`.

Intervals pair resample i of one family with resample i of the other (the families' runs are
disjoint, so these are independent draws) and take percentiles of the result, the target loss
moving with the reference. As in bootstrap.py, a figure whose resamples come out non-finite
more than MAX_FAILED_SHARE of the time (a resample's law degenerate, the target unreachable)
has no interval: it is not identified, and `not_identified` says so.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loopscale.scaling.bootstrap import MAX_FAILED_SHARE, not_identified, percentile_interval

# Figures compared side by side, by approach.
EXPONENTS = {
    "isoflop": ("a", "b", "alpha", "alpha_E", "alpha_N", "alpha_U"),
    "parametric": ("alpha", "beta", "a", "b"),
}


@dataclasses.dataclass(frozen=True)
class FamilyFigures:
    """One family's point figures and bootstrap samples (None where that fit is missing)."""

    name: str
    max_flops: float
    # The compute range the fits used: the IsoFLOP laws' smallest and largest used budget (the
    # runs' compute range when there is no IsoFLOP law).
    fitted: tuple[float, float] | None = None
    isoflop: Mapping[str, float] | None = None
    isoflop_samples: Mapping[str, np.ndarray] | None = None
    isoflop_ci: Mapping[str, tuple[float, float] | None] | None = None
    parametric: Mapping[str, float] | None = None
    parametric_samples: Mapping[str, np.ndarray] | None = None
    parametric_ci: Mapping[str, tuple[float, float] | None] | None = None


    def fitted_range(self) -> tuple[float, float]:
        return self.fitted if self.fitted is not None else (self.max_flops, self.max_flops)


@dataclasses.dataclass(frozen=True)
class Estimate:
    value: float
    ci: tuple[float, float] | None
    reason: str | None = None  # why there is no interval ("not identified (...)"), if known


@dataclasses.dataclass(frozen=True)
class PairComparison:
    reference: str
    other: str
    target: str  # "loss" (given) or "compute" (given, or the default)
    target_compute: float | None
    extrapolation: str | None  # None inside both fitted ranges, else what lies outside
    # One target loss and multiplier per frontier: with a compute target, each frontier puts
    # the reference's loss at C* a little differently.
    target_loss: float  # IsoFLOP pure power law A C^-alpha (the sparse-layers study's form)
    compute_multiplier: Estimate
    target_loss_saturating: float  # IsoFLOP E + A_E C^-alpha_E
    compute_multiplier_saturating: Estimate
    target_loss_parametric: float  # approach 3 at its compute-optimal allocation
    compute_multiplier_parametric: Estimate
    unique_params_ratio: Estimate
    unique_params_saving: Estimate
    unique_params_ratio_saturating: Estimate
    unique_params_saving_saturating: Estimate

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        reasons = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Estimate):
                out[field.name] = value.value
                out[f"{field.name}_ci"] = None if value.ci is None else list(value.ci)
                if value.reason:
                    reasons[field.name] = value.reason
            else:
                out[field.name] = value
        out["not_identified"] = reasons
        return out


def _get(fig: Mapping[str, Any], name: str):
    # Figures a fit could not identify are NaN (or absent, e.g. A_U without params_unique).
    return np.asarray(fig.get(name, np.nan), dtype=float)


def pure_loss(fig, flops):
    return _get(fig, "A") * np.power(flops, -_get(fig, "alpha"))


def _falling(exponent):
    # A law whose loss does not fall with compute (exponent <= 0) reaches no target: NaN, so
    # a resample with such a law counts as failed rather than as a finite, absurd compute.
    return np.where(exponent > 0, exponent, np.nan)


def pure_compute(fig, loss):
    return (_get(fig, "A") / loss) ** (1.0 / _falling(_get(fig, "alpha")))


def saturating_loss(fig, flops):
    return _get(fig, "E") + _get(fig, "A_E") * np.power(flops, -_get(fig, "alpha_E"))


def saturating_compute(fig, loss):
    excess = np.asarray(loss) - _get(fig, "E")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(excess > 0, (np.abs(excess) / _get(fig, "A_E"))
                        ** (-1.0 / _get(fig, "alpha_E")), np.nan)


def unique_params(fig, loss):
    return (_get(fig, "A_U") / loss) ** (1.0 / _falling(_get(fig, "alpha_U")))


def unique_params_saturating(fig, loss):
    return _get(fig, "u_coef") * saturating_compute(fig, loss) ** _get(fig, "u")


def _parametric_k_gamma(fig):
    alpha, beta, A, B = (_get(fig, k) for k in ("alpha", "beta", "A", "B"))
    G = (alpha * A / (beta * B)) ** (1.0 / (alpha + beta))
    return A * G ** -alpha + B * G ** beta, alpha * beta / (alpha + beta)


def parametric_loss(fig, flops):
    k, gamma = _parametric_k_gamma(fig)
    return _get(fig, "E") + k * np.power(np.asarray(flops) / 6.0, -gamma)


def parametric_compute(fig, loss):
    k, gamma = _parametric_k_gamma(fig)
    excess = np.asarray(loss) - _get(fig, "E")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(excess > 0, 6.0 * (np.abs(excess) / k) ** (-1.0 / gamma), np.nan)


# frontier name -> (approach whose figures it uses, loss at compute, compute for loss)
FRONTIERS = {
    "pure": ("isoflop", pure_loss, pure_compute),
    "saturating": ("isoflop", saturating_loss, saturating_compute),
    "parametric": ("parametric", parametric_loss, parametric_compute),
}


def compare_pair(ref: FamilyFigures, other: FamilyFigures, target_loss: float | None = None,
                 target_compute: float | None = None, level: float = 0.95) -> PairComparison:
    if target_loss is None and target_compute is None:
        target_compute = min(ref.fitted_range()[1], other.fitted_range()[1])
    out: dict[str, Any] = {}
    for frontier, (approach, loss_at, compute_for) in FRONTIERS.items():

        def multiplier(r, o, loss_at=loss_at, compute_for=compute_for):
            loss = target_loss if target_loss is not None else loss_at(r, target_compute)
            return loss, compute_for(o, loss) / compute_for(r, loss)

        loss, value, samples = _paired(ref, other, approach, multiplier)
        suffix = "" if frontier == "pure" else f"_{frontier}"
        out[f"target_loss{suffix}"] = float(loss)
        out[f"compute_multiplier{suffix}"] = _estimate(value, samples, level)

    for suffix, loss_at, unique_at in (("", pure_loss, unique_params),
                                       ("_saturating", saturating_loss,
                                        unique_params_saturating)):

        def unique_ratio(r, o, loss_at=loss_at, unique_at=unique_at):
            loss = target_loss if target_loss is not None else loss_at(r, target_compute)
            return loss, unique_at(o, loss) / unique_at(r, loss)

        _, ratio, samples = _paired(ref, other, "isoflop", unique_ratio)
        out[f"unique_params_ratio{suffix}"] = _estimate(ratio, samples, level)
        out[f"unique_params_saving{suffix}"] = _estimate(
            1.0 - ratio, None if samples is None else 1.0 - samples, level)
    return PairComparison(
        reference=ref.name, other=other.name,
        target="loss" if target_loss is not None else "compute",
        target_compute=None if target_compute is None else float(target_compute),
        extrapolation=_extrapolation(ref, other, target_loss, target_compute), **out)


def _extrapolation(ref: FamilyFigures, other: FamilyFigures, target_loss: float | None,
                   target_compute: float | None) -> str | None:
    """What of the comparison lies outside the families' fitted compute ranges, or None.
    With a target loss, each family's compute for it on the pure law is what must lie inside
    its own range."""
    outside = []
    for fam in (ref, other):
        low, high = fam.fitted_range()
        if target_compute is not None:
            at = float(target_compute)
        elif fam.isoflop is not None:
            with np.errstate(all="ignore"):
                at = float(pure_compute(fam.isoflop, target_loss))
        else:
            continue
        if not np.isfinite(at):
            outside.append(f"{fam.name} never reaches the target on its fitted law")
        elif not low * (1 - 1e-6) <= at <= high * (1 + 1e-6):
            outside.append(f"C = {at:.3g} is outside {fam.name}'s fitted budgets "
                           f"{low:.3g}-{high:.3g}")
    return "extrapolates: " + "; ".join(outside) if outside else None


def _paired(ref: FamilyFigures, other: FamilyFigures, approach: str, fn):
    """fn on the two families' point figures, and on their paired bootstrap samples."""
    r, o = getattr(ref, approach), getattr(other, approach)
    if r is None or o is None:
        return np.nan, np.nan, None
    rs, os_ = getattr(ref, f"{approach}_samples"), getattr(other, f"{approach}_samples")
    # Resamples with a degenerate fit (an exponent <= 0, an unreachable target) give inf or
    # NaN here, by design: intervals use the finite samples. numpy need not warn about them.
    with np.errstate(all="ignore"):
        loss, value = fn(r, o)
        samples = None if rs is None or os_ is None else fn(rs, os_)[1]
    return float(loss), float(value), samples


def _estimate(value: float, samples: np.ndarray | None, level: float) -> Estimate:
    value = float(value)
    if not np.isfinite(value):
        return Estimate(value=float("nan"), ci=None)
    if samples is None:
        return Estimate(value=value, ci=None)
    samples = np.asarray(samples, dtype=float)
    failed = float(np.mean(~np.isfinite(samples))) if samples.size else 1.0
    if failed > MAX_FAILED_SHARE:
        return Estimate(value=value, ci=None, reason=not_identified(failed))
    return Estimate(value=value, ci=percentile_interval(samples, level))


def exponents_side_by_side(families: Sequence[FamilyFigures]) -> dict[str, Any]:
    """{approach: {figure: {FAMILY: value, FAMILY_ci: [low, high]}}}, families in order."""
    out: dict[str, Any] = {}
    for approach, names in EXPONENTS.items():
        table: dict[str, Any] = {}
        for name in names:
            row: dict[str, Any] = {}
            for fam in families:
                figures = getattr(fam, approach)
                cis = getattr(fam, f"{approach}_ci") or {}
                if figures is None or name not in figures:
                    continue
                row[fam.name] = figures[name]
                ci = cis.get(name)
                row[f"{fam.name}_ci"] = None if ci is None else list(ci)
            if row:
                table[name] = row
        out[approach] = table
    return out


def default_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair in table order, the earlier family as the reference."""
    return list(itertools.combinations(names, 2))
