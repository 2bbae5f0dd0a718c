"""A run's status, the launches' outcomes and the exit codes: the words stages exchange.

The trainer writes a status into summary.json; the sweep runner, collect, report and the
evaluators read it back; generated launch scripts test the exit codes. One definition each.
"""

from __future__ import annotations

import enum


class RunStatus(str, enum.Enum):
    """summary.json's `status` (a `str` enum: it is the JSON value itself)."""

    PENDING = "pending"  # no summary.json yet: never started
    RUNNING = "running"  # training, or stopped (SIGTERM, a kill) and resumable
    COMPLETED = "completed"
    DIVERGED = "diverged"  # a result like any other: not fitted, never retried
    FAILED = "failed"  # the machine failed it (full disk, no checkpoint restores); resumable

    @property
    def done(self) -> bool:
        """Finished for good: running it again changes nothing."""
        return self in (RunStatus.COMPLETED, RunStatus.DIVERGED)

    @classmethod
    def of(cls, summary: dict | None) -> RunStatus:
        """The status a summary.json holds (PENDING when there is none)."""
        return cls(summary.get("status", cls.PENDING)) if summary else cls.PENDING


class ExitCode(enum.IntEnum):
    """`loopscale` exit statuses (every command; `train` uses all four)."""

    OK = 0  # also a run stopped cleanly by SIGTERM, to be resumed
    FAILED = 1  # the machine failed the run, or the step does not fit (compile)
    USAGE = 2  # bad input: never retried, it would fail the same way
    DIVERGED = 3


class LaunchOutcome(str, enum.Enum):
    """What one launch of a run came to, as the sweep runner records it in attempts.jsonl."""

    DONE = "done"  # the run is completed or diverged
    INTERRUPTED = "interrupted"  # the runner stopped it (its own SIGTERM): not counted
    FAILED = "failed"  # counted against the retry limit
