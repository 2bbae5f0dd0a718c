"""`loopscale fit` end to end: two families, excluded runs, fit.json schema, comparison."""

import json

import numpy as np
import pandas as pd
import pytest

from loopscale.cli import main

ALPHA, BETA, E, A, B = 0.34, 0.30, 1.7, 400.0, 1500.0
S = 1.5  # the looped family needs S x the params and S x the tokens for the same loss


def results_table(path):
    rng = np.random.default_rng(0)
    G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    rows = []
    for family, s, stored in (("base", 1.0, 1.0), ("looped", S, 0.5)):
        for c in np.logspace(18, 20, 4):
            n_opt = s * G * (c / (6 * s * s)) ** (BETA / (ALPHA + BETA))
            for i, n in enumerate(n_opt * np.logspace(-.5, .5, 7)):
                d = c / (6 * n)
                loss = (E + A * (n / s) ** -ALPHA + B * (d / s) ** -BETA) * np.exp(
                    rng.normal(0, 0.001))
                loops = 1 if family == "base" else 2
                rows.append({"run_id": f"{family}-{c:.0e}-{i}", "family": family,
                             "params": n, "params_unique": stored * n, "tokens": d,
                             "loss": loss, "status": "completed",
                             # the recurrence law's inputs (collect's columns)
                             "params_once": 0.2 * stored * n, "params_rec": 0.8 * stored * n,
                             "n_loops": loops})
    rows.append(dict(rows[0], run_id="base-diverged", status="diverged", loss=9.0))
    rows.append(dict(rows[1], run_id="base-running", status="running", loss=np.nan))
    pd.DataFrame(rows).to_csv(path, index=False)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fit")
    results_table(folder / "results.csv")
    argv = ["fit", str(folder / "results.csv"), "--grid=small", "--bootstrap=40", "--seed=3"]
    assert main(argv + [f"--out={folder / 'fit.json'}"]) == 0
    assert main(argv + [f"--out={folder / 'again.json'}"]) == 0
    return folder


def test_fit_json_schema(fitted):
    doc = json.loads((fitted / "fit.json").read_text())
    assert doc["table"]["flops"] == "6*params*tokens"
    assert set(doc["families"]) == {"base", "looped"}
    fam = doc["families"]["base"]
    for key in ("a", "b", "alpha", "A", "E", "alpha_N", "alpha_U"):
        assert key in fam["isoflop"] and f"{key}_ci" in fam["isoflop"]
    for key in ("E", "A", "B", "alpha", "beta", "G", "a", "b"):
        assert fam["parametric"][key] is not None
        low, high = fam["parametric"][f"{key}_ci"]
        assert low <= high
    minimum = fam["isoflop"]["minima"][0]
    assert {"budget", "params_opt", "params_opt_ci", "tokens_opt", "loss_opt", "on_edge",
            "edge", "used", "params_unique_opt"} <= set(minimum)
    assert minimum["edge"] in (None, "smallest", "largest")
    assert (minimum["edge"] is not None) == minimum["on_edge"]
    assert fam["parametric"]["alpha"] == pytest.approx(ALPHA, abs=0.02)


def test_intervals_say_their_unit_and_failures(fitted):
    doc = json.loads((fitted / "fit.json").read_text())
    for fam in doc["families"].values():
        for approach in ("isoflop", "parametric"):
            boot = fam[approach]["bootstrap"]
            assert boot["resampling"] == "runs" and boot["resamples"] == 40
            assert boot["failed_share"] == boot["failed"] / 40
            # a figure with an interval is identified; one without a point has no interval
            for key, why in fam[approach]["not_identified"].items():
                assert fam[approach][f"{key}_ci"] is None and why.startswith("not identified (")
        assert fam["isoflop"]["estimator"]["headline"] == "parabola"
        assert fam["isoflop"]["counts"]["params"] == "params"
        assert fam["parametric"]["residual_sd"] < 0.01  # 0.1% noise on losses near 2
        assert fam["fitted_flops"] == pytest.approx([1e18, 1e20])
        assert -1.0 <= fam["parametric"]["bootstrap"]["alpha_beta_spearman"] <= 1.0


def test_recurrence_law_across_loop_counts(fitted, tmp_path):
    doc = json.loads((fitted / "fit.json").read_text())
    law = doc["recurrence"]
    assert law["loop_counts"] == [1, 2] and law["families"] == ["base", "looped"]
    assert 0.0 <= law["phi"] <= 1.0 and law["n_runs"] == 56
    # One loop count: no law, and why in one line.
    frame = pd.read_csv(fitted / "results.csv")
    frame[frame["family"] == "base"].to_csv(tmp_path / "base.csv", index=False)
    assert main(["fit", str(tmp_path / "base.csv"), "--grid=small", "--bootstrap=0",
                 f"--out={tmp_path / 'base.json'}"]) == 0
    base = json.loads((tmp_path / "base.json").read_text())
    assert "recurrence" not in base
    assert [w for w in base["warnings"] if w.startswith("no recurrence law: one loop count")]


def test_branches_of_a_trunk_are_resampled_together(fitted, tmp_path):
    """The i-th size of every budget is a branch of trunk i: the bootstrap draws the 7 trunks
    (the excluded runs are not fitted) and says so."""
    frame = pd.read_csv(fitted / "results.csv")
    frame = frame[frame["family"] == "base"].copy()
    frame["branch_of"] = ["trunk-" + r.rsplit("-", 1)[1] if r.count("-") == 2 else ""
                          for r in frame["run_id"]]
    frame.to_csv(tmp_path / "branches.csv", index=False)
    assert main(["fit", str(tmp_path / "branches.csv"), "--grid=small", "--bootstrap=40",
                 "--seed=3", f"--out={tmp_path / 'b.json'}"]) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    boot = doc["families"]["base"]["parametric"]["bootstrap"]
    assert boot["resampling"].startswith("trunks") and boot["clusters"] == 7
    assert doc["families"]["base"]["isoflop"]["bootstrap"]["clusters"] == 7


def test_excluded_runs_are_listed_with_their_status(fitted):
    doc = json.loads((fitted / "fit.json").read_text())
    assert [(e["run"], e["status"]) for e in doc["excluded"]] == [
        ("base-diverged", "diverged"), ("base-running", "running")]
    assert doc["table"]["fitted"] == 56


def test_family_comparison(fitted):
    doc = json.loads((fitted / "fit.json").read_text())
    (pair,) = doc["comparison"]["pairs"]
    assert (pair["reference"], pair["other"]) == ("base", "looped")
    assert pair["target"] == "compute" and pair["target_compute"] == pytest.approx(1e20)
    for key in ("compute_multiplier_parametric", "compute_multiplier_saturating"):
        assert pair[key] == pytest.approx(S ** 2, rel=0.05)
        low, high = pair[f"{key}_ci"]
        assert low < S ** 2 < high
    # The pure power law bends away from the saturating frontier: biased low, but not wild.
    assert S ** 2 * 0.8 < pair["compute_multiplier"] < S ** 2
    low, high = pair["compute_multiplier_ci"]
    assert low < pair["compute_multiplier"] < high
    # Looped stores half its parameters but needs S x as many at the optimum: S/2 the base's.
    assert pair["unique_params_ratio_saturating"] == pytest.approx(S / 2, rel=0.05)
    assert pair["unique_params_saving_saturating"] == pytest.approx(1 - S / 2, abs=0.03)
    assert pair["unique_params_ratio"] == pytest.approx(S / 2, rel=0.15)
    assert set(doc["comparison"]["exponents"]["parametric"]["alpha"]) == {
        "base", "base_ci", "looped", "looped_ci"}


def test_same_seed_same_fit(fitted):
    assert (fitted / "fit.json").read_text() == (fitted / "again.json").read_text()


def test_unknown_family_to_compare_exits_2(fitted, capsys):
    code = main(["fit", str(fitted / "results.csv"), f"--out={fitted / 'x.json'}",
                 "--compare=base,nope", "--bootstrap=0"])
    assert code == 2 and "nope" in capsys.readouterr().err
