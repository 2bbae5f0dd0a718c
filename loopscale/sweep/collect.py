"""`collect`: one results row per run, from sweep or run directories (local or gs://).

A row is the run's plan row (run.json beside the run, else DIR/plan.csv, else rebuilt from the
run's config.json) plus what its summary.json says. Every planned run is a row, whatever its
state: `pending` (never started), `running` (training, or interrupted), `completed`,
`diverged`, `failed`; nothing is dropped. Columns, besides the plan's:

    status            pending | running | completed | diverged | failed
    loss              = final_eval_loss (what `loopscale fit` fits; empty unless completed,
                      and for a cooldown trunk, whose branches are the grid's points)
    final_eval_loss, best_eval_loss, wall_time_s     from summary.json
    final_eval_accuracy  the permutation task's held-out answer accuracy (summary.json)
    tokens, flops     actually spent (summary.json); the plan's figures are planned_tokens,
                      planned_flops
    steps_done        optimizer steps taken
    params            the sweep's chosen parameter count (shape.params, params_active unless
                      the sweep says otherwise); params_unique, params_effective, params_active
                      are all there for `loopscale fit --params-column`
    params_once, params_rec, params_rec_active, n_loops
                      the recurrence law's inputs (flops.py, scaling/recurrence.py): the
                      parameters used once, the looped block's (stored; active per token),
                      the loop count; from the run's config.json when its plan row predates
                      these columns
    flops_6n_attn     the compute under the 6n_attn convention, from the tokens actually
                      spent (empty while none are); `flops` is under the sweep's convention
    attempts          launches the local runner recorded (failed or interrupted ones included)
    NAME_KEY          each top-level number of the run's eval/NAME.json (`loopscale eval`),
                      e.g. ppl_loss, loops_loss_at_trained (with the grid fields, after
                      the shape columns)
    workdir           the run directory
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence

from etils import epath

from loopscale.errors import UsageError
from loopscale.files import read_json
from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import read_config, read_evals, read_summary
from loopscale.rundir.status import RunStatus
from loopscale.sweep.plan_table import PLAN_COLUMNS, write_rows

RESULT_COLUMNS = (
    "run_id", "family", "budget", "status", "loss", "params", "params_unique",
    "params_effective", "params_active", "tokens", "flops", "final_eval_loss", "best_eval_loss",
    "final_eval_accuracy",
    "wall_time_s", "steps_done", "planned_tokens", "planned_flops",
    *[c for c in PLAN_COLUMNS if c not in ("run_id", "family", "budget", "params",
                                            "params_unique", "params_effective", "params_active",
                                            "tokens", "flops")],
    "attempts", "workdir",
)
# What every row carries even when its plan row is older than these columns.
RECURRENCE_COUNTS = ("params_once", "params_rec", "params_rec_active", "n_loops")


def _plan_rows(sweep_dir: epath.Path) -> list[dict]:
    path = sweep_dir / "plan.csv"
    if not path.exists():
        return []
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _row_from_config(rundir: epath.Path) -> dict | None:
    """A plan row for a run directory that has no run.json (trained by `loopscale train`)."""
    from loopscale.sweep.plan import plan_row

    raw = read_json(rundir / "config.json")
    if raw is None:
        return None
    try:
        config = read_config(rundir)
    except UsageError:  # a config loopscale cannot read any more: keep what the summary says
        return {"run_id": rundir.name, "family": raw.get("name", "")}
    return plan_row(config, family=config.name, budget=None, params_key="params_active")


def _number(value) -> float | None:
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None  # "nan"/"inf" strings from a diverged summary parse; others do not
    return x if math.isfinite(x) else None


def _attn_flops_per_token(plan: dict) -> float | None:
    """The 6n_attn FLOPs per token of a plan row that has flops_6n_attn (its planned point)."""
    attn, tokens = _number(plan.get("flops_6n_attn")), _number(plan.get("tokens"))
    return attn / tokens if attn is not None and tokens else None


def _recurrence_fields(plan: dict, rundir: epath.Path) -> tuple[dict, float | None]:
    """(RECURRENCE_COUNTS, 6n_attn FLOPs per token) of a run: from its plan row, or for a row
    planned before those columns existed, from its config.json (nothing when it has none)."""
    counts = {k: plan.get(k) for k in RECURRENCE_COUNTS}
    per_token = _attn_flops_per_token(plan)
    if per_token is not None and all(_number(v) is not None for v in counts.values()):
        return counts, per_token
    if not (rundir / "config.json").exists():
        return counts, per_token
    from loopscale import flops as flops_lib
    from loopscale.config import FlopConvention

    try:
        config = read_config(rundir)
    except UsageError:  # a config loopscale cannot read any more: leave the columns empty
        return counts, per_token
    m = config.model
    p = flops_lib.param_counts(m)
    counts = {k: m.n_loops if k == "n_loops" else p[k] for k in RECURRENCE_COUNTS}
    return counts, flops_lib.flops_per_token(m, config.train.seq_len, FlopConvention.ATTENTION)


def result_row(plan: dict, rundir: epath.Path) -> dict:
    """The plan row merged with the run's summary.json."""
    row = dict(plan)
    row["planned_tokens"] = row.pop("tokens", None)
    row["planned_flops"] = row.pop("flops", None)
    counts, attn_per_token = _recurrence_fields(plan, rundir)
    row.update(counts)
    summary = read_summary(rundir) or {}
    row["status"] = RunStatus.of(summary).value
    for key in ("final_eval_loss", "best_eval_loss", "final_eval_accuracy", "tokens", "flops",
                "wall_time_s"):
        row[key] = _number(summary.get(key))
    row["steps_done"] = summary.get("steps")
    spent = row["tokens"]
    row["flops_6n_attn"] = spent * attn_per_token if spent and attn_per_token else None
    # A cooldown trunk is no point of the IsoFLOP grid (its branches are): no loss to fit.
    point = row.get("role") != "trunk"
    row["loss"] = row["final_eval_loss"] if row["status"] == RunStatus.COMPLETED and point else None
    row["attempts"] = len(rundirs.attempts(rundir))
    row.update(read_evals(rundir))  # eval/NAME.json figures as NAME_KEY columns
    row["workdir"] = str(rundir)
    return row


def is_sweep_dir(directory: str) -> bool:
    """A sweep directory holds plan.csv and/or runs/ (local or gs://)."""
    top = epath.Path(directory)
    return (top / "plan.csv").exists() or (top / "runs").is_dir()


def collect_dir(directory: str) -> list[dict]:
    """Rows of one sweep directory (plan.csv and/or runs/*) or of one run directory."""
    top = epath.Path(directory)
    if not top.exists():
        raise UsageError(f"no such directory: {directory}")
    runs_dir = top / "runs"
    planned = _plan_rows(top)
    if not is_sweep_dir(directory):
        if rundirs.is_run_dir(top):
            plan = read_json(top / rundirs.RUN_ROW) or _row_from_config(top) or {"run_id": top.name}
            return [result_row(plan, top)]
        raise UsageError(f"{directory}: neither a sweep directory (plan.csv, runs/) "
                         "nor a run directory (summary.json, config.json)")
    rows, seen = [], set()
    for plan in planned:
        rundir = runs_dir / plan["run_id"]
        # run.json is what the run was launched with; plan.csv may be a newer plan.
        rows.append(result_row(read_json(rundir / rundirs.RUN_ROW) or plan, rundir))
        seen.add(plan["run_id"])
    # Runs of an earlier plan of this directory, or started by hand: rows too, never dropped.
    extra = sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.exists() else []
    for rundir in extra:
        if rundir.name in seen or not rundirs.is_run_dir(rundir):
            continue
        plan = read_json(rundir / rundirs.RUN_ROW) or _row_from_config(rundir)
        rows.append(result_row(plan or {"run_id": rundir.name}, rundir))
    return rows


def collect(directories: Sequence[str]) -> list[dict]:
    return [row for d in directories for row in collect_dir(d)]


def write_results(rows: Iterable[dict], path: str) -> None:
    write_rows(list(rows), path, RESULT_COLUMNS)


def status_counts(rows: Iterable[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def summary_line(rows: Sequence[dict], out: str) -> str:
    """What `loopscale collect` says once it has written `rows` to `out`."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(status_counts(rows).items()))
    return f"wrote {out}: {len(rows)} runs ({counts or 'none'})"


TABLE_NAMES = ("results.csv", "results.parquet")


def find_table(source: str) -> str:
    """The table to read: `source` itself, or the results table inside a directory."""
    top = epath.Path(source)
    if not top.is_dir():
        if not top.exists():
            raise UsageError(f"no such table or directory: {source}")
        return source
    for name in TABLE_NAMES:
        if (top / name).is_file():
            return os.path.join(source, name)
    raise UsageError(f"{source} is neither a sweep directory (plan.csv, runs/) nor a directory "
                     "holding results.csv (or results.parquet)")


def results_table(source: str, columns):
    """The results table (scaling/table.py) of a sweep directory, its runs read now, or of a
    table file, or of the results table inside a directory (`loopscale report`'s input)."""
    import pandas as pd

    from loopscale.scaling.table import prepare_table, read_table

    if not is_sweep_dir(source):
        return read_table(find_table(source), columns)
    rows = collect_dir(source)
    if not rows:
        raise UsageError(f"{source}: the sweep directory holds no runs yet")
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))  # the columns collect writes
    return prepare_table(frame, columns, source=os.path.basename(os.path.abspath(source)))
