"""One run directory: what `loopscale train` writes and everything else reads back.

    RUN/config.json        the resolved config (every field, after overrides)
    RUN/metrics.jsonl      one JSON object per logged step (training) or evaluation
                           (`eval_loss`); on resume, rows past the restored checkpoint's step are
                           dropped before training goes on, so every step appears exactly once
    RUN/summary.json       status (status.RunStatus) and results, replaced atomically
    RUN/checkpoints/STEP/  orbax checkpoints (checkpoint.py); bad-STEP-TIME/ ones moved aside
    RUN/tensorboard/       the metrics rows as TensorBoard scalars (events.py)
    RUN/eval/              evaluations of the run's checkpoints (`loopscale eval`)

Paths are etils.epath paths, so a run may live on any filesystem epath understands: on gs://,
orbax writes the checkpoints through tensorstore, and metrics.jsonl, which an object store
cannot append to, is written whole in batches (MetricsFile).
Files are written by process 0 only. A run directory written by an older loopscale reads the
same way: a config field that did not exist then takes its default (`read_config`).
"""

from __future__ import annotations

import errno
import json
import os
import time
from typing import Any

import ml_collections
from etils import epath

from loopscale.config import Config, base_config, parse
from loopscale.errors import UsageError
from loopscale.files import is_local, read_json, read_jsonl, to_json, write_atomic, write_json
from loopscale.rundir.events import Events
from loopscale.rundir.writer import Background

CONFIG = "config.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
EVAL = "eval"


# ---------------------------------------------------------------- reading


def read_summary(rundir: str | os.PathLike) -> dict | None:
    return read_json(epath.Path(rundir) / SUMMARY)


def _merged(defaults: dict, saved: dict) -> dict:
    out = dict(defaults)
    for key, value in saved.items():
        out[key] = _merged(defaults[key], value) if isinstance(defaults.get(key), dict) \
            and isinstance(value, dict) else value
    return out


def read_config(rundir: str | os.PathLike) -> Config:
    """The run's config.json as a `Config`. Fields added to loopscale after the run was written
    take their defaults; a field loopscale no longer knows is a UsageError naming the run."""
    path = epath.Path(rundir) / CONFIG
    saved = read_json(path)
    if not isinstance(saved, dict):
        raise UsageError(f"{path}: missing or not a JSON object")
    train = saved.get("train", {})
    if train.get("loop_choices") and "loop_dist" not in train:
        # Written before train.loop_dist: loop_choices alone meant a uniform draw.
        saved = {**saved, "train": {**train, "loop_dist": "uniform"}}
    try:
        return parse(ml_collections.ConfigDict(_merged(base_config().to_dict(), saved)))
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None


def config_changes(old: Config, new: Config) -> list[str]:
    """The dotted names of the fields where two configs differ, sorted."""
    a, b = _flatten(to_json(old)), _flatten(to_json(new))
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def read_evals(rundir: str | os.PathLike) -> dict[str, float]:
    """The top-level numbers of the run's eval/NAME.json files, as {"NAME_KEY": value} (what
    `collect` adds as columns, so a sweep's frontiers can be drawn on any of them)."""
    folder = epath.Path(rundir) / EVAL
    out: dict[str, float] = {}
    if not folder.exists():
        return out
    for path in sorted(folder.glob("*.json")):
        for key, value in (read_json(path) or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{path.stem}_{key}"] = value
    return out


def checkpoint_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the finished checkpoints in a checkpoints/ folder, ascending (no JAX or
    orbax needed). Orbax writes a step under a temporary name and renames it when complete,
    so a step's folder is a whole one."""
    directory = epath.Path(directory)
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def branch_source(rundir: str | os.PathLike, branch_from: str) -> epath.Path:
    """The run directory a cooldown branch starts from (`train.branch_from`): a relative path
    is taken beside `rundir` (a sweep's trunk and branches share runs/)."""
    source = epath.Path(branch_from)
    return source if source.is_absolute() else epath.Path(rundir).parent / branch_from


def last_metrics_row(rundir: str | os.PathLike, max_bytes: int = 8192,
                     having: str | None = None) -> dict | None:
    """The last complete row of a (possibly growing) metrics.jsonl, read from its tail; with
    `having`, the last one that has that key (e.g. "loss": a training row, not an eval row)."""
    try:
        with (epath.Path(rundir) / METRICS).open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if having is None or having in row:
            return row
    return None


# ---------------------------------------------------------------- writing


def check_writable(path: epath.Path) -> None:
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
        if not is_local(path) and isinstance(e, FileNotFoundError):
            problem = "the bucket does not exist"  # gcsfs names only the request's URL
        raise UsageError(f"workdir {path}: cannot write there ({problem})") from None


class MetricsFile:
    """metrics.jsonl open for writing, from the rows it keeps on resume. On a local disk each
    row is appended and flushed as it comes. An object store (gs://) has no append (gcsfs's "a"
    mode silently rewrites the object: fsspec/gcsfs#533), so there the rows are kept in memory
    and the file is written whole: at most every OBJECT_FLUSH_SECONDS, whenever the trainer
    asks (after each checkpoint save, so that the rows a checkpoint has seen are stored before a
    resume needs them) and at close. That costs an upload of the whole file each time (about
    0.5 KB a logged step: 50 MB after 100k steps, every 30 s) and keeps one file that every
    reader reads as before; a kill loses at most the rows past the last checkpoint, which a
    resume drops anyway."""

    OBJECT_FLUSH_SECONDS = 30.0

    def __init__(self, path: epath.Path, rows: list[dict]):
        self.path = path
        self._lines = [json.dumps(r) + "\n" for r in rows]
        self._file = None
        self._flushed = time.monotonic()
        if is_local(path):
            path.write_text("".join(self._lines))
            self._file = path.open("a")
            self._lines = []
        else:
            self.flush()

    def write(self, row: dict) -> None:
        line = json.dumps(row) + "\n"
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
            return
        self._lines.append(line)
        if time.monotonic() - self._flushed >= self.OBJECT_FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Stores every row written so far (already so on a local disk)."""
        if self._file is None:
            write_atomic(self.path, "".join(self._lines))
            self._flushed = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        else:
            self.flush()


class RunDirectory:
    """The trainer's handle on its run directory (writes happen on process 0 only)."""

    def __init__(self, workdir: str | epath.Path, write: bool = True):
        self.path = epath.Path(workdir)
        self.write = write  # False on processes other than 0
        if write:
            check_writable(self.path)
        self._metrics: MetricsFile | None = None
        self._tb: Events | None = None
        self._purge_step: int | None = None
        self._writer: Background | None = None  # created with the first row (process 0 only)

    @property
    def checkpoint_dir(self) -> epath.Path:
        return self.path / CHECKPOINTS

    @property
    def metrics_path(self) -> epath.Path:
        return self.path / METRICS

    def summary(self) -> dict | None:
        return read_summary(self.path)

    def check_config(self, config: Config) -> None:
        """Refuses (UsageError) a workdir that holds a run with a different config; nothing
        there is touched."""
        if not (self.path / CONFIG).exists():
            return
        changed = config_changes(read_config(self.path), config)
        if changed:
            raise UsageError(f"workdir {self.path} holds a run with a different config "
                             f"({', '.join(changed[:3])}); use a new workdir")

    def write_config(self, config: Config) -> None:
        if self.write:
            write_json(self.path / CONFIG, config)

    def write_summary(self, summary: dict[str, Any]) -> None:
        if self.write:
            write_json(self.path / SUMMARY, summary)

    def open_metrics(self, resume_step: int) -> list[dict]:
        """Keeps the rows up to `resume_step` (those the checkpoint has seen) and returns them;
        TensorBoard events past it are purged too (events.py)."""
        kept = [row for row in read_jsonl(self.metrics_path) if row.get("step", 0) <= resume_step]
        if self.write:
            self._metrics = MetricsFile(self.metrics_path, kept)
            self._purge_step = resume_step + 1  # even at 0: a run may have failed before a checkpoint
        return kept

    def log(self, row: dict) -> None:
        """Queues a metrics row for the writer thread (writer.py); a write that failed earlier
        raises here."""
        if not self.write:
            return
        if self._writer is None:
            self._writer = Background()
        self._writer.submit(self._write_row, to_json(row))  # converted here: the caller's row

    def _write_row(self, row: dict) -> None:
        self._metrics.write(row)
        if self._tb is None:
            self._tb = Events(self.path / TENSORBOARD, self._purge_step)
        self._tb.row(row)

    def flush(self) -> None:
        """Stores every metrics row and TensorBoard event logged so far. The trainer calls it
        after each checkpoint save, so that what the checkpoint has seen survives a kill: on an
        object store both are otherwise uploaded in batches (MetricsFile, events.py)."""
        if self._writer is not None:
            self._writer.wait()
        if self._metrics is not None:
            self._metrics.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Writes what is queued and closes the files; a write that failed raises (the files
        are closed all the same)."""
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        finally:
            if self._metrics is not None:
                self._metrics.close()
                self._metrics = None
            if self._tb is not None:
                self._tb.close()
                self._tb = None
