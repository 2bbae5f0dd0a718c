"""The run directory: config.json, metrics.jsonl, summary.json, TensorBoard events.

Paths are etils.epath paths, so a workdir may be local or any filesystem epath understands
(gs://...). Files are written by process 0 only.

- config.json: the resolved config (every field, after overrides).
- metrics.jsonl: one JSON object per logged step (training) or per evaluation (`eval_loss`).
  On resume, rows past the restored checkpoint's step are dropped before training goes on,
  so every step appears exactly once.
- summary.json: status and results, replaced atomically (written to a temporary name, then
  renamed), so a reader never sees half a file.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

from etils import epath

STATUSES = ("running", "completed", "diverged", "failed")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy and jax arrays and scalars
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them readable
    return value


def write_json_atomic(path: epath.Path, data: dict) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    tmp.replace(path)  # atomic on a local filesystem; overwrites


def read_json(path: epath.Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


class RunDirectory:
    def __init__(self, workdir: str | epath.Path, write: bool = True):
        self.path = epath.Path(workdir)
        self.write = write  # False on processes other than 0
        if write:
            self.path.mkdir(parents=True, exist_ok=True)
        self._metrics = None
        self._tb = None

    @property
    def checkpoint_dir(self) -> epath.Path:
        return self.path / "checkpoints"

    @property
    def summary_path(self) -> epath.Path:
        return self.path / "summary.json"

    @property
    def metrics_path(self) -> epath.Path:
        return self.path / "metrics.jsonl"

    def summary(self) -> dict | None:
        return read_json(self.summary_path)

    def write_config(self, config: Any) -> None:
        if self.write:
            write_json_atomic(self.path / "config.json", _jsonable(config))

    def write_summary(self, summary: dict) -> None:
        if self.write:
            write_json_atomic(self.summary_path, summary)

    def open_metrics(self, resume_step: int) -> list[dict]:
        """Keeps the rows up to `resume_step` (those the checkpoint has seen) and returns them."""
        kept = []
        if self.metrics_path.exists():
            for line in self.metrics_path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
                if row.get("step", 0) <= resume_step:
                    kept.append(row)
        if self.write:
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            self._metrics = self.metrics_path.open("a")
        return kept

    def log(self, row: dict) -> None:
        if not self.write:
            return
        row = _jsonable(row)
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        self._tensorboard(row)

    def _tensorboard(self, row: dict) -> None:
        if self._tb is None:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tensorboard"))
        step = row["step"]
        for key, value in row.items():
            if key == "step":
                continue
            if isinstance(value, (int, float)):
                self._tb.add_scalar(key, value, step)
            elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                for i, v in enumerate(value):  # per-loop values: one curve per loop
                    self._tb.add_scalar(f"{key}/{i + 1}", v, step)

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
