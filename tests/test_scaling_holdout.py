"""The held-out budget check (scaling/holdout.py, `loopscale fit --holdout`): which budget is
held out, the prediction against the budget's own minimum on Chinchilla's runs and on a known
law, and the families that cannot carry a law on the remaining budgets."""

import math

import numpy as np
import pandas as pd
import pytest

from loopscale import checkout
from loopscale.errors import UsageError
from loopscale.scaling import FitError
from loopscale.scaling import holdout as ho
from loopscale.scaling import parametric as par
from loopscale.scaling import table as tbl
from loopscale.scaling.budget_minima import find_minima
from loopscale.scaling.fit import FitOptions, fit_results, to_json
from loopscale.scaling.runs import FamilyRuns
from test_scaling_isoflop import isoflop_runs

CHINCHILLA = checkout.reference_table(checkout.CHINCHILLA)
HOLDOUT_KEYS = {"predicted_loss", "observed_loss", "error", "error_ci", "predicted_n_opt",
                "observed_n_opt"}


def chinchilla_table() -> tbl.ResultsTable:
    """The published runs as `loopscale fit` reads them (tests/test_report.py's table): N =
    Model Size, C = Training FLOP, D = C / 6N."""
    df = pd.read_csv(CHINCHILLA)
    n, c = df["Model Size"], df["Training FLOP"]
    return tbl.prepare_table(pd.DataFrame({"params": n, "tokens": c / (6 * n), "flops": c,
                                           "loss": df["loss"]}), source="chinchilla.csv")


@pytest.fixture(scope="module")
def chinchilla():
    if not CHINCHILLA.exists():
        pytest.skip(f"{CHINCHILLA} not present")
    return fit_results(chinchilla_table(),
                       FitOptions(bootstrap=50, grid="small", holdout="largest"))


def test_chinchilla_holds_out_the_largest_budget_with_a_usable_minimum(chinchilla):
    (fam,) = chinchilla.families
    (h,) = chinchilla.holdouts
    used = [m.budget for m in fam.isoflop.minima if m.used]
    # the largest budget whose grid brackets a minimum: not the table's largest (up to 1.3e22,
    # budgets of one or two sizes)
    assert chinchilla.holdout_budget == h.budget == max(used)
    assert h.budget == pytest.approx(9.9e20, rel=0.01)
    assert fam.runs.budgets.max() > 10 * h.budget
    assert h.reason is None and h.observed.used
    assert h.train_budgets and max(h.train_budgets) < h.budget
    assert h.budget not in h.train_budgets
    # Measured (small grid, 50 resamples): predicted 2.264, observed 2.294, error -0.030
    # [-0.050, -0.017]; saturating law +0.001 [-0.016, 0.015]; ln N_opt +0.16 [-0.03, 0.25]
    # (with the hoffmann grid and 100 resamples: -0.030 [-0.051, -0.018]).
    f = h.figures()
    assert abs(f["predicted_loss"] - f["observed_loss"]) < 0.1
    assert f["error"] == pytest.approx(f["predicted_loss"] - f["observed_loss"], abs=1e-12)
    assert f["error_saturating"] == pytest.approx(
        f["predicted_loss_saturating"] - f["observed_loss"], abs=1e-12)
    assert f["error_log_n_opt"] == pytest.approx(
        math.log(f["predicted_n_opt"]) - math.log(f["observed_n_opt"]), abs=1e-9)
    assert f["observed_loss"] == h.observed.loss_opt
    low, high = h.boot.interval("error")
    assert math.isfinite(low) and math.isfinite(high) and low < f["error"] < high
    assert h.boot.n_failed == 0
    # Dozens of smaller budgets have one or two runs and no minimum: pooled in one stratum
    # (they count for approach 3), they leave the minima's budgets stratified.
    assert h.boot.design.stratified
    assert h.boot.interval("error_parametric") is not None


def test_chinchilla_holdout_in_fit_json(chinchilla):
    doc = to_json(chinchilla)
    assert doc["options"]["holdout"] == "largest"
    h = doc["holdout"]
    assert h["budget"] == pytest.approx(9.9e20, rel=0.01) and h["spec"] == "largest"
    entry = h["families"]["all"]
    assert HOLDOUT_KEYS <= set(entry)
    assert entry["error"] == pytest.approx(entry["predicted_loss"] - entry["observed_loss"])
    low, high = entry["error_ci"]
    assert low < entry["error"] < high
    assert abs(entry["error"]) < 0.1
    for key in ("predicted_loss", "observed_loss", "predicted_n_opt", "observed_n_opt"):
        assert entry[key] > 0 and len(entry[f"{key}_ci"]) == 2
    assert entry["not_identified"] == {} and entry["skipped"] is None
    assert entry["observed_reason"] is None
    assert all(b < h["budget"] for b in entry["train_budgets"])
    assert entry["bootstrap"]["resamples"] == 50 and entry["bootstrap"]["resampling"] == "runs"


# --- a known law -------------------------------------------------------------------------


def family_runs_of(c, n, d, loss, name="all", clusters=None):
    labels = np.array([f"{name}-{i}" for i in range(c.size)], dtype=object)
    return FamilyRuns(name=name, params=n, tokens=d, loss=loss, flops=c, unique=None,
                      budgets=c, clusters=labels if clusters is None else clusters,
                      flops_attn=None)


def holdout_of(runs, budget, n_resamples=100):
    return ho.fit_holdout(runs, budget, spline=False, weighted=False, grid="small",
                          huber_delta=par.HUBER_DELTA, e_bounds=None,
                          n_resamples=n_resamples, rng_weights=np.random.default_rng(0),
                          rng_boot=np.random.default_rng(1), level=0.95)


def test_a_law_without_irreducible_loss_predicts_the_held_out_budget():
    # L = A/N^alpha + B/D^beta (E = 0): L_opt = K C^-gamma exactly, and the parabola's offset
    # from the true minimum is the same at every budget, so the pure law fitted on 5 budgets
    # (1e18 ... 2.5e20) predicts the 1e21 minimum. Measured: error -0.0004 nats
    # [-0.0018, 0.0007]; ln N_opt -0.008.
    c, n, d, loss = isoflop_runs(E=0.0, noise=0.001)
    h = holdout_of(family_runs_of(c, n, d, loss), c.max())
    assert h.reason is None and len(h.train_budgets) == 5 and h.budget == c.max()
    f = h.figures()
    assert abs(f["error"]) < 0.003  # nats, on a loss of 0.97
    assert abs(f["error_saturating"]) < 0.005
    assert abs(f["error_log_n_opt"]) < 0.03
    assert abs(f["error_parametric"]) < 0.005
    low, high = h.boot.interval("error")
    assert low < 0.0 < high and high - low < 0.01
    assert h.boot.n_failed == 0 and h.boot.design.stratified


def test_a_saturating_frontier_shows_the_pure_law_cannot_extrapolate():
    # With E = 1.7 the pure power law bends away from the frontier and under-predicts the held
    # -out loss, while the saturating law predicts it. Measured: pure -0.110 [-0.114, -0.107],
    # saturating +0.002 [-0.006, 0.008].
    c, n, d, loss = isoflop_runs(E=1.7, noise=0.001)
    h = holdout_of(family_runs_of(c, n, d, loss), c.max())
    f = h.figures()
    assert -0.15 < f["error"] < -0.05
    low, high = h.boot.interval("error")
    assert high < 0.0
    assert abs(f["error_saturating"]) < 0.01
    low, high = h.boot.interval("error_saturating")
    assert low < 0.0 < high


# --- the parametric prediction's interval --------------------------------------------------


def test_the_parametric_prediction_has_an_interval_from_the_same_resamples():
    # A known law L = E + A/N^alpha + B/D^beta (isoflop_runs) with 0.5% noise: approach 3 is
    # the true form, so its error interval covers 0. Measured (30 resamples): error +0.0004
    # [-0.021, 0.014], predicted L_opt 2.669 [2.646, 2.682], no refit failed.
    c, n, d, loss = isoflop_runs(E=1.7, noise=0.005, seed=3)
    h = holdout_of(family_runs_of(c, n, d, loss), c.max(), n_resamples=30)
    f = h.figures()
    for name in ("error_parametric", "predicted_loss_parametric"):
        low, high = h.boot.interval(name)
        assert low < f[name] < high
        assert h.boot.failure_share(name) == 0.0
    low, high = h.boot.interval("error_parametric")
    assert low < 0.0 < high and high - low < 0.1
    # one design: every resample carries both predictions
    assert h.boot.samples["error_parametric"].size == h.boot.samples["error"].size == 30
    assert h.boot.n_failed == 0


@pytest.mark.slow
def test_the_parametric_error_interval_covers_at_about_the_nominal_rate():
    # 20 tables of the known law (0.5% noise), 30 resamples each: how often the 95% interval
    # of error_parametric holds its value on the noise-free table (the estimand: that error is
    # not exactly 0, the held-out parabola's offset from the frontier, +0.0002 here). With
    # 30 resamples the percentile interval is rough, so the bound is loose: at least 14 of 20
    # (nominal 19). Measured: 18 of 20. ~30 s on two cores.
    c, n, d, loss = isoflop_runs(E=1.7, noise=0.0)
    truth = holdout_of(family_runs_of(c, n, d, loss), c.max(), n_resamples=0).figures()
    covered = 0
    for seed in range(20):
        c, n, d, loss = isoflop_runs(E=1.7, noise=0.005, seed=100 + seed)
        h = holdout_of(family_runs_of(c, n, d, loss), c.max(), n_resamples=30)
        low, high = h.boot.interval("error_parametric")
        covered += low <= truth["error_parametric"] <= high
    assert covered >= 14


def failing_parametric(monkeypatch, refits_only):
    """Makes approach 3 fail: every fit, or only the bootstrap's (tight) refits."""
    fit = par.fit_parametric

    def failing(*args, tight=False, **kwargs):
        if tight or not refits_only:
            raise FitError("made to fail")
        return fit(*args, tight=tight, **kwargs)

    monkeypatch.setattr(par, "fit_parametric", failing)


ISOFLOP_FIGURES = [k for k in ho.FIGURES + ho.BAND_FIGURES if "parametric" not in k]


@pytest.mark.parametrize("refits_only", [False, True])
def test_a_failed_parametric_fit_leaves_the_isoflop_intervals_alone(monkeypatch, refits_only):
    # The same draws with and without approach 3: the IsoFLOP figures of every resample are
    # the same, whether approach 3 has no fit at all (no interval, nothing to refit) or
    # fails in every refit (not identified).
    c, n, d, loss = isoflop_runs(E=1.7, noise=0.005, seed=3)
    runs = family_runs_of(c, n, d, loss)
    good = holdout_of(runs, c.max(), n_resamples=20)
    failing_parametric(monkeypatch, refits_only)
    h = holdout_of(runs, c.max(), n_resamples=20)
    for name in ISOFLOP_FIGURES:
        np.testing.assert_array_equal(h.boot.samples[name], good.boot.samples[name])
    assert h.boot.n_failed == good.boot.n_failed == 0
    assert (h.parametric is None) != refits_only
    assert math.isnan(h.figures()["error_parametric"]) != refits_only
    for name in ("predicted_loss_parametric", "error_parametric"):
        assert np.isnan(h.boot.samples[name]).all() and h.boot.interval(name) is None
        assert h.boot.not_identified(name) == "not identified (100% of refits failed)"
    assert h.boot.interval("error") == good.boot.interval("error")


def test_fit_json_has_the_parametric_intervals():
    c, n, d, loss = isoflop_runs(E=1.7, noise=0.005, seed=3)
    table = tbl.prepare_table(pd.DataFrame({"params": n, "tokens": d, "flops": c,
                                            "loss": loss}))
    result = fit_results(table, FitOptions(bootstrap=10, grid="small", holdout="largest",
                                           pairs=()))
    entry = to_json(result)["holdout"]["families"]["all"]
    for name in ("predicted_loss_parametric", "error_parametric"):
        low, high = entry[f"{name}_ci"]
        assert low < entry[name] < high
    assert entry["not_identified"] == {}


def test_without_a_training_law_the_parametric_prediction_keeps_its_interval():
    # One usable training budget (too few for the IsoFLOP laws) and four smaller ones whose
    # grids sit 1 dex off the optimum (no minimum, but runs approach 3 trains on): the
    # bootstrap runs for the parametric figures alone, resampling those runs too.
    c, n, d, loss = isoflop_runs(E=1.7, noise=0.005, seed=3)
    cs, ns, ds, ls = isoflop_runs(E=1.7, noise=0.005, seed=4, shift=1.0)
    budgets = np.unique(c)
    top, low = c >= budgets[-2], cs < budgets[-2]
    runs = family_runs_of(*(np.concatenate([a[top], b[low]])
                            for a, b in ((c, cs), (n, ns), (d, ds), (loss, ls))))
    h = holdout_of(runs, c.max(), n_resamples=20)
    assert h.train.laws is None and h.reason.startswith("no law on the other budgets")
    assert h.train_budgets == (budgets[-2],) and h.parametric.has_allocation
    f = h.figures()
    assert math.isnan(f["error"]) and math.isfinite(f["error_parametric"])
    low, high = h.boot.interval("error_parametric")
    assert low < f["error_parametric"] < high
    assert h.boot.interval("error") is None and h.boot.n_failed == 0
    assert h.boot.interval("observed_loss") is not None
    assert h.boot.design.stratified and len(h.boot.design.groups) == 3  # 2 budgets + the pool


# --- which budget -------------------------------------------------------------------------

BUDGETS = np.array([1e18, 1e19, 1e19, 1e20, 1e21, 1e21])


def minima_at(budgets_used, budgets_unused=()):
    """Budget minima with the given usable and unusable budgets (an exact parabola each)."""
    rows = []
    for b, used in [(b, True) for b in budgets_used] + [(b, False) for b in budgets_unused]:
        n = 1e8 * np.logspace(-0.5, 0.5, 5) * (1.0 if used else 10.0)  # unused: off the grid
        rows.append((np.full(5, b), n, b / (6 * n), 3.0 + 0.05 * np.log(n / 1e8) ** 2))
    c, n, d, loss = (np.concatenate(x) for x in zip(*rows))
    return find_minima(c, n, d, loss)


def test_resolve_largest_is_the_largest_usable_budget():
    minima = minima_at([1e18, 1e19, 1e20], [1e21])
    assert [m.used for m in minima] == [True, True, True, False]
    assert ho.resolve_budget("largest", BUDGETS, minima) == 1e20
    with pytest.raises(UsageError, match="no budget has a usable minimum"):
        ho.resolve_budget("largest", BUDGETS, minima_at([], [1e19, 1e21]))
    with pytest.raises(UsageError, match="no budget has a usable minimum"):
        ho.resolve_budget("largest", BUDGETS)


def test_resolve_a_number_within_the_budget_tolerance():
    assert ho.resolve_budget("1e20", BUDGETS) == 1e20
    assert ho.resolve_budget("1.04e20", BUDGETS) == 1e20  # 0.017 dex off
    assert ho.resolve_budget("9.6e18", BUDGETS) == 1e19  # 0.018 dex
    assert ho.resolve_budget("1e+21", BUDGETS) == 1e21


@pytest.mark.parametrize("spec", ["1.06e20", "3e19", "1e22", "0", "-1e20"])
def test_resolve_a_budget_not_in_the_table_lists_the_budgets(spec):
    with pytest.raises(UsageError) as err:
        ho.resolve_budget(spec, BUDGETS)
    message = str(err.value)
    assert spec in message and "no such budget" in message
    assert "budgets: 1e+18, 1e+19, 1e+20, 1e+21)" in message


def test_resolve_lists_at_most_twelve_budgets():
    with pytest.raises(UsageError, match=r"budgets: 1e\+10, .*, 1e\+21, \.\.\.\)") as err:
        ho.resolve_budget("5e30", np.logspace(10, 24, 15))
    assert "1e+22" not in str(err.value)


@pytest.mark.parametrize("spec", ["big", "", "1e20 FLOPs", "Largest"])
def test_resolve_garbage_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="takes 'largest' or a budget in FLOPs"):
        ho.resolve_budget(spec, BUDGETS)


# Chinchilla's two budgets nearest its held-out one: 0.016 dex apart, two groups at 0.02 dex.
CLOSE = np.array([9.536185258682192e+20, 9.898682237573787e+20])


@pytest.mark.parametrize("spec", ["9.9e+20", "9.898682237573787e+20", "9.85e20"])
def test_resolve_a_number_takes_the_nearest_budget(spec):
    # "9.9e+20" is how the error message and the printed table write the second budget; taking
    # the first budget within 0.02 dex resolved all three to 9.54e20.
    assert ho.resolve_budget(spec, CLOSE) == CLOSE[1]


# --- families that cannot carry a law ------------------------------------------------------


def two_budgets(c):
    """The largest budget's 9 runs and the 5 middle sizes of the next one: one budget to train
    on (a usable minimum, and under the 6 runs a parametric fit needs)."""
    budgets = np.unique(c)
    below = np.flatnonzero(c == budgets[-2])
    keep = c == budgets[-1]
    keep[below[2:7]] = True
    return keep


def test_one_training_budget_gives_a_reason_not_a_crash():
    c, n, d, loss = isoflop_runs(E=1.7)
    top = two_budgets(c)
    h = holdout_of(family_runs_of(c[top], n[top], d[top], loss[top]), c.max(), n_resamples=20)
    assert h.train.laws is None and h.boot is None and h.parametric is None
    assert h.reason == ("no law on the other budgets: 1 usable budget minima (the power laws "
                        "need 2)")
    assert h.train_budgets == (np.unique(c)[-2],)
    f = h.figures()
    assert all(math.isnan(f[k]) for k in ("predicted_loss", "error", "predicted_n_opt",
                                          "error_parametric"))
    assert f["observed_loss"] == pytest.approx(h.observed.loss_opt) and h.observed.used


def test_fit_json_skips_a_family_without_a_law_or_without_the_budget():
    c, n, d, loss = isoflop_runs(E=1.7)
    budgets = np.unique(c)
    frames = []
    for name, keep in (("full", np.ones(c.size, bool)), ("short", two_budgets(c)),
                       ("small", c <= budgets[1])):
        frames.append(pd.DataFrame({"run_id": [f"{name}-{i}" for i in range(keep.sum())],
                                    "family": name, "params": n[keep], "tokens": d[keep],
                                    "flops": c[keep], "loss": loss[keep]}))
    table = tbl.prepare_table(pd.concat(frames, ignore_index=True))
    result = fit_results(table, FitOptions(bootstrap=10, grid="small", holdout="largest",
                                           pairs=()))
    assert [h is None for h in result.holdouts] == [False, False, True]
    doc = to_json(result)["holdout"]
    assert doc["budget"] == pytest.approx(c.max())
    full, short, small = (doc["families"][k] for k in ("full", "short", "small"))
    assert full["skipped"] is None and abs(full["error_saturating"]) < 0.01
    assert len(full["error_ci"]) == 2
    assert short["skipped"].startswith("no law on the other budgets")
    assert short["error"] is None and short["error_ci"] is None
    assert short["predicted_loss_parametric"] is None and short["bootstrap"] is None
    assert short["observed_loss"] == pytest.approx(full["observed_loss"])
    assert short["train_budgets"] == [pytest.approx(budgets[-2])]
    assert small == {"skipped": f"no runs at budget {c.max():.3g}"}
