"""A sweep directory as the runner leaves it, written on any path etils.epath understands (a
local folder or gs://): the isoflop_cpu plan, most runs completed with losses from a
Chinchilla-style law, and one run in each other state."""

import json

from etils import epath

from loopscale.rundir.sweep import run_dir
from loopscale.sweep import load_sweep
from loopscale.sweep.plan import plan
from loopscale.sweep.plan_table import write_csv

# The first runs of the plan, in these states; the rest completed.
STATES = {0: "pending", 1: "running", 2: "diverged", 3: "failed"}


def law(n, d):
    return 1.7 + 40.0 / n ** 0.35 + 300.0 / d ** 0.35


def write_law_sweep(workdir: str):
    """Writes the sweep directory and returns the plan's runs."""
    runs = plan(load_sweep("sweeps/isoflop_cpu.py:full", ["--sweep.branches=False"])).runs
    write_csv(runs, f"{workdir}/plan.csv")
    for i, run in enumerate(runs):
        status = STATES.get(i, "completed")
        if status == "pending":
            continue
        rundir = epath.Path(run_dir(workdir, run.run_id))
        rundir.mkdir(parents=True)
        (rundir / "run.json").write_text(json.dumps(run.row))
        summary = {"status": status, "steps": run.row["steps"] // 2, "wall_time_s": 3.0}
        if status == "completed":
            loss = law(run.row["params"], run.row["tokens"])
            summary.update(final_eval_loss=loss, best_eval_loss=loss - 0.01,
                           steps=run.row["steps"], tokens=run.row["tokens"],
                           flops=run.row["flops"])
        if status == "diverged":
            summary.update(final_train_loss="nan", best_eval_loss=4.2)
        (rundir / "summary.json").write_text(json.dumps(summary))
        (rundir / "attempts.jsonl").write_text(json.dumps({"outcome": "done"}) + "\n")
    return runs
