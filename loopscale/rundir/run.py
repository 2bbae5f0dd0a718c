"""The run directory: config.json, metrics.jsonl, summary.json, TensorBoard events.

Paths are etils.epath paths, so a workdir may be local or any filesystem epath understands
(gs://...). Files are written by process 0 only.

- config.json: the resolved config (every field, after overrides).
- metrics.jsonl: one JSON object per logged step (training) or per evaluation (`eval_loss`).
  On resume, rows past the restored checkpoint's step are dropped before training goes on,
  so every step appears exactly once.
- summary.json: status and results, replaced atomically (written to a temporary name, then
  renamed), so a reader never sees half a file.
- tensorboard/: the same rows as TensorBoard scalars, written synchronously (tensorboardX's
  SummaryWriter writes from a thread that dies on a write error, after which the run blocks
  forever on its full queue, SIGTERM included). On resume, the new events file opens with a
  purge marker at the first step to be logged again, so TensorBoard drops the old file's events
  from that step on and shows each step once, as metrics.jsonl does.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import errno
import math
import time
from typing import Any

from etils import epath

from loopscale.errors import UsageError

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


def _check_writable(path: epath.Path) -> None:
    """Creates the workdir and writes (then removes) a probe file there, so that a workdir that
    cannot hold a run (under a regular file, read-only, no permission) is a UsageError before
    any work is done, not a traceback after it."""
    probe = path / ".loopscale-write-probe"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        problem = e.strerror or errno.errorcode.get(e.errno, type(e).__name__)
        raise UsageError(f"workdir {path}: cannot write there ({problem})") from None


class RunDirectory:
    def __init__(self, workdir: str | epath.Path, write: bool = True):
        self.path = epath.Path(workdir)
        self.write = write  # False on processes other than 0
        if write:
            _check_writable(self.path)
        self._metrics = None
        self._tb = None
        self._purge_step: int | None = None

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
        """Keeps the rows up to `resume_step` (those the checkpoint has seen) and returns them;
        TensorBoard events past it are purged too (see the module docstring)."""
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
            self._purge_step = resume_step + 1  # even at 0: a run may have failed before a checkpoint
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
            self._tb = _Events(self.path / "tensorboard", self._purge_step)
        step = row["step"]
        for key, value in row.items():
            if key == "step":
                continue
            if isinstance(value, (int, float)):
                self._tb.scalar(key, value, step)
            elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                for i, v in enumerate(value):  # per-loop values: one curve per loop
                    self._tb.scalar(f"{key}/{i + 1}", v, step)
        self._tb.flush()

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


class _Events:
    """A TensorBoard events file written in the caller's thread, so a failed write (a full disk)
    raises there. `purge_step`: TensorBoard discards earlier events at or past it (a resume)."""

    def __init__(self, directory: epath.Path, purge_step: int | None):
        from tensorboardX.event_file_writer import EventsWriter

        directory.mkdir(parents=True, exist_ok=True)
        # The file is named by the second it opens: a suffix keeps a resume within the same
        # second from overwriting the previous file.
        n = len(list(directory.glob("events.out.tfevents.*")))
        self._writer = EventsWriter(str(directory / "events"), filename_suffix=f".{n}")
        if purge_step is not None:
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            self._writer.write_event(Event(wall_time=time.time(), step=purge_step,
                                           session_log=SessionLog(status=SessionLog.START)))

    def scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        self._writer.write_event(Event(wall_time=time.time(), step=step,
                                       summary=scalar(tag, value)))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
