"""Chinchilla approach 2: budgets, per-budget minima, edge flags, power laws, intervals."""

import numpy as np
import pandas as pd
import pytest

from loopscale import checkout
from loopscale.scaling.isoflop import (
    assign_budgets,
    bootstrap_isoflop,
    find_minima,
    find_minimum,
    fit_isoflop,
)

PORIAN = str(checkout.reference_table(checkout.PORIAN_POINTS))
PORIAN_OPTIMA = str(checkout.reference_table(checkout.PORIAN_OPTIMA))
ALPHA, BETA = 0.34, 0.30
A_TRUE = BETA / (ALPHA + BETA)  # N_opt ~ C^a under L = E + A/N^alpha + B/D^beta
GAMMA = ALPHA * BETA / (ALPHA + BETA)  # L_opt - E ~ C^-gamma


def isoflop_runs(E=1.7, noise=0.001, seed=0):
    """6 budgets, 9 sizes each, +-0.6 dex around the true optimum."""
    rng = np.random.default_rng(seed)
    A, B = 400.0, 1500.0
    G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    rows = []
    for c in np.logspace(18, 21, 6):
        for n in G * (c / 6) ** A_TRUE * np.logspace(-.6, .6, 9):
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
    assert fit.n_used == 5
    assert fit.laws.a == pytest.approx(A_TRUE, abs=0.01)


def test_lowest_loss_at_an_end_size_is_an_edge_too():
    n = np.logspace(8, 9, 5)
    loss = np.array([3.0, 3.01, 3.05, 3.12, 3.2])  # still falling at the smallest size
    m = find_minimum(1e19, n, 1e19 / (6 * n), loss)
    assert m.on_edge and not m.used


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
