"""Chinchilla approach 2: budgets, per-budget minima, edge flags, power laws, intervals; where
each minimum sits in its grid, the other estimator beside it, and the 6n_attn refit."""

import numpy as np
import pandas as pd
import pytest

from loopscale import checkout
from loopscale.scaling.budget_minima import Edge
from loopscale.scaling.isoflop import (
    assign_budgets,
    bootstrap_isoflop,
    estimator_choice,
    find_minima,
    find_minimum,
    fit_isoflop,
    refit_under_convention,
)

PORIAN = str(checkout.reference_table(checkout.PORIAN_POINTS))
PORIAN_OPTIMA = str(checkout.reference_table(checkout.PORIAN_OPTIMA))
ALPHA, BETA = 0.34, 0.30
A_TRUE = BETA / (ALPHA + BETA)  # N_opt ~ C^a under L = E + A/N^alpha + B/D^beta
GAMMA = ALPHA * BETA / (ALPHA + BETA)  # L_opt - E ~ C^-gamma


def isoflop_runs(E=1.7, noise=0.001, seed=0, width=0.6, shift=0.0):
    """6 budgets, 9 sizes each, +-`width` dex around the true optimum moved by `shift` dex."""
    rng = np.random.default_rng(seed)
    A, B = 400.0, 1500.0
    G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    rows = []
    for c in np.logspace(18, 21, 6):
        for n in G * (c / 6) ** A_TRUE * np.logspace(shift - width, shift + width, 9):
            d = c / (6 * n)
            rows.append((c, n, d, (E + A * n ** -ALPHA + B * d ** -BETA)
                         * np.exp(rng.normal(0, noise))))
    return np.array(rows).T


def test_budgets_group_flops_within_the_tolerance():
    flops = np.array([1e18, 1.02e18, 0.98e18, 1e19, 1.01e19, 3e18])
    budgets = assign_budgets(flops)
    assert len(set(budgets[:3])) == 1 and len(set(budgets[3:5])) == 1
    assert len(set(budgets)) == 3
    assert budgets[0] == pytest.approx(1e18, rel=0.02)


def test_recovers_allocation_and_frontier_exponents():
    c, n, d, loss = isoflop_runs()
    fit = fit_isoflop(c, n, d, loss)
    assert fit.n_used == 6
    assert fit.laws.a == pytest.approx(A_TRUE, abs=0.01)
    assert fit.laws.b == pytest.approx(1 - A_TRUE, abs=0.01)
    assert fit.laws.alpha_E == pytest.approx(GAMMA, abs=0.01)
    assert fit.laws.E == pytest.approx(1.7, abs=0.05)
    boot = bootstrap_isoflop(fit, c, n, d, loss, None, 100, np.random.default_rng(0))
    assert boot.n_failed == 0
    low, high = boot.interval("a")
    assert low < A_TRUE < high


def test_without_irreducible_loss_the_pure_laws_are_exact():
    # With E = 0, L_opt = K C^-gamma and L_opt ~ N_opt^-alpha: the study's alpha_N is alpha.
    c, n, d, loss = isoflop_runs(E=0.0)
    laws = fit_isoflop(c, n, d, loss).laws
    assert laws.alpha == pytest.approx(GAMMA, abs=0.005)
    assert laws.alpha_N == pytest.approx(ALPHA, abs=0.01)


def test_edge_minima_are_flagged_and_left_out():
    c, n, d, loss = isoflop_runs()
    # The largest budget's grid stops short of its optimum: every size is too small.
    last = c == c.max()
    n[last] /= 10 ** 0.9
    d[last] *= 10 ** 0.9
    loss[last] = 1.7 + 400 * n[last] ** -ALPHA + 1500 * d[last] ** -BETA
    fit = fit_isoflop(c, n, d, loss)
    edge = [m for m in fit.minima if m.on_edge]
    assert [m.budget for m in edge] == [c.max()]
    assert not edge[0].used and "edge" in edge[0].reason
    assert edge[0].edge is Edge.LARGEST  # every size too small: the optimum lies beyond
    assert fit.n_used == 5
    assert fit.laws.a == pytest.approx(A_TRUE, abs=0.01)


def test_lowest_loss_at_an_end_size_is_an_edge_too():
    n = np.logspace(8, 9, 5)
    loss = np.array([3.0, 3.01, 3.05, 3.12, 3.2])  # still falling at the smallest size
    m = find_minimum(1e19, n, 1e19 / (6 * n), loss)
    assert m.on_edge and not m.used and m.edge is Edge.SMALLEST


def test_non_convex_budget_is_not_used():
    n = np.logspace(8, 9, 5)
    m = find_minimum(1e19, n, 1e19 / (6 * n), np.array([3.0, 3.2, 3.3, 3.2, 3.0]))
    assert not m.used and "convex" in m.reason


def test_weighted_fit_records_spreads_and_agrees():
    c, n, d, loss = isoflop_runs(noise=0.003)
    fit = fit_isoflop(c, n, d, loss, weighted=True, rng=np.random.default_rng(0))
    assert all(m.sd_log_params > 0 for m in fit.minima)
    assert fit.laws.a == pytest.approx(A_TRUE, abs=0.03)


def test_unique_parameters_at_the_optimum():
    c, n, d, loss = isoflop_runs()
    fit = fit_isoflop(c, n, d, loss, unique=n / 2)  # a 2-loop model stores half its params
    for m in fit.minima:
        assert m.params_unique_opt == pytest.approx(m.params_opt / 2)
    assert fit.laws.alpha_U == pytest.approx(fit.laws.alpha_N)


def test_spline_minima_match_porian_et_al_optima():
    points, optima = pd.read_csv(PORIAN), pd.read_csv(PORIAN_OPTIMA)
    checked = 0
    for (source, row), runs in points.groupby(["source", "row"]):
        ref = optima[(optima.source == source) & (optima.row == row)].set_index("flops")
        minima = find_minima(runs.flops.to_numpy(), runs.n.to_numpy(), runs.t.to_numpy(),
                             runs.loss.to_numpy(), spline=True)
        for m in minima:
            if m.used and m.budget in ref.index and np.isfinite(ref.n_star[m.budget]):
                assert abs(np.log10(m.params_opt / ref.n_star[m.budget])) < 0.1, (source, m)
                checked += 1
    assert checked > 150


def test_centring_says_where_the_minimum_sits_in_the_grid():
    def budget(low, high):  # an exact parabola in ln N with its minimum at N = 1e8
        n = 1e8 * np.logspace(low, high, 11)
        return find_minimum(1e19, n, 1e19 / (6 * n), 3.0 + 0.05 * np.log(n / 1e8) ** 2,
                            alternative=True)

    centred = budget(-0.5, 0.5)
    assert centred.centring == pytest.approx(0.5, abs=1e-9)
    assert centred.grid_dex == pytest.approx(1.0)
    for low, expected in ((-0.1, 0.1), (-0.9, 0.9)):  # 0.1 dex above / below an end size
        m = budget(low, low + 1.0)
        assert m.used and m.centring == pytest.approx(expected, abs=1e-9)
        assert m.alt.centring == pytest.approx(expected, abs=0.01)  # the spline's


def test_the_other_estimator_sits_beside_each_minimum():
    c, n, d, loss = isoflop_runs()
    fits = {}
    for spline in (False, True):
        fit = fits[spline] = fit_isoflop(c, n, d, loss, spline=spline)
        assert fit.alt_method == ("parabola" if spline else "spline")
        for m in fit.minima:
            own = c == m.budget
            direct = find_minimum(m.budget, n[own], d[own], loss[own], spline=not spline)
            assert m.alt_method == direct.method == fit.alt_method
            assert m.alt_params_opt == direct.params_opt
            assert m.alt_loss_opt == direct.loss_opt
    # The laws through the other minima are the laws of the other choice.
    for spline in (False, True):
        alt, other = fits[spline].alt_laws.figures(), fits[not spline].laws.figures()
        assert np.allclose(list(alt.values()), list(other.values()), equal_nan=True, rtol=1e-12)
    assert fits[True].laws.a == pytest.approx(A_TRUE, abs=0.01)
    # Four sizes: no spline beside the parabola.
    few = find_minimum(1e19, n[:4], d[:4], loss[:4], alternative=True)
    assert few.alt_method == "spline" and few.alt is None and np.isnan(few.alt_params_opt)


def test_estimator_choice_warns_when_the_parabola_is_likely_biased():
    centred = fit_isoflop(*isoflop_runs(width=0.4))  # 0.8 dex, centred: no warning
    method, reason = estimator_choice(centred)
    assert method == "parabola" and "Chinchilla" in reason and "\n" not in reason
    off = fit_isoflop(*isoflop_runs(width=0.4, shift=0.3))  # centring 0.125
    method, reason = estimator_choice(off)
    assert method == "parabola" and "off-centre" in reason and "wide" not in reason
    assert f"{off.laws.a:.4f}" in reason and f"{off.alt_laws.a:.4f}" in reason
    _, reason = estimator_choice(fit_isoflop(*isoflop_runs()))  # 1.2 dex, centred
    assert "wide" in reason and "off-centre" not in reason
    method, reason = estimator_choice(fit_isoflop(*isoflop_runs(width=0.4, shift=0.3),
                                                  spline=True))
    assert method == "spline" and "\n" not in reason


def test_refit_under_the_attention_convention():
    c, n, d, loss = isoflop_runs()
    fit = fit_isoflop(c, n, d, loss)
    flops_attn = c * (1 + 1000 / np.sqrt(n))  # attention's share: 47% at the smallest N
    laws, why = refit_under_convention(fit, c, n, flops_attn)
    assert why is None
    # More compute counted at small N: ln C grows slower across budgets, the exponents rise.
    assert laws.a > fit.laws.a + 0.005 and laws.b > fit.laws.b and laws.alpha > fit.laws.alpha
    assert laws.alpha_N == pytest.approx(fit.laws.alpha_N, rel=1e-9)  # L vs N: unchanged
    # The same as a line through each budget's attention compute at its optimum.
    c_opt, n_opt = [], []
    for m in fit.minima:
        own = c == m.budget
        x = np.log(n[own])  # one run per size, in increasing size
        c_opt.append(np.interp(np.log(m.params_opt), x, np.log(flops_attn[own])))
        n_opt.append(np.log(m.params_opt))
    assert laws.a == pytest.approx(np.polyfit(c_opt, n_opt, 1)[0], abs=1e-8)
    flops_attn[0] = np.nan
    laws, why = refit_under_convention(fit, c, n, flops_attn)
    assert laws is None and "1 of 9 runs" in why
