"""results.json and results.md of `loopscale bench`: the figures, and the machine they were
measured on."""

from __future__ import annotations

import datetime
import json
import os
import platform

from loopscale.bench.result import MEASURED, Figure
from loopscale.files import to_json, write_atomic

JSON_NAME, MD_NAME = "results.json", "results.md"


def machine() -> dict:
    import jax

    return {"date": datetime.date.today().isoformat(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(), "load_average": load_average()}


def load_average() -> float | None:
    """The 1-minute load average: other processes on the cores make every figure noisier."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # not on every platform
        return None


def _value(fig: Figure) -> str:
    if fig.ratio is None:
        return "-"
    return f"{100 * fig.ratio:.0f}%" if fig.percent else f"{fig.ratio:.3g}{fig.unit}"


def _verdict(fig: Figure) -> str:
    if fig.passed is None:
        return "-" if fig.status == MEASURED else fig.status
    return "pass" if fig.passed else "fail"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(figures: list[Figure], meta: dict) -> str:
    m = meta["machine"]
    load = ""
    if m["load_average"] is not None:
        end = meta.get("load_average_end") or 0.0
        busy = max(m["load_average"], end) >= 0.5
        load = (f" 1-minute load average {m['load_average']} at the start, {end} at the end"
                + (": other processes shared the cores, so the ratios are noisier than on an "
                   "idle machine." if busy else "."))
    intro = (f"{m['cpus']} CPUs, {m['processor']}, jax {m['jax']} ({m['backend']}); "
             f"{meta['elapsed_s']:.0f} s in all. Every figure is a ratio measured side by side "
             f"in one process; absolute times are in results.json.{load}")
    lines = [f"# loopscale bench ({meta['scale']}), {m['date']}", "", intro, "",
             "| figure | measured | target | result | how it was measured |",
             "| --- | --- | --- | --- | --- |"]
    for f in figures:
        lines.append(f"| {_cell(f.title)} | {_value(f)} | {_cell(f.target.text)} | "
                     f"{_verdict(f)} | {_cell(f.note)} |")
    return "\n".join(lines) + "\n"


def document(figures: list[Figure], meta: dict) -> dict:
    return {**meta, "figures": [f.to_json() for f in figures]}


def write(out_dir: str, figures: list[Figure], meta: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    write_atomic(os.path.join(out_dir, JSON_NAME),
                 json.dumps(to_json(document(figures, meta)), indent=2) + "\n")
    write_atomic(os.path.join(out_dir, MD_NAME), markdown(figures, meta))
