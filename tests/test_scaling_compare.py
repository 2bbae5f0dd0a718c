"""Family comparison: compute multipliers and unique-parameter savings with known answers."""

import numpy as np
import pytest

from loopscale.scaling.compare import FamilyFigures, compare_pair, exponents_side_by_side


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
