"""Chinchilla approach 3: the published replication, synthetic recovery, the allocation,
grid-searched bootstrap refits, bounds on E, goodness of fit."""

import dataclasses

import numpy as np
import pytest
from scipy.optimize import check_grad, lsq_linear

from loopscale import checkout
from loopscale.bench.fit_time import chinchilla_points
from loopscale.scaling import FitError
from loopscale.scaling.bootstrap import design, resample
from loopscale.scaling.parametric import (
    EXPONENT_GRID,
    _Objective,
    _profile,
    bootstrap_parametric,
    fit_parametric,
    grid_starts,
    varpro_starts,
)

CHINCHILLA = str(checkout.reference_table(checkout.CHINCHILLA))
# Besiroglu et al. 2024: their notebook's grid-protocol fit, and their paper's estimates.
PROTOCOL = {"E": 1.8172, "A": 477.8, "B": 2143.9, "alpha": 0.3473, "beta": 0.3672}
PAPER = {"E": 1.82, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}


def chinchilla():
    """N, D, L of the 240 runs Besiroglu et al. fit (the five highest losses dropped)."""
    return chinchilla_points(CHINCHILLA)


@pytest.fixture(scope="module")
def chinchilla_fit():
    n, d, loss = chinchilla()
    return fit_parametric(n, d, loss), (n, d, loss)  # the full 4,500-start Hoffmann grid


def test_chinchilla_grid_protocol_reproduces_the_replication(chinchilla_fit):
    fit, (n, _, _) = chinchilla_fit
    assert n.size == 240 and fit.n_starts == 4500 and fit.e_bounds == (None, None)
    # to the notebook's printed digits (alpha 0.34731, beta 0.36717, E 1.81722 here)
    assert abs(fit.alpha - PROTOCOL["alpha"]) < 1e-4
    assert abs(fit.beta - PROTOCOL["beta"]) < 1e-4
    assert abs(fit.E - PROTOCOL["E"]) < 1e-4
    assert fit.A == pytest.approx(PROTOCOL["A"], rel=1e-3)
    assert fit.B == pytest.approx(PROTOCOL["B"], rel=1e-3)
    # goodness of fit: nats, the lack-of-fit interval symmetric around the law
    assert 0.0 < fit.residual_sd < 0.1
    low, high = fit.lack_of_fit
    assert low == -high and 1.5 * fit.residual_sd < high < 2.0 * fit.residual_sd


def test_chinchilla_bootstrap_intervals_cover_the_paper(chinchilla_fit):
    fit, (n, d, loss) = chinchilla_fit
    boot = bootstrap_parametric(fit, n, d, loss, 150, np.random.default_rng(0))
    assert boot.n_failed == 0
    for name, value in PAPER.items():
        low, high = boot.interval(name)
        assert low < value < high, (name, low, high)
    # The paper's 95% intervals are alpha 0.317-0.373 and beta 0.331-0.415. Refits that stop
    # early at their warm start give far narrower ones (alpha ~0.035 wide); guard against it.
    assert np.subtract(*boot.interval("alpha")[::-1]) > 0.04
    assert np.subtract(*boot.interval("beta")[::-1]) > 0.06


TRUE = {"E": 1.7, "A": 400.0, "B": 1500.0, "alpha": 0.34, "beta": 0.30}


def synthetic(noise=0.002, seed=0, additive=False):
    """Runs on IsoFLOP-like grids around the true optimum, multiplicative noise on L (or
    additive Gaussian noise of sd `noise` nats)."""
    rng = np.random.default_rng(seed)
    t = TRUE
    G = (t["alpha"] * t["A"] / (t["beta"] * t["B"])) ** (1 / (t["alpha"] + t["beta"]))
    rows = []
    for c in np.logspace(18, 21, 6):
        for n in G * (c / 6) ** (t["beta"] / (t["alpha"] + t["beta"])) * np.logspace(-.6, .6, 9):
            d = c / (6 * n)
            loss = t["E"] + t["A"] * n ** -t["alpha"] + t["B"] * d ** -t["beta"]
            eps = rng.normal(0, noise)
            rows.append((n, d, loss + eps if additive else loss * np.exp(eps)))
    return np.array(rows).T


@pytest.fixture(scope="module")
def synthetic_fit():
    n, d, loss = synthetic()
    return fit_parametric(n, d, loss, grid_starts("small")), (n, d, loss)


def test_recovers_known_law_from_noisy_synthetic_runs(synthetic_fit):
    fit, (n, d, loss) = synthetic_fit
    assert fit.alpha == pytest.approx(TRUE["alpha"], abs=0.01)
    assert fit.beta == pytest.approx(TRUE["beta"], abs=0.01)
    assert fit.E == pytest.approx(TRUE["E"], abs=0.03)
    boot = bootstrap_parametric(fit, n, d, loss, 60, np.random.default_rng(1))
    for name, value in TRUE.items():
        low, high = boot.interval(name)
        assert low < value < high, (name, low, high)


def test_compute_optimal_allocation_minimises_the_fitted_loss():
    n, d, loss = synthetic(noise=0.0)
    fit = fit_parametric(n, d, loss, grid_starts("small"))
    c = 3e20
    sizes = np.logspace(6, 12, 20001)
    best = sizes[np.argmin(fit.predict(sizes, c / (6 * sizes)))]
    n_opt, d_opt = fit.compute_optimal(c)
    assert n_opt == pytest.approx(best, rel=2e-3)
    assert 6 * n_opt * d_opt == pytest.approx(c)
    assert fit.a + fit.b == pytest.approx(1.0)


def test_objective_gradient_is_exact():
    n, d, loss = synthetic()
    objective = _Objective(n, d, loss, delta=1e-3)
    for theta in ([6.0, 7.3, 0.5, 0.34, 0.3], [2.0, 9.0, -0.5, 0.2, 0.5]):
        err = check_grad(lambda t: objective(t)[0], lambda t: objective(t)[1],
                         np.array(theta), epsilon=1e-7)
        assert err < 1e-6 * max(1.0, np.abs(objective(np.array(theta))[1]).max())


def test_hoffmann_grid_is_the_published_4500_starts():
    grid = grid_starts()
    assert grid.shape == (4500, 5)
    assert sorted(set(grid[:, 3])) == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert sorted(set(grid[:, 0])) == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]


def test_too_few_runs_is_a_fit_error():
    with pytest.raises(FitError):
        fit_parametric(np.array([1e6, 2e6]), np.array([1e9, 2e9]), np.array([3.0, 2.9]))


def test_no_allocation_when_an_exponent_comes_out_negative():
    """Runs where bigger models do worse: the unbounded fit gives alpha <= 0, and the allocation
    figures are NaN (null in fit.json) instead of a complex power or a crash."""
    rng = np.random.default_rng(1)
    n = np.repeat(np.logspace(6, 8, 5), 4)
    d = np.tile(np.logspace(9, 11, 4), 5)
    loss = (2.0 + 1e-3 * n ** 0.25 + 300.0 / d ** 0.3) * np.exp(rng.normal(0, 1e-3, n.size))
    fit = fit_parametric(n, d, loss, starts=grid_starts("small"))
    assert fit.alpha <= 0 < fit.beta
    figures = fit.figures()
    assert all(np.isnan(figures[k]) for k in ("G", "a", "b"))
    assert np.isfinite([figures[k] for k in ("E", "A", "B", "alpha", "beta")]).all()
    assert np.isnan(fit.frontier(np.array([1e18]))).all()


def test_bootstrap_refits_search_the_grid_where_warm_starts_miss_the_basin(synthetic_fit):
    """A full fit whose warm starts all lie in a wrong basin: a refit from them alone (the old
    protocol) ends there, far worse than a direct grid fit of the same resample; the
    bootstrap's grid-searched refits give the direct fit's figures, the same as from the right
    warm starts, and the same samples again given the same seed."""
    fit, (n, d, loss) = synthetic_fit
    # beta 2 with B = e^12: B / D^beta is at most ~1e-13 of the loss at these D, so L-BFGS-B
    # has next to no gradient to leave the basin by (beta stayed at 2.000 on both resamples on
    # an AMD EPYC, where at beta 1.2 one resample escaped; it was stuck on the machine the test
    # was written on).
    wrong = dataclasses.replace(fit, warm_starts=((0.0, 12.0, 1.0, 0.05, 2.0),))
    boot = bootstrap_parametric(wrong, n, d, loss, 2, np.random.default_rng(5))
    again = bootstrap_parametric(fit, n, d, loss, 2, np.random.default_rng(5))
    rerun = bootstrap_parametric(wrong, n, d, loss, 2, np.random.default_rng(5))
    np.testing.assert_array_equal(boot.samples["alpha"], rerun.samples["alpha"])
    rng, plan = np.random.default_rng(5), design(n.size)
    for k in range(2):
        idx = resample(rng, plan)
        direct = fit_parametric(n[idx], d[idx], loss[idx], grid_starts("small"))
        stuck = fit_parametric(n[idx], d[idx], loss[idx], np.array(wrong.warm_starts),
                               tight=True)
        assert stuck.objective > 10 * direct.objective
        for name in ("E", "A", "B", "alpha", "beta"):
            assert boot.samples[name][k] == pytest.approx(getattr(direct, name), rel=1e-4)
            assert boot.samples[name][k] == pytest.approx(again.samples[name][k], rel=1e-6)


def test_variable_projection_is_exact_bounded_least_squares():
    """The profile over the (alpha, beta) grid is the 1/L^2-weighted least squares of
    (E, A, B) with A, B >= 0 and E in its bounds (>= 0 when open), as scipy solves it."""
    n, d, loss = synthetic()
    w = 1 / loss
    rng = np.random.default_rng(0)
    for bounds in ((None, None), (1.75, None), (None, 1.6), (1.5, 1.6), (1.7, 1.7)):
        sse, E, A, B = _profile(n, d, loss, bounds)
        low = 0.0 if bounds[0] is None else bounds[0]
        high = np.inf if bounds[1] is None else bounds[1]
        for i, j in rng.integers(0, EXPONENT_GRID.size, size=(8, 2)):
            cols = np.stack([np.ones_like(n), n ** -EXPONENT_GRID[i], d ** -EXPONENT_GRID[j]], 1)
            scale = np.linalg.norm(cols * w[:, None], axis=0)
            x = cols * w[:, None] / scale
            lo, hi = np.array([low, 0, 0]) * scale, np.array([high, np.inf, np.inf]) * scale
            if low == high:
                lo[0], hi[0] = lo[0] * (1 - 1e-15), hi[0] * (1 + 1e-15)
            ref = lsq_linear(x, loss * w, bounds=(lo, hi), method="bvls", tol=1e-14)
            assert sse[i, j] == pytest.approx(np.sum((x @ ref.x - loss * w) ** 2), rel=1e-6)
            assert low <= E[i, j] <= high and A[i, j] >= 0 and B[i, j] >= 0
        e = np.exp(varpro_starts(n, d, loss, bounds)[:, 2])
        assert np.all((low * (1 - 1e-12) <= e) & (e <= high * (1 + 1e-12)))


def test_e_bounds_fix_or_cap_the_irreducible_loss(synthetic_fit):
    free, (n, d, loss) = synthetic_fit
    fixed = fit_parametric(n, d, loss, grid_starts("small"), e_bounds=(1.7, 1.7))
    assert fixed.E == 1.7 and fixed.e_bounds == (1.7, 1.7)
    assert fixed.n_starts == len(grid_starts("small")) // 3  # e leaves the search
    assert fixed.objective >= free.objective
    assert fixed.alpha == pytest.approx(TRUE["alpha"], abs=0.02)
    assert all(w[2] == np.log(1.7) for w in fixed.warm_starts)
    cap = 0.9 * free.E  # below the unbounded optimum: E ends on it
    capped = fit_parametric(n, d, loss, varpro_starts(n, d, loss, (None, cap)), tight=True,
                            e_bounds=(None, cap))
    assert capped.E == cap and capped.objective > free.objective
    boot = bootstrap_parametric(fixed, n, d, loss, 3, np.random.default_rng(2))
    assert boot.n_failed == 0 and np.all(boot.samples["E"] == 1.7)
    boot = bootstrap_parametric(free, n, d, loss, 3, np.random.default_rng(2),
                                e_bounds=(None, cap))
    assert np.all(boot.samples["E"] <= cap)


@pytest.mark.parametrize("bounds", [(2.0, 1.0), (0.0, None), (None, -1.0), (None, np.nan),
                                    (1.0,), "E"])
def test_inconsistent_e_bounds_are_a_fit_error(bounds):
    n, d, loss = synthetic()
    with pytest.raises(FitError):
        fit_parametric(n, d, loss, grid_starts("small")[:1], e_bounds=bounds)


def test_residual_sd_and_lack_of_fit_measure_the_noise():
    """Additive Gaussian noise of sd 0.01 nats: residual_sd recovers it, and the 90%
    lack-of-fit interval holds about 90% of the runs."""
    s = 0.01
    n, d, loss = synthetic(noise=s, seed=3, additive=True)
    fit = fit_parametric(n, d, loss, grid_starts("small"))
    assert fit.residual_sd == pytest.approx(s, rel=0.2)
    low, high = fit.lack_of_fit
    assert low == -high and high == pytest.approx(1.68 * s, rel=0.2)
    inside = np.mean(np.abs(loss - fit.predict(n, d)) <= high)
    assert 0.8 <= inside <= 0.98
