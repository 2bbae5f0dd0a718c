"""Runs the figures in order and writes the results after each one (an interrupted bench
keeps what it measured). A figure that fails is a row with status `error` and the one-line
error; the others still run."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Sequence

from loopscale.bench import figures as figures_lib
from loopscale.bench import report
from loopscale.bench.result import ERROR, Figure, not_measured
from loopscale.bench.scale import Scale

log = logging.getLogger(__name__)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def run(scale: Scale, out_dir: str, only: Sequence[str] = (), stream=None) -> dict:
    """Measures every figure (or those in `only`) at `scale`; writes results.json and .md in
    `out_dir`; returns the results document. Progress lines go to `stream` (default: the
    sys.stderr of the call)."""
    stream = sys.stderr if stream is None else stream
    started = time.perf_counter()
    ctx = figures_lib.Context(scale)
    done: list[Figure] = []
    meta = {"scale": scale.name, "scale_settings": dataclasses.asdict(scale),
            "machine": report.machine(), "elapsed_s": 0.0, "load_average_end": None}
    for spec in figures_lib.FIGURES:
        if only and spec.key not in only:
            continue
        title = spec.title(scale)
        t0 = time.perf_counter()
        try:
            fig = spec.measure(ctx, spec.key, title, spec.target)
        except Exception as e:  # one figure's failure is that figure's row, not the bench's
            log.debug("figure %s failed", spec.key, exc_info=e)  # shown by --verbose
            fig = not_measured(spec.key, title, spec.target, ERROR, f"error: {_one_line(e)}")
        fig = dataclasses.replace(fig, percent=spec.percent, unit=spec.unit)
        fig.measured["figure_wall_s"] = time.perf_counter() - t0
        done.append(fig)
        meta["elapsed_s"] = time.perf_counter() - started
        meta["load_average_end"] = report.load_average()
        report.write(out_dir, done, meta)
        value = "-" if fig.ratio is None else f"{fig.ratio:.3f}"
        print(f"[bench {meta['elapsed_s']:5.0f}s] {spec.key}: {value} ({fig.target.text}) "
              f"{fig.status} in {fig.measured['figure_wall_s']:.0f} s", file=stream, flush=True)
    return report.document(done, meta)
