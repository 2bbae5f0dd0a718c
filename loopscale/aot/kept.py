"""What compiled programs' figures were, kept on disk (`--compile-cache=DIR` of `loopscale
plan`, `sweep` and `compile`), so that a sizing of hours can stop and go on, and a plan sized
once is printed again in seconds.

Why not jax's own persistent compilation cache: a paper-size step compiled for a TPU topology
on this CPU takes 40 s to minutes, and a second compile with JAX_COMPILATION_CACHE_DIR set took
as long (measured, sweep/sizing.py). And what sizing and `loopscale compile` read from a
compiled program is a handful of numbers (memory per chip, XLA's cost, collective counts), not
the executable. So those numbers are what is kept: one JSON file per compiled program and
reading, named by a hash of everything that decides what the compiler gives back:
- the lowered program's text (its shapes, dtypes, shardings, partition count: a changed model,
  mesh, batch or micro-batch count is a different program);
- the devices it is compiled for (platform, kind, ids and, for TPU chips, their coordinates:
  a topology's shape);
- the compiler options passed (parallel/xla_flags.py) and the environment's XLA_FLAGS and
  LIBTPU_INIT_ARGS;
- jax's flags that change compiling (`jax_exec_time_optimization_effort`,
  `jax_disable_most_optimizations`);
- the versions of jax, jaxlib and libtpu;
- which reading it is (`memory` or `cost`).
A program whose compile failed for any reason but lack of memory is not kept. Without a folder
nothing is read or written: every call compiles, as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import jax

from loopscale.files import read_json, write_json

_FOLDER: contextvars.ContextVar[Path | None] = contextvars.ContextVar("kept", default=None)
_JAX_FLAGS = ("jax_exec_time_optimization_effort", "jax_disable_most_optimizations")
_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


@contextlib.contextmanager
def kept_in(folder: str | os.PathLike | None) -> Iterator[None]:
    """Within: compiled figures are read from and written to `folder` (None: neither)."""
    token = _FOLDER.set(None if folder is None else Path(folder))
    try:
        yield
    finally:
        _FOLDER.reset(token)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _flag(name: str):
    # A flag with a context manager (the effort) is an attribute; a plain one is in `values`.
    return getattr(jax.config, name) if hasattr(jax.config, name) else jax.config.values[name]


def key(reading: str, lowered_text: str, devices, options: dict) -> str:
    """The hash that names a compiled program's `reading` (module docstring)."""
    parts = {
        "reading": reading,
        "program": hashlib.sha256(lowered_text.encode()).hexdigest(),
        "devices": [[d.platform, d.device_kind, d.id, list(getattr(d, "coords", ()) or ())]
                    for d in devices],
        "options": sorted((str(k), str(v)) for k, v in options.items()),
        "env": [os.environ.get(name, "") for name in _ENV],
        "flags": [str(_flag(name)) for name in _JAX_FLAGS],
        "versions": [_version(d) for d in ("jax", "jaxlib", "libtpu")],
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def figures(reading: str, lowered, devices, options: dict,
            compute: Callable[[], dict]) -> dict:
    """`compute()` (which compiles `lowered` and reads its figures, a JSON-able dict), or what
    it gave before for the same program where a folder is in use."""
    folder = _FOLDER.get()
    if folder is None:
        return compute()
    path = folder / f"{key(reading, lowered.as_text(), devices, options)}.json"
    kept = read_json(path)
    if kept is not None:
        return kept["figures"]
    out = compute()
    write_json(path, {"reading": reading, "device_kind": next(iter(devices)).device_kind,
                      "chips": len(devices), "figures": out})
    return out
