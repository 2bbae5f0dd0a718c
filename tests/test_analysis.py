"""analysis/: the three study scripts on tiny real sweeps (runs trained here for a few steps,
measured by the real `loopscale eval`), against the figures they are read from: the exponents
are `loopscale fit`'s, the Table-7 row is eval/early_exit.json's, the success table counts the
runs at the threshold, a missing measurement is named, bad input is one line and exit 2."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import trainkit

from loopscale.cli import main as loopscale
from loopscale.config import load_config, parse
from loopscale.train.trainer import train

ANALYSIS = Path(__file__).parent.parent / "analysis"
sys.path.insert(0, str(ANALYSIS))

import common
import flt_stability
import frontiers
import permutation

OLD_SWEEP = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5" / "sweep"
# One layer per loop, two loops: the fewest programs to compile for a looped run.
TINY = {"train.steps": 4, "train.eval_every": 0, "train.checkpoint_every": 0,
        "model.d_model": 32, "model.n_unique": 1, "model.n_loops": 2}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(tmp / "text")), str(tmp / "cache")


def rows_of(report: str, first: str) -> list[list[str]]:
    """The cells of report.md's table rows whose first cell is `first`."""
    out = []
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            out.append(cells)
    return out


def analyse(script, workdir, *args) -> str:
    assert script.main([f"--workdir={workdir}", *args]) == 0
    return (Path(workdir) / "analysis" / "report.md").read_text()


# ------------------------------------------------------------------------------- FLT


@pytest.fixture(scope="module")
def flt_sweep(corpus, tmp_path_factory):
    """One 2-loop FLT run (act_grad_norm logged, `loopscale eval --what=loops` run) and one
    planned run not trained yet (its run.json only, as the runner leaves it before launching)."""
    sweep = tmp_path_factory.mktemp("flt") / "sweep"
    cfg = trainkit.config("flt", *corpus, **TINY, **{"train.log_act_grads": True, "train.log_grad_cosine": True, "name": "flt"})
    assert train(cfg, str(sweep / "runs" / "flt")) == 0
    assert loopscale(["eval", f"--workdir={sweep / 'runs' / 'flt'}", "--what=loops",
                      "--batches=1"]) == 0
    (sweep / "runs" / "planned").mkdir()
    (sweep / "runs" / "planned" / "run.json").write_text(json.dumps(
        {"run_id": "planned", "family": "none"}))
    return sweep


def test_flt_report(flt_sweep):
    report = analyse(flt_stability, flt_sweep)
    loops = json.loads((flt_sweep / "runs" / "flt" / "eval" / "loops.json").read_text())
    row = next(r for r in rows_of(report, "flt")
               if len(r) == 6 and not r[2].startswith(("eval/", "metrics")))  # ppl per count
    assert row[1:5] == ["2", common.num(loops["ppl"][0]), common.num(loops["ppl"][1]),
                        common.num(loops["ppl"][-1])]
    logged = [r for r in trainkit.metric_rows(flt_sweep / "runs" / "flt") if "act_grad_norm" in r]
    act = next(r for r in rows_of(report, "flt") if r[2].startswith("metrics act_grad_norm"))
    assert act[3:5] == [common.num(logged[-1]["act_grad_norm"][0]),
                        common.num(logged[-1]["act_grad_norm"][-1])]
    # The planned run is named, not dropped; collapse is summary.json's.
    assert "1 trained run(s) of 2 in the sweep" in report
    assert "Missing for 1 run(s) (not trained yet, no config.json): none/planned." in report
    summary = json.loads((flt_sweep / "runs" / "flt" / "summary.json").read_text())
    assert rows_of(report, "flt")[0][7] == common.num(summary["collapsed"])
    # Oscillation: the windows of the logged gradient norms.
    norms = np.array([r["grad_norm"] for r in trainkit.metric_rows(flt_sweep / "runs" / "flt")
                      if "grad_norm" in r])
    _, std, cv, _ = flt_stability.window_spread(norms, flt_stability.WINDOW)
    grads = next(r for r in rows_of(report, "flt") if len(r) == 11)
    assert grads[4:6] == [common.num(std), common.num(cv)]
    # Consecutive gradients' cosine: its mean from step 2 and the share below zero.
    cos = np.array([r["grad_cosine"] for r in trainkit.metric_rows(flt_sweep / "runs" / "flt")
                    if "grad_cosine" in r and r["step"] > 1])
    assert len(cos) >= 2 and np.all(np.abs(cos) <= 1 + 1e-6)
    assert grads[9:11] == [common.num(float(cos.mean())), common.num(float((cos < 0).mean()))]
    assert "no grad_cosine logged" not in report
    for png in (flt_sweep / "analysis").glob("*.png"):
        assert png.stat().st_size < 150_000
    assert {p.stem for p in (flt_sweep / "analysis").glob("*.png")} == {
        "loss_curves", "grad_norm", "residual_norm", "ppl_vs_loops", "act_grads"}


def test_gradient_windows_by_hand():
    norms = [1.0, 3.0, 1.0, 3.0, 2.0, 2.0]
    w, std, cv, cv_max = flt_stability.window_spread(np.array(norms), 2)
    assert w == 2 and std == pytest.approx(2 / 3) and cv == pytest.approx(1 / 3)
    assert cv_max == pytest.approx(0.5)


# ------------------------------------------------------------------------------- frontiers


@pytest.fixture(scope="module")
def iso_sweep(corpus, tmp_path_factory):
    """The six-run Base sweep of the old-format fixture plus one tiny Looped-MoE run measured
    with early_exit, jsd and routing."""
    sweep = tmp_path_factory.mktemp("iso") / "sweep"
    shutil.copytree(OLD_SWEEP, sweep)
    cfg = trainkit.config("looped_moe", *corpus, **TINY, **{
        "model.moe_dispatch": "capacity", "model.capacity_factor": 2.0, "name": "looped_moe"})
    run = sweep / "runs" / "lmoe"
    assert train(cfg, str(run)) == 0
    assert loopscale(["eval", f"--workdir={run}", "--what=early_exit,jsd,routing",
                      "--batches=1"]) == 0
    return sweep


def test_frontiers_exponents_are_loopscale_fits(iso_sweep, tmp_path):
    flags = ["--bootstrap=20", "--grid=small", "--seed=3"]
    report = analyse(frontiers, iso_sweep, *flags)
    assert loopscale(["collect", str(iso_sweep), f"--out={tmp_path / 'results.csv'}"]) == 0
    assert loopscale(["fit", str(tmp_path / "results.csv"), f"--out={tmp_path / 'fit.json'}",
                      *flags]) == 0
    ours = json.loads((iso_sweep / "analysis" / "fit.json").read_text())
    theirs = json.loads((tmp_path / "fit.json").read_text())
    assert ours["families"] == theirs["families"]
    assert ours["comparison"] == theirs["comparison"]
    alpha_n = theirs["families"]["base"]["isoflop"]["alpha_N"]
    assert math.isfinite(alpha_n)
    assert rows_of(report, "base")[0][6].split()[0] == common.num(alpha_n)  # exponents: α_N


def test_frontiers_table7_and_missing(iso_sweep):
    report = analyse(frontiers, iso_sweep, "--bootstrap=0", "--grid=small")
    ee = json.loads((iso_sweep / "runs" / "lmoe" / "eval" / "early_exit.json").read_text())
    row = next(r for r in rows_of(report, "looped_moe") if r[1] == "lmoe" and len(r) == 9)
    assert row[4:] == [common.num(ee[k]) for k in
                       ("ppl_full", "ppl_at_5", "ppl_at_10", "ppl_at_20", "ppl_at_30")]
    routing = json.loads((iso_sweep / "runs" / "lmoe" / "eval" / "routing.json").read_text())
    assert any(r[4] == common.num(routing["identical_mean"]) for r in rows_of(report, "looped_moe"))
    # JSD after every layer, as eval/jsd.json measured it (looped or not).
    jsd = json.loads((iso_sweep / "runs" / "lmoe" / "eval" / "jsd.json").read_text())
    row = next(r for r in rows_of(report, "looped_moe") if r[1] == "lmoe" and len(r) == 7)
    assert row[4] == ", ".join(common.num(v, 3) for v in jsd["depth_mean"])
    assert row[6] == common.num(jsd["first_converged_fraction_mean"], 3)
    # The Base runs were never evaluated: named as missing, the rest of the report intact.
    assert "Missing for 6 run(s) (no eval/early_exit.json)" in report
    assert "Missing for 6 run(s) (no eval/jsd.json)" in report
    pngs = list((iso_sweep / "analysis").glob("*.png"))
    assert {p.stem for p in pngs} == {"frontiers", "isoflop", "loss_vs_params", "early_exit",
                                      "jsd", "routing"}
    assert all(p.stat().st_size < 150_000 for p in pngs)


# ------------------------------------------------------------------------------- permutation


@pytest.fixture(scope="module")
def perm_sweep(tmp_path_factory):
    """One tiny looped permutation run measured by accuracy, lens and patching (not probes), and
    five copies of its config with known accuracies in summary.json (seeds 1-5)."""
    sweep = tmp_path_factory.mktemp("perm") / "sweep"
    cfg = parse(load_config("experiments/permutation.py:tiny", [
        "--config.name=looped", "--config.train.steps=3", "--config.train.checkpoint_every=0",
        "--config.model.n_unique=1",
        "--config.train.eval_every=0", "--config.model.d_model=32", "--config.data.n_nodes=8",
        "--config.data.hops_min=2", "--config.data.hops_max=3", "--config.train.eval_batches=2"]))
    real = sweep / "runs" / "real"
    assert train(cfg, str(real)) == 0
    assert loopscale(["eval", f"--workdir={real}", "--what=accuracy,lens,patching"]) == 0
    config = json.loads((real / "config.json").read_text())
    for seed, acc in enumerate((0.95, 0.9, 0.899, 0.2, None), start=1):
        run = sweep / "runs" / f"seed{seed}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({**config, "seed": seed}))
        summary = {"status": "completed" if acc is not None else "running",
                   "final_eval_accuracy": acc}
        (run / "summary.json").write_text(json.dumps(summary))
    return sweep


def test_success_table_counts_the_runs_at_the_threshold(perm_sweep):
    report = analyse(permutation, perm_sweep, "--threshold=0.9")
    measured = json.loads((perm_sweep / "runs" / "real" / "eval" / "accuracy.json").read_text())
    real_ok = measured["accuracy"] >= 0.9
    assert f"{2 + real_ok} of 5 measured runs succeed." in report
    assert rows_of(report, "looped")[0][4] == f"{2 + real_ok} / 5"
    assert rows_of(report, "seed2")[0][-1] == "yes" and rows_of(report, "seed3")[0][-1] == "no"
    (real,) = rows_of(report, "real")[:1]
    assert real[7:11] == [common.num(measured["accuracy"]), common.num(measured["shortcut"]),
                          real[9], "eval/accuracy.json"]
    assert rows_of(report, "seed5")[0][-1] == "?"
    assert "Missing for 1 run(s) (no accuracy" in report and "looped/seed5" in report
    lens = json.loads((perm_sweep / "runs" / "real" / "eval" / "lens.json").read_text())
    ladder = next(r for r in rows_of(report, "looped") if r[1:3] == ["real", "lens"])
    assert ladder[3:5] == [common.num(lens["ladder_match"]), common.num(lens["diagonal"])]
    assert next(r for r in rows_of(report, "looped") if r[1:3] == ["real", "probes"])[3] == \
        "not measured"
    if lens["at_chance"]:  # this tiny run's answers: no ladder is scored or drawn, and why
        assert not (perm_sweep / "analysis" / "ladder_real.png").exists()
        assert "No ladder drawn or scored (at chance)" in report and lens["at_chance_reason"] in report
    else:
        assert (perm_sweep / "analysis" / "ladder_real.png").stat().st_size < 150_000
    assert (perm_sweep / "analysis" / "patching_real.png").exists()
    # A higher threshold: none of the known runs succeeds.
    report = analyse(permutation, perm_sweep, "--threshold=0.99")
    assert f"{int(measured['accuracy'] >= 0.99)} of 5 measured runs succeed." in report


# ------------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, flt_sweep, perm_sweep):
    (tmp_path / "empty").mkdir()
    (tmp_path / "planned" / "runs").mkdir(parents=True)
    for script, workdir, phrase in (
            (flt_stability, tmp_path / "nope", "no such directory"),
            (frontiers, tmp_path / "empty", "not a sweep directory"),
            (permutation, tmp_path / "planned", "holds no trained runs"),
            (permutation, flt_sweep, "does not train on the permutation task"),
            (permutation, perm_sweep, "--runs: no trained run nope")):
        capsys.readouterr()
        before = sorted(p.name for p in Path(workdir).glob("*")) if Path(workdir).exists() else None
        assert script.main([f"--workdir={workdir}", f"--out={tmp_path / 'out'}",
                            *(["--runs=nope"] if workdir == perm_sweep else [])]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and phrase in err[0], err
        assert not (tmp_path / "out").exists()
        after = sorted(p.name for p in Path(workdir).glob("*")) if Path(workdir).exists() else None
        assert before == after
    # As the scripts are run: a file given as the workdir.
    r = subprocess.run([sys.executable, str(ANALYSIS / "frontiers.py"),
                        f"--workdir={OLD_SWEEP / 'plan.csv'}"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "frontiers.py: error: --workdir" in r.stderr
