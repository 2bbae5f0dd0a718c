"""Files that a reader never sees half of, and the JSON that loopscale writes and reads back.

Every file loopscale writes for others to read (run and sweep directories, fits, reports,
tokenizer and corpus caches) goes through `write_atomic`, and every JSON file it reads back
through `read_json` / `read_jsonl`: one rule for a crash mid-write, one rule for a damaged file.
Paths may be local or any filesystem etils.epath understands (gs://...).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import tempfile
from typing import Any

from etils import epath


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Writes `data` to a temporary file beside `path`, then renames it over `path`: a process
    killed mid-write (or a full disk) leaves the old file or the new one, never half of one.
    On object stores (gs://) a write is atomic by itself, so it writes directly."""
    path = epath.Path(path)
    raw = data.encode() if isinstance(data, str) else data
    if not is_local(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results and caches are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def is_local(path: str | os.PathLike) -> bool:
    """Whether `path` is on a filesystem this machine mounts (not gs:// or another object store,
    which has no append, no rename and no locks)."""
    return "://" not in os.fspath(path)


def to_json(value: Any) -> Any:
    """`value` as plain JSON types: dataclasses as dicts, enums as their values, arrays as
    lists, non-finite floats as strings ("nan", "inf": JSON has none; they stay readable)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if hasattr(value, "tolist"):  # numpy and jax arrays and scalars
        return to_json(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_json(path: str | os.PathLike, data: Any) -> None:
    """`data` (see `to_json`) as indented JSON, written atomically."""
    write_atomic(path, json.dumps(to_json(data), indent=2) + "\n")


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON in `path`, or None if there is no such file. A file that does not parse is
    None too: loopscale writes its JSON atomically, so a broken one is not ours to trust."""
    try:
        return json.loads(epath.Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSON-lines file (none if it does not exist). A line cut short by a kill
    (only ever the last one: rows are appended) is skipped."""
    path = epath.Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Appends one row to a local file and syncs it to disk (a record that must survive the
    machine: the local runner's attempts.jsonl; that runner refuses gs://, which has no append).
    """
    with open(path, "a") as f:
        f.write(json.dumps(to_json(row)) + "\n")
        f.flush()
        os.fsync(f.fileno())
