"""The iso-depth recurrence law (scaling/recurrence.py): phi recovered from synthetic sweeps of
known phi, one loop count refused in one line, bootstrap intervals that cover the truth and
move clusters whole, fit.json's `recurrence` object and the compute-optimal loop count. No JAX:
every table is synthetic and every fit a few tens of milliseconds."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import nnls

from loopscale.scaling import FitError
from loopscale.scaling import recurrence as rec
from loopscale.scaling import table as tbl
from loopscale.scaling.bootstrap import Resampling, design, resample

TRUTH = dict(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)
VOCAB, DEPTH = 8192, 8


def sweep(phi, seed=0, noise=0.005, widths=(256, 384, 512, 768, 1024), loops=(1, 2, 4),
          mults=(0.5, 1, 2, 4, 8), moe_top=None):
    """An iso-depth sweep: per width, the same effective depth (8 layer uses) at r = 1, 2, 4
    (8/r unique layers), each trained at several tokens per active parameter; losses from the
    law at `phi` with multiplicative log-normal noise. `moe_top`: (top_k, n_experts) makes the
    FFN a MoE (stored block larger than its active one)."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in widths:
        for r in loops:
            once = 2 * VOCAB * d + d
            layer, layer_active = 12 * d * d, 12 * d * d
            if moe_top:
                k, n = moe_top
                layer = 4 * d * d + n * 8 * d * d + d * n
                layer_active = 4 * d * d + k * 8 * d * d + d * n
            n_rec, n_rec_active = (DEPTH // r) * layer, (DEPTH // r) * layer_active
            active = once + r * n_rec_active
            trunk = f"{'moe' if moe_top else 'dense'}_d{d}r{r}"
            for m in mults:
                tokens = 20.0 * active * m
                loss = law(phi, once, n_rec, r, tokens) * np.exp(rng.normal(0.0, noise))
                rows.append(dict(run_id=f"{trunk}m{m}", branch_of=trunk, family=(
                    ("looped" if r > 1 else "base") + ("_moe" if moe_top else "")),
                    params=active, tokens=tokens, flops=6.0 * active * tokens, loss=loss,
                    params_once=once, params_rec=n_rec, params_rec_active=n_rec_active,
                    n_loops=r, ffn="moe" if moe_top else "dense"))
    return pd.DataFrame(rows)


def law(phi, once, n_rec, r, tokens):
    t = TRUTH
    n = once + r ** phi * n_rec
    return t["E"] + t["A"] * n ** -t["alpha"] + t["B"] * tokens ** -t["beta"]


def arrays(frame):
    return [frame[c].to_numpy(dtype=float)
            for c in ("params_once", "params_rec", "n_loops", "tokens", "loss")]


def results_table(frame):
    """A ResultsTable as `loopscale fit` reads it: ffn and params_rec_active are carried on
    its runs (the MoE split reads them)."""
    t = tbl.prepare_table(frame)
    assert {"ffn", "params_rec_active"} <= set(t.runs.columns)
    return t


@pytest.mark.parametrize("phi", [0.2, 0.46, 0.8])
def test_phi_is_recovered_from_a_realistic_sweep(phi):
    frame = sweep(phi, seed=int(phi * 100))
    fit = rec.fit_recurrence(*arrays(frame))
    print(f"phi {phi}: recovered {fit.phi:.4f}, alpha {fit.alpha:.3f}, beta {fit.beta:.3f}")
    assert abs(fit.phi - phi) < 0.03
    assert abs(fit.alpha - TRUTH["alpha"]) < 0.08 and abs(fit.beta - TRUTH["beta"]) < 0.04
    assert fit.loop_counts == (1, 2, 4) and fit.n_runs == len(frame) == 75
    assert fit.r2 > 0.99
    # The residual SD is the 0.5% noise in nats (the losses are ~3.3-4.6).
    assert 0.5 < fit.residual_sd / (0.005 * frame["loss"].mean()) < 1.5
    # An r = 4 model's equivalent size lies between its stored and its per-use parameters.
    once, n_rec = 2 * VOCAB * 512 + 512, 2 * 12 * 512 ** 2
    eq = fit.equivalent_params(once, n_rec, 4)
    assert once + n_rec < eq < once + 4 * n_rec
    assert eq == pytest.approx(once + 4 ** fit.phi * n_rec)


def test_one_loop_count_is_refused_in_one_line():
    frame = sweep(0.46, loops=(2,))
    with pytest.raises(FitError, match=r"^one loop count \(r = 2\) in the table: the "
                                       r"recurrence law needs runs at two or more$"):
        rec.fit_recurrence(*arrays(frame))
    doc = rec.recurrence_json(results_table(frame))
    assert set(doc) == {"skipped"} and "one loop count (r = 2)" in doc["skipped"]
    assert "\n" not in doc["skipped"]
    assert rec.report_lines(doc) == [f"recurrence law: skipped: {doc['skipped']}"]
    with pytest.raises(FitError, match="needs at least"):
        rec.fit_recurrence(*arrays(sweep(0.46).iloc[:5]))
    no_columns = tbl.prepare_table(frame[["params", "tokens", "loss"]])
    assert "no params_once" in rec.recurrence_json(no_columns)["skipped"]


def test_the_grid_projection_is_nnls():
    """Each grid point's (E, A, B) is scipy's NNLS of the 1/L-weighted linear problem."""
    frame = sweep(0.46, widths=(256, 512), mults=(0.5, 2, 8))
    data = rec._check(*arrays(frame))
    points, errors = rec._projected_grid(data)
    rng = np.random.default_rng(0)
    for i in rng.choice(points.shape[0], 25, replace=False):
        alpha, beta, phi = points[i, :3]
        x = np.stack([np.ones(data.loss.size),
                      (data.once + data.loops ** phi * data.rec) ** -alpha,
                      data.tokens ** -beta], axis=1) / data.loss[:, None]
        coef, norm = nnls(x, np.ones(data.loss.size))
        assert errors[i] == pytest.approx(norm ** 2, rel=1e-6, abs=1e-12)
        assert points[i, 3:] == pytest.approx(coef, rel=1e-5, abs=1e-9)


def test_bootstrap_covers_phi_and_moves_clusters_whole():
    frame = sweep(0.46, seed=3)
    values = arrays(frame)
    fit = rec.fit_recurrence(*values)
    clusters = frame["branch_of"].to_numpy()
    boot = rec.bootstrap_recurrence(fit, *values, n_resamples=24,
                                    rng=np.random.default_rng(0), clusters=clusters)
    low, high = boot.interval("phi")
    print(f"phi 0.46: fit {fit.phi:.4f}, bootstrap interval [{low:.4f}, {high:.4f}]")
    assert np.isfinite([low, high]).all() and low < 0.46 < high and high - low < 0.25
    assert boot.n_failed == 0 and set(boot.samples) == set(rec.FIGURES)
    # Rows sharing a label move together, drawn within their loop count.
    plan = boot.design
    assert plan.clustered and plan.stratified and plan.n_clusters == 15
    idx = resample(np.random.default_rng(1), plan)
    drawn = pd.Series(clusters[idx]).value_counts()
    sizes = pd.Series(clusters).value_counts()
    assert all(n % sizes[c] == 0 for c, n in drawn.items())  # whole clusters only
    assert sorted(set(frame["n_loops"].to_numpy()[idx])) == [1, 2, 4]
    assert design(len(frame), clusters).n_clusters == 15


def test_fit_json_object_per_backbone_kind():
    dense = sweep(0.46, seed=5, widths=(256, 512, 1024), mults=(0.5, 2, 8))
    moe = sweep(0.3, seed=6, widths=(256, 512, 1024), mults=(0.5, 2, 8), moe_top=(2, 8))
    frame = pd.concat([dense, moe], ignore_index=True)
    table = results_table(frame)
    doc = rec.recurrence_json(table, bootstrap=8, seed=1)
    json.dumps(doc, allow_nan=False)  # JSON-clean
    for key in ("phi", "phi_ci", "E", "E_ci", "A", "A_ci", "B", "B_ci", "alpha", "alpha_ci",
                "beta", "beta_ci", "n_runs", "loop_counts", "families", "residual_sd", "r2",
                "params", "bootstrap", "equivalent_params", "optimal_loops"):
        assert key in doc, key
    assert doc["params"] == "stored" and doc["families"] == ["base", "looped"]
    assert doc["n_runs"] == len(dense) and doc["loop_counts"] == [1, 2, 4]
    assert abs(doc["phi"] - 0.46) < 0.05
    assert doc["bootstrap"]["resampling"] == Resampling.TRUNKS  # tbl.CLUSTER from branch_of
    assert doc["bootstrap"]["clusters"] == 9 and doc["bootstrap"]["resamples"] == 8
    looped = dense[dense["n_loops"] > 1]
    assert [e["run"] for e in doc["equivalent_params"]] == looped["run_id"].tolist()
    e = doc["equivalent_params"][0]
    assert e["equivalent"] == pytest.approx(e["params_once"] + e["n_loops"] ** doc["phi"]
                                            * e["params_rec"])
    budgets = sorted(set(tbl.prepare_table(dense.drop(columns="branch_of")).runs["flops"]))
    assert len(doc["optimal_loops"]) >= 3  # one per budget the grouping finds
    assert {c["n_loops"] for c in doc["optimal_loops"]} <= {1, 2, 3, 4}
    assert min(c["budget"] for c in doc["optimal_loops"]) == pytest.approx(budgets[0], rel=0.05)

    moe_doc = doc["moe"]
    assert set(moe_doc) == {"stored", "active"}
    stored, active = moe_doc["stored"], moe_doc["active"]
    assert stored["families"] == ["base_moe", "looped_moe"] and active["params"] == "active"
    assert abs(stored["phi"] - 0.3) < 0.05  # the law was generated on stored N_rec
    assert 0.0 <= active["phi"] <= 1.0 and active["compute_params"] == "params_rec_active"
    assert active["equivalent_params"][0]["params_rec"] in set(moe["params_rec_active"])
    lines = rec.report_lines(doc)
    assert lines[0].startswith("recurrence law (base, looped; 27 runs at r = 1, 2, 4): phi = ")
    assert any("MoE, active N_rec" in line for line in lines)
    assert any(line.startswith("  compute-optimal at C = ") for line in lines)
    assert any("unique-equivalent" in line for line in lines)

    # A MoE group at one r is skipped in one line; a table that tells neither ffn nor
    # params_rec_active is one group.
    one_r = pd.concat([dense, moe[moe["n_loops"] == 2]], ignore_index=True)
    doc = rec.recurrence_json(results_table(one_r))
    assert doc["families"] == ["base", "looped"] and doc["moe"] == {
        "skipped": "one loop count (r = 2) among the MoE runs: the recurrence law needs runs "
                   "at two or more"}
    doc = rec.recurrence_json(tbl.prepare_table(frame.drop(columns=["ffn",
                                                                    "params_rec_active"])))
    assert doc["families"] == ["base", "looped", "base_moe", "looped_moe"] and "moe" not in doc


def test_the_gradient_is_the_objectives():
    frame = sweep(0.46, widths=(256, 512), mults=(0.5, 2, 8))
    objective = rec._Objective(rec._check(*arrays(frame)), delta=0.05)  # smooth: |r| < delta
    theta = np.array([-1.0, -0.5, 0.5, 0.3, 0.3, 0.45])
    _, grad = objective(theta)
    steps = np.eye(6) * 1e-6
    numeric = [(objective(theta + h)[0] - objective(theta - h)[0]) / 2e-6 for h in steps]
    assert grad == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_compute_optimal_loops():
    """phi = 0: a loop pass adds nothing and costs tokens, so r = 1; phi = 1 with the block
    dominating: looping is as good as new parameters, and a small block is worth looping at a
    large budget. The best backbone wins over all of them."""
    base = rec.RecurrenceFit(E=1.7, A=400.0, B=400.0, alpha=0.34, beta=0.28, phi=0.0,
                             objective=0.0, n_runs=0, loop_counts=(1, 2), residual_sd=0.0,
                             r2=1.0, n_starts=0, n_polished=0)
    assert base.optimal_loops(1e19, 1e6, 5e7, max_loops=8).n_loops == 1
    full = dataclasses.replace(base, phi=1.0)
    choice = full.optimal_loops(1e21, 1e6, 5e6, max_loops=8)
    assert choice.n_loops > 1
    assert choice.tokens == pytest.approx(1e21 / (6 * (1e6 + choice.n_loops * 5e6)))
    assert choice.loss == pytest.approx(float(full.predict(1e6, 5e6, choice.n_loops,
                                                           choice.tokens)))
    # An MoE block whose active part is small loops cheaply.
    sparse = full.optimal_loops(1e21, 1e6, 5e6, max_loops=8, params_rec_active=1e6)
    assert sparse.n_loops >= choice.n_loops and sparse.loss < choice.loss
    picks = rec.best_loops(full, [1e18, 1e21], [(1e6, 5e6), (1e6, 5e7)], max_loops=4)
    for pick in picks:
        assert pick.loss == min(full.optimal_loops(pick.budget, o, r, 4).loss
                                for o, r in [(1e6, 5e6), (1e6, 5e7)])


def test_the_committed_recurrence_sweep_is_what_the_law_fits():
    """analysis/results/recurrence/ (sweeps/recurrence.py at CPU scale, 2026-12-05): its fit.json
    is the law fitted to its results.csv, and its README's reading holds: phi not resolved
    (the interval spans [0, 1]), beta's interval inside (0.2, 0.7), r = 1 compute-optimal."""


    folder = Path(__file__).resolve().parent.parent / "analysis" / "results" / "recurrence"
    committed = json.loads((folder / "fit.json").read_text())["recurrence"]
    refit = rec.recurrence_json(tbl.read_table(str(folder / "results.csv")))
    assert refit["n_runs"] == committed["n_runs"] == 22
    for name in ("phi", "alpha", "beta", "E"):
        assert refit[name] == pytest.approx(committed[name], rel=1e-3)
    assert committed["phi_ci"][0] < 0.05 and committed["phi_ci"][1] > 0.95
    assert 0.2 < committed["beta_ci"][0] < committed["beta_ci"][1] < 0.7
    assert {o["n_loops"] for o in committed["optimal_loops"]} == {1}
