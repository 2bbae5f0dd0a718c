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
  mesh, batch or micro-batch count is a different program), with the source paths inside its
  Pallas kernels cut to file names (so the name does not depend on where the checkout is);
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

import base64
import binascii
import contextlib
import contextvars
import hashlib
import importlib.metadata
import json
import os
import re
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


# A Pallas kernel (megablox's grouped matmul, splash attention) is carried in the lowered text
# as base64 Mosaic bytecode whose debug locations name source files by absolute path (the
# checkout's, the virtual environment's), and whose string offsets move with those paths'
# lengths. Measured 2026-12-07: the same MoE step lowered from two checkouts gave two texts, so
# its kept figures were not found again. For the name, each body stands as the strings it
# holds (op and attribute names, symbols, source file names without their folders). Its binary
# part (numbers among them) is left out: the kernel's shapes are in its operands' types, the
# rest is fixed by the loopscale and jax code that builds it.
_KERNEL_BODY_RE = re.compile(r"(body\\22: \\22)([A-Za-z0-9+/=]+)")
_STRING_RE = re.compile(rb"[\x20-\x7e]{4,}")


def _without_paths(lowered_text: str) -> str:
    def body(match: re.Match) -> str:
        try:
            raw = base64.b64decode(match.group(2), validate=True)
        except binascii.Error:
            return match.group(0)
        strings = [t.rsplit(b"/", 1)[-1] for t in _STRING_RE.findall(raw)]
        return match.group(1) + hashlib.sha256(b"\x00".join(strings)).hexdigest()

    return _KERNEL_BODY_RE.sub(body, lowered_text)


def key(reading: str, lowered_text: str, devices, options: dict, raw: bool = False) -> str:
    """The hash that names a compiled program's `reading` (module docstring); `raw`: of the
    text as lowered, kernels' paths and all (how files were named until 2026-12-07)."""
    program = lowered_text if raw else _without_paths(lowered_text)
    parts = {
        "reading": reading,
        "program": hashlib.sha256(program.encode()).hexdigest(),
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
    text = lowered.as_text()
    path = folder / f"{key(reading, text, devices, options)}.json"
    kept = read_json(path)
    if kept is not None:
        return kept["figures"]
    # A file named before kernels' paths were cut (written 2026-12-07 before fc4d420) is found
    # under the raw text's name and renamed to the path-free one, so that from then on any
    # checkout finds it. benchmarks/results/compile_cache holds no such file any more (all were
    # renamed this way); this lookup can go once no other folder does.
    raw = folder / f"{key(reading, text, devices, options, raw=True)}.json"
    kept = read_json(raw)
    if kept is not None:
        if raw != path:
            os.replace(raw, path)
        return kept["figures"]
    out = compute()
    write_json(path, {"reading": reading, "device_kind": next(iter(devices)).device_kind,
                      "chips": len(devices), "figures": out})
    return out
