"""Family comparison: compute multipliers and unique-parameter savings with known answers; the
default comparison point (the largest budget both fits used), extrapolation, and multipliers
that are not identified."""

import numpy as np
import pandas as pd
import pytest

from loopscale.scaling import table as tbl
from loopscale.scaling.compare import (
    FamilyFigures,
    compare_pair,
    exponents_side_by_side,
    pure_loss,
)
from loopscale.scaling.fit import FitOptions, fit_results


def iso(A, alpha, A_U=np.nan, alpha_U=np.nan, **saturating):
    return {"A": A, "alpha": alpha, "A_U": A_U, "alpha_U": alpha_U, **saturating}


def test_isoflop_multiplier_is_the_compute_efficiency_factor():
    # The other family reaches at compute k*C what the reference reaches at C.
    k, alpha = 3.0, 0.08
    ref = FamilyFigures("base", 1e20, isoflop=iso(60.0, alpha))
    other = FamilyFigures("looped", 1e20, isoflop=iso(60.0 * k ** alpha, alpha))
    at_compute = compare_pair(ref, other)
    assert at_compute.target == "compute" and at_compute.target_compute == 1e20
    assert at_compute.compute_multiplier.value == pytest.approx(k)
    assert compare_pair(ref, other, target_loss=2.5).compute_multiplier.value == pytest.approx(k)


def test_saturating_multiplier_and_unique_parameters():
    # L = E + A_E C^-alpha_E with A_E scaled by k^alpha_E: k x the compute for the same loss;
    # U_opt = u_coef C^u, the other storing half as many per unit of compute^u.
    k, alpha_E, u = 2.0, 0.16, 0.47
    ref = FamilyFigures("base", 1e20, isoflop=iso(
        60.0, 0.08, E=1.7, A_E=2000.0, alpha_E=alpha_E, u=u, u_coef=0.06))
    other = FamilyFigures("looped", 1e20, isoflop=iso(
        60.0, 0.08, E=1.7, A_E=2000.0 * k ** alpha_E, alpha_E=alpha_E, u=u, u_coef=0.03))
    result = compare_pair(ref, other)
    assert result.compute_multiplier_saturating.value == pytest.approx(k)
    assert result.unique_params_ratio_saturating.value == pytest.approx(0.5 * k ** u)
    assert np.isnan(result.unique_params_ratio.value)  # no A_U, alpha_U given


def test_parametric_multiplier_of_a_uniformly_less_efficient_family():
    # L_other(N, D) = L_ref(N/s, D/s): the other needs s*N and s*D, so s^2 the compute.
    s = 1.5
    p = {"E": 1.8, "A": 480.0, "B": 2100.0, "alpha": 0.35, "beta": 0.37}
    q = dict(p, A=p["A"] * s ** p["alpha"], B=p["B"] * s ** p["beta"])
    ref = FamilyFigures("base", 1e21, parametric=p)
    other = FamilyFigures("moe", 1e21, parametric=q)
    result = compare_pair(ref, other, target_loss=2.3)
    assert result.compute_multiplier_parametric.value == pytest.approx(s ** 2)
    assert np.isnan(result.compute_multiplier.value)  # no IsoFLOP fits given
    below_e = compare_pair(ref, other, target_loss=1.7)
    assert np.isnan(below_e.compute_multiplier_parametric.value)


def test_unique_parameter_saving_at_equal_loss():
    ref = FamilyFigures("base", 1e20, isoflop=iso(60.0, 0.08, A_U=40.0, alpha_U=0.08))
    other = FamilyFigures("looped", 1e20, isoflop=iso(60.0, 0.08, A_U=40.0 * 0.5 ** 0.08,
                                                         alpha_U=0.08))
    result = compare_pair(ref, other, target_loss=3.0)
    assert result.unique_params_ratio.value == pytest.approx(0.5)
    assert result.unique_params_saving.value == pytest.approx(0.5)


def test_intervals_come_from_paired_resamples():
    rng = np.random.default_rng(0)

    def samples(A):
        return {"A": A * np.exp(rng.normal(0, 0.02, 300)),
                "alpha": 0.08 + rng.normal(0, 0.002, 300)}

    ref = FamilyFigures("base", 1e20, isoflop=iso(60.0, 0.08), isoflop_samples=samples(60.0))
    other = FamilyFigures("looped", 1e20, isoflop=iso(66.0, 0.08),
                          isoflop_samples=samples(66.0))
    result = compare_pair(ref, other)
    low, high = result.compute_multiplier.ci
    assert low < result.compute_multiplier.value < high
    assert result.to_json()["compute_multiplier_ci"] == [low, high]


def test_exponents_side_by_side():
    fams = [FamilyFigures("base", 1e20, isoflop={"alpha_N": 0.076},
                          isoflop_ci={"alpha_N": (0.07, 0.08)}),
            FamilyFigures("looped_moe", 1e20, isoflop={"alpha_N": 0.077})]
    table = exponents_side_by_side(fams)["isoflop"]["alpha_N"]
    assert table == {"base": 0.076, "base_ci": [0.07, 0.08], "looped_moe": 0.077,
                     "looped_moe_ci": None}


# --- the default comparison point, extrapolation, not-identified multipliers ----------------

ALPHA, BETA, E, A, B = 0.34, 0.30, 1.7, 400.0, 1500.0
BUDGETS = np.logspace(18, 20, 4)  # 1e18, 4.6e18, 2.2e19, 1e20


def family_frame(name, s, top_shift=0.0, sizes=7, seed=0):
    """L(N, D) = E + A (N/S)^-alpha + B (D/S)^-beta, 0.1% noise, `sizes` sizes per budget over
    +-0.5 dex around the optimum; the largest budget's grid moved by `top_shift` dex (0.8:
    every size above its optimum, so its minimum is on the grid's edge and left out)."""
    rng = np.random.default_rng(seed)
    G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    c = np.repeat(BUDGETS, sizes)
    n_opt = s * G * (c / (6 * s * s)) ** (BETA / (ALPHA + BETA))
    shift = np.where(c == BUDGETS[-1], top_shift, 0.0)
    n = n_opt * 10 ** (np.tile(np.linspace(-0.5, 0.5, sizes), BUDGETS.size) + shift)
    d = c / (6 * n)
    loss = (E + A * (n / s) ** -ALPHA + B * (d / s) ** -BETA) * np.exp(
        rng.normal(0, 0.001, c.size))
    return pd.DataFrame({"run_id": [f"{name}-{i}" for i in range(c.size)], "family": name,
                         "params": n, "tokens": d, "flops": c, "loss": loss})


@pytest.fixture(scope="module")
def left_out_top():
    """base uses all 4 budgets; looped (S = 1.5) reaches 1e20 too, but its top budget's grid
    misses the optimum, so its laws stop at 2.2e19."""
    frame = pd.concat([family_frame("base", 1.0), family_frame("looped", 1.5, top_shift=0.8,
                                                               seed=1)], ignore_index=True)
    return fit_results(tbl.prepare_table(frame), FitOptions(bootstrap=20, grid="small"))


def test_default_target_is_the_largest_budget_both_fits_used(left_out_top):
    base, looped = left_out_top.families
    assert base.max_flops == looped.max_flops == pytest.approx(BUDGETS[-1])
    assert [m.used for m in looped.isoflop.minima] == [True, True, True, False]
    assert base.fitted_range() == pytest.approx((BUDGETS[0], BUDGETS[-1]))
    assert looped.fitted_range() == pytest.approx((BUDGETS[0], BUDGETS[2]))
    (pair,) = left_out_top.pairs
    # not 1e20, the largest compute both families' runs reached: looped's laws never saw it
    assert pair.target == "compute" and pair.target_compute == pytest.approx(BUDGETS[2])
    assert pair.extrapolation is None
    # the saturating frontier recovers the true S^2 there (measured 2.247)
    assert pair.compute_multiplier_saturating.value == pytest.approx(1.5 ** 2, rel=0.03)
    assert pair.to_json()["target_compute"] == pytest.approx(BUDGETS[2])


def test_a_target_beyond_a_fitted_range_is_an_extrapolation(left_out_top):
    base, looped = (f.figures() for f in left_out_top.families)
    beyond = compare_pair(base, looped, target_compute=BUDGETS[-1])
    assert beyond.extrapolation == ("extrapolates: C = 1e+20 is outside looped's fitted "
                                    "budgets 1e+18-2.15e+19")
    assert "base" not in beyond.extrapolation
    below = compare_pair(base, looped, target_compute=1e17)
    assert "base's fitted budgets" in below.extrapolation
    assert "looped's fitted budgets" in below.extrapolation
    assert compare_pair(base, looped, target_compute=5e18).extrapolation is None
    # A target loss: each family's compute for it on its own pure law must lie in its range.
    inside = compare_pair(base, looped, target_loss=float(pure_loss(base.isoflop, 5e18)))
    assert inside.target == "loss" and inside.extrapolation is None
    far = compare_pair(base, looped, target_loss=float(pure_loss(base.isoflop, 1.5e19)))
    # base needs 1.5e19 (inside), looped about 1.8 x that (beyond its 2.15e19)
    assert far.extrapolation.startswith("extrapolates: C = ")
    assert "looped's fitted budgets" in far.extrapolation and "base" not in far.extrapolation


@pytest.mark.parametrize("n_bad, identified", [(33, False), (30, True)])
def test_a_multiplier_failing_in_over_a_tenth_of_resamples_is_not_identified(n_bad, identified):
    # 300 paired resamples; in n_bad of them the other family's pure law has no exponent
    # (alpha NaN) or a zero one (its compute for any lower loss is inf): the multiplier is
    # non-finite there. 33 of 300 is 11%, 30 is 10%.
    rng = np.random.default_rng(0)
    ref_samples = {"A": 60.0 * np.exp(rng.normal(0, 0.02, 300)),
                   "alpha": 0.08 + rng.normal(0, 0.002, 300)}
    other_alpha = 0.08 + rng.normal(0, 0.002, 300)
    other_alpha[:n_bad:2] = np.nan
    other_alpha[1:n_bad:2] = 0.0
    other_samples = {"A": 66.0 * np.exp(rng.normal(0, 0.02, 300)), "alpha": other_alpha}
    ref = FamilyFigures("base", 1e20, isoflop=iso(60.0, 0.08), isoflop_samples=ref_samples)
    other = FamilyFigures("looped", 1e20, isoflop=iso(66.0, 0.08),
                          isoflop_samples=other_samples)
    result = compare_pair(ref, other)
    assert result.compute_multiplier.value == pytest.approx(1.1 ** (1 / 0.08))
    samples = other_alpha  # the paired multipliers are non-finite exactly where alpha is bad
    assert np.sum(~np.isfinite(samples) | (samples == 0)) == n_bad
    doc = result.to_json()
    if identified:
        low, high = result.compute_multiplier.ci
        assert low < result.compute_multiplier.value < high
        assert result.compute_multiplier.reason is None
        assert doc["not_identified"] == {}
    else:
        assert result.compute_multiplier.ci is None
        why = "not identified (11% of refits failed)"
        assert result.compute_multiplier.reason == why
        assert doc["compute_multiplier_ci"] is None
        assert doc["not_identified"] == {"compute_multiplier": why}
    # the point value stays; figures with no point value (no E, no A_U given) carry no reason
    assert np.isfinite(doc["compute_multiplier"])
    assert doc["compute_multiplier_saturating_ci"] is None
    assert "compute_multiplier_saturating" not in doc["not_identified"]


def test_not_identified_multiplier_reason_names_the_share():
    # 40 of 200 resamples of the reference with alpha NaN: 20%.
    rng = np.random.default_rng(1)
    alpha = 0.08 + rng.normal(0, 0.002, 200)
    alpha[:40] = np.nan
    samples = {"A": 60.0 * np.exp(rng.normal(0, 0.02, 200)), "alpha": alpha}
    ref = FamilyFigures("base", 1e20, isoflop=iso(60.0, 0.08), isoflop_samples=samples)
    other = FamilyFigures("looped", 1e20, isoflop=iso(66.0, 0.08),
                          isoflop_samples={"A": samples["A"] * 1.1,
                                           "alpha": 0.08 + rng.normal(0, 0.002, 200)})
    doc = compare_pair(ref, other, target_loss=2.5).to_json()
    assert doc["not_identified"] == {
        "compute_multiplier": "not identified (20% of refits failed)"}
    assert doc["compute_multiplier_ci"] is None and doc["compute_multiplier"] > 1


def test_a_negative_exponent_counts_as_a_failed_resample():
    # compare.py: "Resamples with a degenerate fit (an exponent <= 0, an unreachable target)
    # give inf or NaN here". With alpha < 0 in 20% of the other family's resamples, C(L) =
    # (A / L)^(1/alpha) would be finite (about 1e-33 here), and the multiplier kept an interval
    # of [2.7e-54, 30.2] around its x3.29 until such a law counted as reaching no target.
    rng = np.random.default_rng(0)
    other_alpha = 0.08 + rng.normal(0, 0.002, 100)
    other_alpha[:20] = -0.05
    ref = FamilyFigures("base", 1e20, isoflop=iso(60.0, 0.08),
                        isoflop_samples={"A": np.full(100, 60.0),
                                         "alpha": 0.08 + rng.normal(0, 0.002, 100)})
    other = FamilyFigures("looped", 1e20, isoflop=iso(66.0, 0.08),
                          isoflop_samples={"A": np.full(100, 66.0), "alpha": other_alpha})
    result = compare_pair(ref, other)
    assert result.compute_multiplier.ci is None
    assert result.compute_multiplier.reason == "not identified (20% of refits failed)"
