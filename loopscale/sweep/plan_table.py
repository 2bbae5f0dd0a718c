"""A plan's runs and its table: `PlannedRun` (one run, as every launcher starts it), `Plan`
(a sweep's runs and the planner's notes), and plan.csv: its columns (a contract: collect, fit
and users read them), written atomically and read back. The planner that makes them is
plan.py; the runner, the launchers, collect and the progress report need only this.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import io
from collections.abc import Sequence
from typing import Any

from etils import epath

from loopscale.config import Config
from loopscale.job import TrainJob
from loopscale.sweep.schema import Overrides, Sweep

# The plan table's columns, in order (a contract: collect, fit and users read them). Grid
# fields of the sweep are added after SHAPE_COLUMNS under their dotted names. params_once,
# params_rec, params_rec_active: the recurrence law's split of the parameters (flops.py);
# flops_6n_attn: the run's point (`tokens`) under the 6n_attn convention, beside `flops` under
# the sweep's own.
SHAPE_COLUMNS = ("d_model", "n_heads", "n_unique", "n_loops", "effective_depth", "ffn")
PLAN_COLUMNS = (
    "run_id", "family", "budget", *SHAPE_COLUMNS, "params", "params_unique", "params_effective",
    "params_active", "params_embedding", "params_once", "params_rec", "params_rec_active",
    "flop_convention", "flops_per_token", "tokens", "steps",
    "batch_size", "seq_len", "lr", "seed", "flops", "flops_6n_attn", "flops_over_budget",
    "est_device_hours",
    "chips", "est_step_time_s", "role", "branch_of", "branch_step", "flops_spent",
    "experiment", "overrides",
)


class Role(enum.Enum):
    """What a planned run is for (the plan's `role` column)."""

    RUN = "run"  # one (size, budget) point, trained on its own
    TRUNK = "trunk"  # a size at constant LR to its largest branch point; no point of its own
    BRANCH = "branch"  # one (size, budget) point: a cooldown from its trunk's checkpoint


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    run_id: str
    family: str
    budget: float | None
    experiment: str
    overrides: Overrides  # (dotted field, value), each field once
    config: Config
    row: dict  # the plan table's row
    measure: tuple[str, ...] = ()  # `loopscale eval` measurements once it completes

    def job(self, rundir: str) -> TrainJob:
        """This run trained in `rundir`: what every launcher runs, as a warm worker's request
        or as the arguments of `loopscale train` (`train_args`)."""
        return TrainJob(self.experiment, rundir,
                        tuple(f"--config.{k}={format_value(v)}" for k, v in self.overrides),
                        ",".join(self.measure))

    def train_args(self, rundir: str) -> list[str]:
        """The arguments of `loopscale train` for this run in `rundir` (every launcher's)."""
        return self.job(rundir).argv()


@dataclasses.dataclass(frozen=True)
class Plan:
    sweep: Sweep
    runs: tuple[PlannedRun, ...]
    notes: tuple[str, ...]  # what the planner left out or warns about, one line each


def format_value(value: Any) -> str:
    """An override value as ml_collections parses it back (tuples as Python literals)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    return str(value)


def write_rows(rows: Sequence[dict], path: str, first: Sequence[str] = PLAN_COLUMNS) -> None:
    """Writes a table of dicts as CSV, `first` columns first (atomically: a reader never sees
    half a table)."""
    from loopscale.files import write_atomic

    columns = table_columns(rows, first)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})
    write_atomic(path, out.getvalue())


def write_csv(runs: Sequence[PlannedRun] | Sequence[dict], path: str) -> None:
    """Writes the plan table."""
    write_rows([r.row if isinstance(r, PlannedRun) else r for r in runs], path)


def table_columns(rows: Sequence[dict], first: Sequence[str] = PLAN_COLUMNS) -> list[str]:
    """The known columns in their order, then any others (grid fields) where they first occur."""
    columns = list(first)
    extra = [k for row in rows for k in row if k not in columns]
    extra = list(dict.fromkeys(extra))
    anchor = columns.index("ffn") + 1 if "ffn" in columns else len(columns)
    return columns[:anchor] + extra + columns[anchor:]


def read_csv(path: str) -> list[dict]:
    """The rows of a plan table, local or on gs://."""
    return list(csv.DictReader(io.StringIO(epath.Path(path).read_text(), newline="")))
