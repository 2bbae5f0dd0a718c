"""`loopscale status`: a sweep directory with a run in every state, read back as counts per
family and budget, the running run's step and loss, FLOPs spent, the ETA and the runs that need
attention (loopscale/sweep/status.py)."""

import fcntl
import json
import os

import pytest

from loopscale.cli import main
from loopscale.rundir import sweep as rundirs
from loopscale.sweep import status
from loopscale.sweep.plan_table import write_rows

# run id -> (family, budget, summary status or None, [(step, loss, step time)], run.lock held)
RUNS = {
    "a": ("base", "1e10", "completed", [(s, 3.0 - 0.1 * s, 1.0) for s in range(1, 11)], False),
    "b": ("base", "1e10", "diverged", [(s, 3.0, 1.0) for s in range(1, 5)], False),
    "c": ("base", "1e10", "failed", [(5, 2.8, 2.0)], False),
    "d": ("looped", "1e10", "running", [(5, 2.7, 0.5), (6, 2.5, 0.5)], True),
    "e": ("looped", "1e10", "running", [(3, 2.9, 1.0)], False),
    "f": ("looped", "1e10", None, [], False),
    "g": ("base", "2e10", None, [], False),  # a cooldown branch from step 8 of 10
}


@pytest.fixture
def sweep(tmp_path):
    rows, held = [], []
    for run_id, (family, budget, state, logged, locked) in RUNS.items():
        branch = run_id == "g"
        rows.append({"run_id": run_id, "family": family, "budget": budget, "steps": 10,
                     "branch_step": 8 if branch else "", "flops": 100.0,
                     "flops_spent": 20.0 if branch else 100.0})
        rundir = rundirs.run_dir(str(tmp_path), run_id)
        if state is None:
            continue
        os.makedirs(rundir)
        with open(os.path.join(rundir, "summary.json"), "w") as f:
            json.dump({"status": state}, f)
        with open(os.path.join(rundir, "metrics.jsonl"), "w") as f:
            for step, loss, dt in logged:
                f.write(json.dumps({"step": step, "loss": loss, "step_time_s": dt}) + "\n")
            f.write(json.dumps({"step": logged[-1][0], "eval_loss": 9.9}) + "\n")  # not a train row
        if locked:  # as the process training it holds it
            fd = os.open(os.path.join(rundir, rundirs.RUN_LOCK), os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            held.append(fd)
    write_rows(rows, str(tmp_path / "plan.csv"))
    yield tmp_path
    for fd in held:
        os.close(fd)


def test_every_state_counted_with_flops_eta_and_attention(sweep):
    runs = {r.run_id: r for r in status.read(str(sweep))}
    assert {k: r.state for k, r in runs.items()} == {
        "a": "done", "b": "diverged", "c": "failed", "d": "running", "e": "stopped",
        "f": "pending", "g": "pending"}
    doc = status.summary(list(runs.values()))
    assert doc["states"] == {"done": 1, "running": 1, "stopped": 1, "failed": 1, "diverged": 1,
                             "pending": 2}
    assert doc["groups"] == [
        {"family": "base", "budget": "1e10", "done": 1, "running": 0, "stopped": 0, "failed": 1,
         "diverged": 1, "pending": 0},
        {"family": "base", "budget": "2e10", "done": 0, "running": 0, "stopped": 0, "failed": 0,
         "diverged": 0, "pending": 1},
        {"family": "looped", "budget": "1e10", "done": 0, "running": 1, "stopped": 1,
         "failed": 0, "diverged": 0, "pending": 1}]
    assert doc["running"] == [{"run_id": "d", "family": "looped", "budget": "1e10", "step": 6,
                               "of": 10, "loss": 2.5}]
    # done and diverged in full, started runs by their logged share, pending none
    assert doc["flops_spent"] == pytest.approx(100 + 100 + 50 + 60 + 30)
    assert doc["flops_planned"] == pytest.approx(6 * 100 + 20)
    # remaining steps x own step time (median 1.0 s of c, d, e for f and g), one run at once
    assert doc["eta_s"] == pytest.approx(5 * 2.0 + 4 * 0.5 + 7 * 1.0 + 10 * 1.0 + 2 * 1.0)
    assert doc["attention"] == {"failed": ["c"], "diverged": ["b"], "stopped": ["e"]}


def test_the_command_prints_the_table_and_json(sweep, capsys):
    assert main(["status", f"--workdir={sweep}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["family", "budget", *status.STATES]
    assert out[3].split() == ["looped", "1e10", "0", "1", "1", "0", "0", "1"]
    assert "running d (looped 1e10): step 6/10, loss 2.5000" in out
    assert "FLOPs spent 340 of 620 planned (55%)" in out
    assert "attention, stopped: e" in out
    assert main(["status", f"--workdir={sweep}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["states"]["pending"] == 2
    # reading wrote nothing: no directory appears for a pending run
    assert not os.path.exists(rundirs.run_dir(str(sweep), "f"))
