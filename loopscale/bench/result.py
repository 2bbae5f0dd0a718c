"""One row of the benchmark table: a figure, its measured ratio, its target, and the verdict.

A figure is a ratio measured side by side in one process (timing.py). `passed` follows from
the ratio and the target alone (`<=` or `>=`); a figure that could not be measured here has
no ratio, `status` says why not (`skipped`: something it needs is absent; `error`: it failed,
the one-line error in `note`), and no verdict. Absolute times and sizes go in `measured`.
"""

from __future__ import annotations

import dataclasses
import math
import operator

# status values
MEASURED, SKIPPED, ERROR = "measured", "skipped", "error"
_OPS = {"<=": operator.le, ">=": operator.ge}
REPORTED = "reported"  # a figure with no target: measured and shown, no verdict


@dataclasses.dataclass(frozen=True)
class Target:
    op: str  # "<=", ">=" or "reported" (no verdict)
    value: float | None
    text: str  # as the table prints it, e.g. "<= 1.05", ">= 70%", "reported; stretch <= 1.5"

    def met(self, ratio: float) -> bool | None:
        return None if self.op == REPORTED else _OPS[self.op](ratio, self.value)


def reported(text: str = REPORTED) -> Target:
    return Target(REPORTED, None, text)


@dataclasses.dataclass(frozen=True)
class Figure:
    key: str  # stable identifier, e.g. "scan_vs_unrolled"
    title: str  # what is divided by what
    target: Target
    ratio: float | None = None
    status: str = MEASURED
    note: str = ""  # how it was measured (or why it was not)
    measured: dict = dataclasses.field(default_factory=dict)  # absolute times, bytes, ...
    percent: bool = False  # print the ratio as a percentage
    unit: str = ""  # printed after the value, e.g. " s" for a figure in seconds

    @property
    def passed(self) -> bool | None:
        if self.status != MEASURED or self.ratio is None:
            return None
        return self.target.met(self.ratio)

    def to_json(self) -> dict:
        return {"key": self.key, "figure": self.title, "ratio": self.ratio,
                "target": {"op": self.target.op, "value": self.target.value,
                           "text": self.target.text},
                "passed": self.passed, "status": self.status, "note": self.note,
                "unit": self.unit.strip() or None, "measured": self.measured}


def measured(key: str, title: str, target: Target, ratio: float, note: str, measured: dict,
             percent: bool = False) -> Figure:
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"{key}: measured ratio {ratio} is not a positive finite number")
    return Figure(key, title, target, ratio, MEASURED, note, measured, percent)


def not_measured(key: str, title: str, target: Target, status: str, reason: str,
                 percent: bool = False) -> Figure:
    return Figure(key, title, target, None, status, reason, {}, percent)
