"""collect: a row for every planned run whatever its state (pending, running, completed,
diverged, failed), runs outside the plan too, and a table `loopscale fit` reads directly."""

import csv
import json
import os
import subprocess
import sys

import pytest
import sweepkit

from loopscale.cli import main
from loopscale.sweep.collect import collect
from loopscale.rundir.sweep import run_dir

# A sweep's runs see one CPU device, as on a user's machine (conftest.py).
pytestmark = pytest.mark.usefixtures("runs_on_one_device")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("sweep"))
    return workdir, sweepkit.write_law_sweep(workdir)


def test_every_run_is_a_row_with_its_status(sweep_dir):
    workdir, runs = sweep_dir
    rows = collect([workdir])
    assert [r["run_id"] for r in rows] == [r.run_id for r in runs]
    statuses = [r["status"] for r in rows]
    assert statuses[:4] == ["pending", "running", "diverged", "failed"]
    assert set(statuses[4:]) == {"completed"}
    done = rows[5 + 4]
    assert done["loss"] == done["final_eval_loss"] and done["tokens"] == int(done["planned_tokens"])
    assert rows[2]["loss"] is None and rows[2]["best_eval_loss"] == 4.2  # diverged: no fit loss
    assert rows[0]["tokens"] is None and rows[0]["attempts"] == 0
    for key in ("params", "params_unique", "params_effective", "params_active", "budget",
                "family", "d_model", "steps", "lr", "seed", "wall_time_s"):
        assert key in rows[4]
    assert rows[4]["params"] == rows[4]["params_active"]  # the sweep's shape.params


def test_runs_outside_the_plan_are_kept(sweep_dir, tmp_path):
    workdir, runs = sweep_dir
    # A run directory `loopscale train` wrote by hand (config.json and summary.json only).
    stray = os.path.join(workdir, "runs", "handmade")
    os.makedirs(stray)
    config = runs[5].config
    from loopscale.files import to_json

    with open(os.path.join(stray, "config.json"), "w") as f:
        json.dump(to_json(config), f)
    with open(os.path.join(stray, "summary.json"), "w") as f:
        json.dump({"status": "running"}, f)
    try:
        rows = collect([workdir])
        extra = [r for r in rows if r["workdir"].endswith("handmade")]
        assert len(rows) == len(runs) + 1 and len(extra) == 1
        assert extra[0]["status"] == "running" and extra[0]["family"] == config.name
        assert extra[0]["params_active"] == runs[5].row["params_active"]
        # A single run directory is a table of one row.
        (row,) = collect([stray])
        assert row["run_id"] == runs[5].run_id
    finally:
        import shutil

        shutil.rmtree(stray)


def test_collect_then_fit(sweep_dir, tmp_path):
    workdir, runs = sweep_dir
    out = tmp_path / "results.csv"
    r = subprocess.run([sys.executable, "-m", "loopscale.cli", "collect", workdir,
                        f"--out={out}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1 diverged" in r.stdout and "1 pending" in r.stdout and "1 failed" in r.stdout
    with open(out) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(runs)
    assert list(table[0])[:5] == ["run_id", "family", "budget", "status", "loss"]
    fit = subprocess.run([sys.executable, "-m", "loopscale.cli", "fit", str(out),
                          f"--out={tmp_path / 'fit.json'}", "--bootstrap=0", "--grid=small"],
                         capture_output=True, text=True)
    assert fit.returncode == 0, fit.stderr
    doc = json.loads((tmp_path / "fit.json").read_text())
    assert set(doc["families"]) == {"base", "looped", "moe", "looped_moe"}
    assert {e["status"] for e in doc["excluded"]} == {None, "running", "diverged", "failed",
                                                      "pending"} - {None}


def test_collect_refuses_a_directory_without_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "loopscale.cli", "collect", str(tmp_path),
                        f"--out={tmp_path / 'r.csv'}"], capture_output=True, text=True)
    assert r.returncode == 2 and "neither a sweep directory" in r.stderr


def test_report_reads_a_sweep_directory_as_collect_does(sweep_dir, tmp_path):
    """`loopscale report DIR` on the run directories == report on the table collect writes."""
    workdir, runs = sweep_dir
    table = tmp_path / "results.csv"
    assert main(["collect", workdir, f"--out={table}"]) == 0
    flags = ["--bootstrap=0", "--grid=small", "--params-column=params_active"]
    assert main(["report", workdir, f"--out={tmp_path / 'from_dir'}", *flags]) == 0
    assert main(["report", str(table), f"--out={tmp_path / 'from_table'}", *flags]) == 0
    from_dir, from_table = (json.loads((tmp_path / d / "fit.json").read_text())
                            for d in ("from_dir", "from_table"))
    assert from_dir["families"] == from_table["families"]
    assert from_dir["excluded"] == from_table["excluded"] and len(from_dir["excluded"]) >= 4
    assert not os.path.exists(os.path.join(workdir, "results.csv"))  # nothing written there


RECURRENCE = ("params_once", "params_rec", "params_rec_active", "n_loops")


def test_rows_carry_the_recurrence_inputs_also_for_old_plans(sweep_dir, tmp_path):
    """Every row has params_once/params_rec/params_rec_active/n_loops and flops_6n_attn (from
    the tokens spent); a run planned before those columns existed gets them from config.json."""
    from loopscale import flops as flops_lib
    from loopscale.config import FlopConvention
    from loopscale.files import to_json

    workdir, runs = sweep_dir
    rows = {r["run_id"]: r for r in collect([workdir])}
    for run in runs:
        row = rows[run.run_id]  # a pending run's row is plan.csv's: strings
        assert {k: int(row[k]) for k in RECURRENCE} == {k: run.row[k] for k in RECURRENCE}
        if row["status"] == "completed":
            attn = flops_lib.flops_per_token(run.config.model, run.config.train.seq_len,
                                             FlopConvention.ATTENTION)
            assert row["flops_6n_attn"] == pytest.approx(row["tokens"] * attn, rel=1e-12)
            assert row["flops_6n_attn"] > row["flops"] * 0.999  # 6n_attn counts attention too
        elif row["tokens"] is None:
            assert row["flops_6n_attn"] is None
    looped = [r.row for r in runs if r.config.model.n_loops > 1]
    assert looped and all(r["params_once"] + r["params_rec"]
                          == r["params_unique"] + r["params_embedding"] for r in looped)

    # An older sweep: plan.csv and run.json without the new columns, config.json beside.
    old_dir = str(tmp_path / "old")
    new_columns = (*RECURRENCE[:3], "flops_6n_attn")
    picked = [r for r in runs if r.config.model.n_loops > 1][:1] + [
        r for r in runs if r.config.model.n_loops == 1][:1]
    old_rows = [{k: v for k, v in r.row.items() if k not in new_columns} for r in picked]
    os.makedirs(old_dir)
    columns = [c for c in old_rows[0] if c not in new_columns]
    with open(os.path.join(old_dir, "plan.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(old_rows)
    spent = []
    for run, old in zip(picked, old_rows):
        rundir = run_dir(old_dir, run.run_id)
        os.makedirs(rundir)
        with open(os.path.join(rundir, "run.json"), "w") as f:
            json.dump(old, f)
        with open(os.path.join(rundir, "config.json"), "w") as f:
            json.dump(to_json(run.config), f)
        tokens = run.row["tokens"] // 2  # stopped half way: flops_6n_attn follows the tokens
        spent.append(tokens)
        with open(os.path.join(rundir, "summary.json"), "w") as f:
            json.dump({"status": "completed", "final_eval_loss": 3.0, "steps": 1,
                       "tokens": tokens, "flops": 1.0}, f)
    got = collect([old_dir])
    for run, row, tokens in zip(picked, got, spent):
        assert {k: row[k] for k in RECURRENCE} == {k: run.row[k] for k in RECURRENCE}
        attn = run.row["flops_6n_attn"] / run.row["tokens"]
        assert row["flops_6n_attn"] == pytest.approx(tokens * attn, rel=1e-12)

    # What `loopscale fit` reads from a sweep directory carries them, and the law fits on it.
    from loopscale.scaling import recurrence
    from loopscale.scaling.table import Columns
    from loopscale.sweep.collect import results_table

    table = results_table(workdir, Columns())
    assert table.has_recurrence and table.has_flops_attn
    doc = recurrence.recurrence_json(table)
    json.dumps(doc, allow_nan=False)
    assert "phi" in doc or "skipped" in doc
