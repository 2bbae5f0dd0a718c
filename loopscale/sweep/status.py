"""A sweep's state at a glance (`loopscale status --workdir=DIR`), read from what the runner and
the runs keep on disk (rundir/sweep.py): DIR/plan.csv and every DIR/runs/RUN_ID/.

Each planned run is in one state:
- `done`: completed (summary.json);
- `diverged`: a result, never retried, but worth a look;
- `failed`: the machine failed its last launch (resumable; the runner retries it);
- `running`: a process holds its run.lock now (on gs://, which has no locks: its metrics.jsonl
  was written within HEARTBEAT_S);
- `stopped`: started (summary says running) but no process holds it: a killed runner or a
  SIGTERM; the next `loopscale sweep` resumes it;
- `pending`: never started.
FLOPs spent count each run's own steps (a cooldown branch's from its branch point, as the plan's
`flops_spent` does): all of a finished run's, the logged share of a started one's. The ETA is
the remaining steps of every unfinished run at the step time its own last logged row shows (the
median of the runs that logged one, for those that have not), divided by the runs training at
once now (at least one).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections import defaultdict

from etils import epath

from loopscale.errors import UsageError
from loopscale.files import is_local
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import METRICS, last_metrics_row
from loopscale.rundir.status import RunStatus
from loopscale.sweep.plan_table import read_csv

STATES = ("done", "running", "stopped", "failed", "diverged", "pending")
# States that need a person: a diverged result to look at, a failure, a run left stopped.
ATTENTION = ("failed", "diverged", "stopped")


@dataclasses.dataclass(frozen=True)
class RunState:
    run_id: str
    family: str
    budget: str  # as the plan writes it ("" for a run without a budget)
    state: str
    steps_done: int  # the run's own steps (a branch's from its branch point)
    steps_planned: int
    flops_planned: float  # the plan's flops_spent
    loss: float | None  # the last logged training loss
    step_time_s: float | None  # the last logged step time

    @property
    def flops_spent(self) -> float:
        if self.state in ("done", "diverged"):
            return self.flops_planned
        return self.flops_planned * min(1.0, self.steps_done / max(1, self.steps_planned))


# On an object store there are no locks: a run is taken to be training while its metrics.jsonl
# was written within this long (the trainer writes it there at least every 30 s and at every
# checkpoint: rundir/run.MetricsFile).
HEARTBEAT_S = 600.0


def _is_training(rundir: str) -> bool:
    """Whether a process trains the run now: on a local disk, whether it holds the run's
    run.lock (taken and given straight back if not); on gs://, whether metrics.jsonl is fresh."""
    if not is_local(rundir):
        metrics = epath.Path(rundir) / METRICS
        return metrics.exists() and time.time() - metrics.stat().mtime < HEARTBEAT_S
    if not os.path.exists(os.path.join(rundir, rundirs.RUN_LOCK)):
        return False
    fd = rundirs.try_lock_run(rundir)
    if fd is None:
        return True
    os.close(fd)
    return False


def _state(rundir: str) -> str:
    status = rundirs.status(rundir)
    if status is RunStatus.COMPLETED:
        return "done"
    if status is RunStatus.DIVERGED:
        return "diverged"
    if _is_training(rundir):
        return "running"
    return {RunStatus.FAILED: "failed", RunStatus.RUNNING: "stopped"}.get(status, "pending")


def run_state(workdir: str, row: dict) -> RunState:
    rundir = rundirs.run_dir(workdir, row["run_id"])
    start = int(float(row.get("branch_step") or 0))
    planned = int(float(row["steps"])) - start
    last = last_metrics_row(rundir, having="loss")
    done = max(0, int(last["step"]) - start) if last else 0
    return RunState(row["run_id"], row["family"], row.get("budget", ""), _state(rundir), done,
                    planned, float(row.get("flops_spent") or row["flops"]),
                    last.get("loss") if last else None, last.get("step_time_s") if last else None)


def read(workdir: str) -> list[RunState]:
    """Every planned run's state; UsageError for a workdir with no plan.csv."""
    plan = os.path.join(workdir, "plan.csv")
    if not epath.Path(plan).exists():
        raise UsageError(f"{workdir} holds no sweep (no plan.csv): run `loopscale sweep` first")
    return [run_state(workdir, row) for row in read_csv(plan)]


def _group_order(item) -> tuple[str, float]:
    """By family, then budget in FLOPs (trunks, which have none, first): not as strings,
    which put 1e+18 before 2e+17."""
    (family, budget), _ = item
    return family, float(budget) if budget else -1.0


def summary(runs: list[RunState]) -> dict:
    """Counts per (family, budget) and in all, FLOPs spent against the plan, the ETA and the
    runs that need attention: what the command prints (and writes with --json)."""
    groups: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATES, 0))
    total = dict.fromkeys(STATES, 0)
    for r in runs:
        groups[(r.family, r.budget)][r.state] += 1
        total[r.state] += 1
    timed = [r.step_time_s for r in runs if r.step_time_s]
    typical = statistics.median(timed) if timed else None
    left = [r for r in runs if r.state not in ("done", "diverged")]
    eta = None
    if typical is not None:
        seconds = sum(max(0, r.steps_planned - r.steps_done) * (r.step_time_s or typical)
                      for r in left)
        eta = seconds / max(1, total["running"])
    return {
        "runs": len(runs),
        "states": total,
        "groups": [{"family": f, "budget": b, **counts}
                   for (f, b), counts in sorted(groups.items(), key=_group_order)],
        "running": [{"run_id": r.run_id, "family": r.family, "budget": r.budget,
                     "step": r.steps_done, "of": r.steps_planned, "loss": r.loss}
                    for r in runs if r.state == "running"],
        "flops_spent": sum(r.flops_spent for r in runs),
        "flops_planned": sum(r.flops_planned for r in runs),
        "eta_s": eta,
        "attention": {state: [r.run_id for r in runs if r.state == state]
                      for state in ATTENTION if any(r.state == state for r in runs)},
    }


def lines(doc: dict) -> list[str]:
    """The summary as the command prints it."""
    head = f"{'family':<12} {'budget':>10} " + " ".join(f"{s:>8}" for s in STATES)
    out = [head]
    for g in doc["groups"]:
        out.append(f"{g['family']:<12} {g['budget'] or '-':>10} "
                   + " ".join(f"{g[s]:>8}" for s in STATES))
    out.append(f"{'all':<12} {'':>10} " + " ".join(f"{doc['states'][s]:>8}" for s in STATES))
    for r in doc["running"]:
        loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
        out.append(f"running {r['run_id']} ({r['family']} {r['budget'] or '-'}): step "
                   f"{r['step']}/{r['of']}, loss {loss}")
    share = doc["flops_spent"] / doc["flops_planned"] if doc["flops_planned"] else 0.0
    out.append(f"FLOPs spent {doc['flops_spent']:.3g} of {doc['flops_planned']:.3g} planned "
               f"({share:.0%})")
    eta = doc["eta_s"]
    out.append("ETA: unknown (no step timed yet)" if eta is None else
               f"ETA: {eta / 60:.1f} min at {max(1, doc['states']['running'])} run(s) at once")
    for state, ids in doc["attention"].items():
        out.append(f"attention, {state}: {' '.join(ids)}")
    return out
