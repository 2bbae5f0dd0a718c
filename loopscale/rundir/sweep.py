"""What a sweep keeps on disk, and how a run's state is read back from it.

    DIR/plan.csv                  the plan of the latest `loopscale sweep` (plan.PLAN_COLUMNS)
    DIR/sweep.lock                held (flock) by the one runner working on DIR
    DIR/jax_cache/                JAX's persistent compilation cache, shared by every run
    DIR/runs/RUN_ID/              the run directory `loopscale train` writes (summary.json, ...)
        run.json                  the run's plan row, so collect needs no plan.csv
        command.sh                the exact command that trains it (runnable by hand)
        attempts.jsonl            one line per finished launch: rc, status, outcome, times
        train.log                 the launches' stdout and stderr, appended
        run.lock                  held (flock) by the process training the run

The run's status is the trainer's summary.json (`running`, `completed`, `diverged`,
`failed`); a run with no summary yet is `pending`. A run is *done* when completed or diverged,
and *given up* when its failed launches exceed the retry limit (or one was bad input).
"""

from __future__ import annotations

import json
import os

from loopscale.files import write_text_atomic  # noqa: F401  (the sweep modules write through here)

DONE = ("completed", "diverged")
PENDING = "pending"


def run_dir(workdir: str, run_id: str) -> str:
    return os.path.join(workdir, "runs", run_id)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:  # summary.json is written atomically; others are best-effort
        return None


def status(rundir: str) -> str:
    summary = read_json(os.path.join(rundir, "summary.json"))
    return summary.get("status", PENDING) if summary else PENDING


def attempts(rundir: str) -> list[dict]:
    path = os.path.join(rundir, "attempts.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
    return out


def record_attempt(rundir: str, attempt: dict) -> None:
    with open(os.path.join(rundir, "attempts.jsonl"), "a") as f:
        f.write(json.dumps(attempt) + "\n")
        f.flush()
        os.fsync(f.fileno())


def failures(rundir: str) -> tuple[int, bool]:
    """(failed launches, whether one of them was bad input, which no retry can fix)."""
    failed = [a for a in attempts(rundir) if a.get("outcome") == "failed"]
    return len(failed), any(a.get("rc") == 2 for a in failed)


def given_up(rundir: str, max_retries: int) -> bool:
    n, bad_input = failures(rundir)
    return bad_input or n > max_retries


def last_row(path: str, max_bytes: int = 8192) -> dict | None:
    """The last complete JSON line of a (possibly growing) metrics.jsonl, read from its tail."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
    return None
