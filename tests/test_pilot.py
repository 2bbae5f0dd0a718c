"""The demo's pilot (scaling/pilot.py): the pooled seed noise, the interval it predicts for
the IsoFLOP exponent (checked against simulated sweeps, not against its own formula), the gate,
and the demo's measured curvature."""

import json
import math

import numpy as np
import pytest

from loopscale.commands.demo import (dropped_share, headline, measured_curvature,
                                     step_share_line, targets, why_missed)
from loopscale.errors import UsageError
from loopscale.scaling import pilot as pilot_lib


def _rows(losses_by_width, budget=3e11):
    return [{"family": "base", "budget": budget, "d_model": d, "loss": x}
            for d, xs in losses_by_width.items() for x in xs]


def test_seed_noise_pools_the_widths_and_skips_a_width_with_one_seed():
    a, b = [2.0, 2.1, 2.3], [1.5, 1.6]
    rows = _rows({16: a, 24: b, 32: [1.0]}) + _rows({16: [""]})  # a failed run
    rows += _rows({32: [0.5]}, budget=1e12)  # another budget's d 32 is another shape
    shapes, sigma, dof = pilot_lib.seed_noise(rows)
    assert [s.d_model for s in shapes] == [16, 24] and dof == 3
    ss = np.sum((np.array(a) - np.mean(a)) ** 2) + np.sum((np.array(b) - np.mean(b)) ** 2)
    assert sigma == pytest.approx(math.sqrt(ss / 3))
    assert shapes[0].std == pytest.approx(np.std(a, ddof=1))
    with pytest.raises(UsageError, match="no shape with two completed seeds"):
        pilot_lib.seed_noise(_rows({16: [2.0], 24: [1.0]}))


def test_predicted_interval_matches_simulated_sweeps():
    # Sweeps of five widths at three budgets around a known optimum N_opt = C^0.5, each point
    # the parabola plus Gaussian noise sigma_L: the spread of the fitted exponents over many
    # such sweeps is what the pilot predicts from sigma_L, c2 and the design alone.
    rng = np.random.default_rng(0)
    sigma_l, c2, a_true = 0.02, 0.3, 0.5
    budgets = np.array([1e11, 3e11, 1e12])
    offsets = np.log([0.5, 0.7, 1.0, 1.4, 2.0])
    points = [(c, math.exp(a_true * math.log(c) + o)) for c in budgets for o in offsets]
    predicted = pilot_lib.pilot(_rows({8: [1.0, 1.0 + sigma_l * math.sqrt(2)]}), points, c2)
    assert predicted.sigma_L == pytest.approx(sigma_l)
    slopes = []
    for _ in range(2000):
        vertices = []
        for c in budgets:
            x = a_true * math.log(c) + offsets
            y = 2.0 + c2 * (x - a_true * math.log(c)) ** 2 + rng.normal(0, sigma_l, x.size)
            q2, q1, _ = np.polyfit(x, y, 2)
            vertices.append(-q1 / (2 * q2))
        slopes.append(np.polyfit(np.log(budgets), vertices, 1)[0])
    simulated = pilot_lib.Z95 * np.std(slopes)
    assert abs(np.mean(slopes) - a_true) < 0.01
    assert predicted.a_half_width == pytest.approx(simulated, rel=0.15)


def test_the_gate_refuses_noise_above_the_limit():
    points = [(1e11, 1e4), (1e11, 2e4), (1e12, 3e4), (1e12, 6e4)]
    quiet = pilot_lib.pilot(_rows({8: [1.0, 1.01, 1.02]}), points, 0.3)
    noisy = pilot_lib.pilot(_rows({8: [1.0, 1.1, 1.2]}), points, 0.3)
    assert quiet.resolved and not noisy.resolved
    assert any("not resolved at this scale" in line for line in pilot_lib.lines(noisy))
    assert not any("predicted" in line for line in pilot_lib.lines(noisy))  # no exponents
    assert any("predicted 95% interval on a" in line for line in pilot_lib.lines(quiet))
    assert noisy.to_json()["resolved"] is False
    with pytest.raises(UsageError, match="two budgets"):
        pilot_lib.pilot(_rows({8: [1.0, 1.1]}), points[:2], 0.3)
    with pytest.raises(UsageError, match="curvature"):
        pilot_lib.pilot(_rows({8: [1.0, 1.1]}), points, 0.0)
    assert pilot_lib.pilot(_rows({8: [1.0, 1.1, 1.2]}), points, 0.3, noise_limit=0.2).resolved


def test_measured_curvature_recovers_a_parabola():
    rows = [{"family": "base", "budget": 1e11, "params_active": n,
             "loss": 3.0 + 0.25 * (math.log(n) - math.log(2e4)) ** 2}
            for n in (5e3, 1e4, 2e4, 4e4, 8e4)]
    rows.append({"family": "base", "budget": 1e12, "params_active": 1e4, "loss": 2.0})
    assert measured_curvature(rows) == {"base": {"1e+11": pytest.approx(0.25)}}
    rows = [dict(r, budget=1.5e11) for r in rows[:-1]]
    assert list(measured_curvature(rows)["base"]) == ["1.5e+11"]


def test_dropped_share_averages_each_familys_logged_steps(tmp_path):
    for name, fracs in {"a": [0.1, 0.3], "b": [0.2], "dense": []}.items():
        (tmp_path / name).mkdir()
        lines = [json.dumps({"step": i, "dropped_frac": f}) for i, f in enumerate(fracs)]
        lines.append(json.dumps({"step": 9, "eval_loss": 1.0}))  # an eval row has none
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rows = [{"family": "moe", "workdir": str(tmp_path / "a")},
            {"family": "moe", "workdir": str(tmp_path / "b")},
            {"family": "base", "workdir": str(tmp_path / "dense")},
            {"family": "base", "workdir": str(tmp_path / "never-started")}]
    assert dropped_share(rows) == {"moe": pytest.approx(0.2)}


def test_targets_judge_the_fit_as_the_issue_states_them():
    def fam(a_ci, alpha_ci, beta_ci, used=True):
        return {"isoflop": {"a": 0.5, "a_ci": None, "not_identified": {"a": "not identified "
                                                                        "(40% of refits failed)"},
                            "method": "parabola", "alternative": {"a": 0.6},
                            "minima": [{"budget": 1e11, "used": True},
                                       {"budget": 1e12, "used": used}]},
                "parametric": {"a": 0.5, "a_ci": a_ci, "alpha": 0.4, "alpha_ci": alpha_ci,
                               "beta": 0.4, "beta_ci": beta_ci, "not_identified": {}}}
    doc = {"families": {"base": fam([0.4, 0.6], [0.2, 0.6], [0.3, 0.7]),
                        "looped_moe": fam([0.1, 0.9], [0.1, 0.7], None, used=False)},
           "holdout": {"budget": 1e12, "families": {
               "base": {"error": -0.01, "observed_loss": 1.3, "predicted_loss": 1.29,
                        "error_ci": [-0.02, 0.0], "not_identified": {},
                        "error_parametric": 0.02, "predicted_loss_parametric": 1.32},
               "looped_moe": {"error": None, "observed_reason": "minimum on the edge"}}}}
    verdicts = targets(doc)
    assert verdicts == [
        "target missed: interior minimum at every budget for every family: not at looped_moe "
        "1e+12",
        "target met: base's a (approach 3): 95% interval narrower than 0.3 inside (0, 1): "
        "0.500 [0.400, 0.600]",
        "target met: base: parametric alpha and beta intervals narrower than 0.5: alpha 0.400 "
        "[0.200, 0.600], beta 0.400 [0.300, 0.700]",
        "target missed: looped_moe: parametric alpha and beta intervals narrower than 0.5: "
        "alpha 0.400 [0.100, 0.700], beta 0.400",  # no interval: missed
        "target met: base: held-out largest budget's L_opt predicted within 0.03 nats "
        "(approach 3): error +0.020",
        "target missed: looped_moe: held-out largest budget's L_opt predicted within 0.03 nats "
        "(approach 3): not checked"]
    lines = headline(doc)
    assert lines[0] == ("base: a = 0.500 [0.400, 0.600] (approach 3); IsoFLOP parabola 0.500, "
                        "not identified (40% of refits failed), spline 0.600")
    assert "by approach 3 1.320 (error +0.020)" in lines[2]
    assert lines[3] == "looped_moe: held-out 1e+12 not checked (minimum on the edge)"


def test_a_missed_interval_target_says_why_from_the_measured_figures():
    def fam(a_ci, alpha_ci, rho):
        return {"fitted_flops": [5e10, 5e11], "isoflop": {"minima": []},
                "parametric": {"a": 0.5, "a_ci": a_ci, "alpha_ci": alpha_ci,
                               "beta_ci": [0.3, 0.5], "not_identified": {},
                               "bootstrap": {"alpha_beta_spearman": rho, "clusters": 8}}}
    doc = {"families": {"base": fam([0.3, 0.7], [0.3, 1.2], 0.91),
                        "moe": fam([0.3, 0.5], [0.2, 0.9], 0.2),
                        "looped": fam([0.3, 0.5], [0.3, 0.4], 0.95)}}  # both met: no line
    lines = why_missed(doc, a_half_width=0.1)
    # 0.4 wide: 0.3 needs (4/3)^2 = 1.8x the trunks, or 4/3 decades: 10^(1/3) = 2.2x the
    # largest budget.
    assert lines[0] == (
        "why (a): base's a interval is 0.400 wide, 2.0x the 0.200 the pilot's seed noise alone "
        "allows; approach 3 fitted five parameters over 1.00 decades of compute (5e+10 to "
        "5e+11 FLOPs). 0.3 wide needs, if the interval narrows as 1/sqrt(trunks), 1.8x the "
        "number of its 8 trunks (more seeds a point), or, if as 1/(decades spanned), 1.33 "
        "decades: a largest budget of 1.1e+12 FLOPs, 2.2x this one with the smallest kept (both "
        "rates assumed, not measured here)")
    assert lines[1:] == [
        "why (alpha, beta): base's alpha and beta have rank correlation +0.91 across the "
        "bootstrap: they trade off along a ridge these runs do not resolve, while a = "
        "beta/(alpha+beta) is held better",
        "why (alpha, beta): moe's alpha and beta have rank correlation +0.20 across the "
        "bootstrap (under 0.7: not a ridge; each is loosely held on its own)"]
    doc["families"]["base"]["parametric"].update(
        a_ci=None, not_identified={"a": "not identified (12% of refits failed)"})
    assert why_missed(doc, None)[0] == ("why (a): base's a has no interval: not identified "
                                        "(12% of refits failed)")
    doc["families"]["base"]["parametric"]["a_ci"] = [-0.05, 0.2]  # narrow, but not in (0, 1)
    assert why_missed(doc, 0.1)[0] == ("why (a): base's a interval [-0.050, 0.200] reaches "
                                       "outside (0, 1), the range of beta/(alpha+beta) for "
                                       "positive exponents")
    doc["families"]["base"]["parametric"]["a_ci"] = [0.4, 0.6]  # met: no line for a
    assert not [line for line in why_missed(doc, 0.1) if line.startswith("why (a)")]


def test_a_minimum_that_is_not_interior_says_why_and_where_it_sits():
    def minimum(budget, used, reason=None, edge=None, centring=None):
        return {"budget": budget, "sizes": 5, "used": used, "reason": reason,
                "on_edge": edge is not None, "edge": edge, "grid_dex": 0.9, "centring": centring}
    doc = {"families": {"moe": {"isoflop": {"minima": [
        minimum(5e10, True, centring=0.5),  # interior: no line
        minimum(5e11, False, "minimum on the edge of the size grid (lowest loss at the largest "
                "size)", edge="largest", centring=0.93),
        minimum(1e12, False, "loss is not convex in ln(params)"),
        minimum(2e12, False, "minimum on the edge of the size grid (fitted minimum at or beyond "
                "the smallest size)", edge="smallest", centring=-0.2)]},
        "parametric": {"alpha_ci": [0.3, 0.4], "beta_ci": [0.3, 0.4]}}}}
    assert targets(doc)[0] == ("target missed: interior minimum at every budget for every "
                               "family: not at moe 5e+11, moe 1e+12, moe 2e+12")
    assert why_missed(doc, None) == [
        "why (interior): moe 5e+11: minimum on the edge of the size grid (lowest loss at the "
        "largest size); its 5 sizes span 0.90 decades of parameters, the fitted minimum at 0.93 "
        "of that span (0: the smallest size, 1: the largest): a size beyond the largest would "
        "bracket it",
        "why (interior): moe 1e+12: loss is not convex in ln(params)",
        "why (interior): moe 2e+12: minimum on the edge of the size grid (fitted minimum at or "
        "beyond the smallest size); its 5 sizes span 0.90 decades of parameters, the fitted "
        "minimum at -0.20 of that span (0: the smallest size, 1: the largest): a size beyond the "
        "smallest would bracket it"]
    # The end is fit.json's `edge`, wherever the fitted minimum sits (here the lowest loss at
    # the smallest size, the parabola's vertex past the middle) ...
    lowest = minimum(5e11, False, "minimum on the edge", edge="smallest", centring=0.6)
    doc["families"]["moe"]["isoflop"]["minima"] = [lowest]
    assert why_missed(doc, None)[0].endswith("a size beyond the smallest would bracket it")
    # ... and in a fit.json written before it had `edge`, read from where the minimum sits.
    older = minimum(5e11, False, "minimum on the edge", edge="smallest", centring=1.1)
    del older["edge"]
    doc["families"]["moe"]["isoflop"]["minima"] = [older]
    assert why_missed(doc, None)[0].endswith("at 1.10 of that span (0: the smallest size, 1: "
                                             "the largest): a size beyond the largest would "
                                             "bracket it")


def test_a_missed_held_out_prediction_says_why():
    fam = {"isoflop": {"minima": []}, "parametric": {"alpha_ci": [0.3, 0.4],
                                                     "beta_ci": [0.3, 0.4]}}
    doc = {"families": {"base": fam, "moe": fam, "looped": fam},
           "holdout": {"budget": 5e11, "families": {
               "base": {"error_parametric": 0.012, "error_parametric_ci": [-0.01, 0.04]},
               "moe": {"error_parametric": None, "observed_reason": "minimum on the edge"},
               "looped": {"error_parametric": -0.05, "error_parametric_ci": [-0.08, -0.02]}}}}
    verdicts = [line for line in targets(doc) if "held-out" in line]
    assert [line.split(":")[0] for line in verdicts] == [
        "target met", "target missed", "target missed"]
    assert [line for line in why_missed(doc, None) if line.startswith("why (held-out)")] == [
        "why (held-out): moe's 5e+11 not checked: minimum on the edge",
        "why (held-out): looped's approach-3 error at 5e+11 is -0.050; its interval [-0.080, "
        "-0.020] excludes 0: the law from the smaller budgets under-predicts this one"]
    doc["holdout"]["families"]["looped"]["error_parametric_ci"] = [-0.08, 0.01]
    assert why_missed(doc, None)[-1].endswith(
        "is -0.050; its interval [-0.080, +0.010] holds 0: a miss within the fit's own noise")


def test_the_step_share_target_reads_the_sweeps_runs():
    def share(step_s, wall_s, runs):
        return {"runs": runs, "step_s": step_s, "runs_wall_s": wall_s, "compile_s": 10.0,
                "share_of_runs": step_s / wall_s}
    line = step_share_line({"sweep": share(69.96, 100.0, 40), "pilot": share(80.0, 100.0, 6)})
    assert line == ("target missed: train steps at least 70% of the runs' own wall time: 70.0% "
                    "(70 s of steps / 100 s over 40 runs, of which 10 s compiling train steps; "
                    "the pilot's 80.0% over 6)")
    assert step_share_line({"sweep": share(70.0, 100.0, 40), "pilot": share(1.0, 100.0, 6)}
                           ).startswith("target met: ")
