"""The report folder of a fit: fit.json, the figures (PNG and SVG), report.md and index.html (a
static page, no server needed), each written atomically, index.html last; other files in the
folder are left alone. `loopscale report` and `loopscale demo` write it with `write_report`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from loopscale.errors import UsageError
from loopscale.files import write_atomic
from loopscale.scaling import FitError
from loopscale.scaling import fit as fitting
from loopscale.scaling import plots
from loopscale.scaling import report as rep
from loopscale.scaling.table import ResultsTable


@dataclasses.dataclass(frozen=True)
class Written:
    doc: dict[str, Any]  # fit.json's document
    index: str  # the absolute path of index.html

    def lines(self) -> tuple[list[str], list[str]]:
        """(warnings, for stderr; the exponents and the page's path, for stdout)."""
        return list(self.doc["warnings"]), [rep.exponents_text(self.doc), self.index]


def check_out(out: str) -> None:
    """UsageError if the report folder `out` cannot be one (a file is there)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} exists and is not a directory")


def write_report(table: ResultsTable, out: str, options: fitting.FitOptions, source: str,
                 title: str | None = None) -> Written:
    """Fits `table` (read from `source`, as the user named it) and writes the report into
    `out` (created if needed). UsageError if `out` is a file or nothing could be fitted."""
    check_out(out)
    try:
        result = fitting.fit_results(table, options)
    except FitError as e:
        raise UsageError(str(e)) from e
    doc = fitting.fit_document(result, source)
    figures = plots.render_all(result)  # before writing anything: a plotting bug leaves no trace

    os.makedirs(out, exist_ok=True)
    path = lambda name: os.path.join(out, name)  # noqa: E731
    for fig in figures:
        write_atomic(path(f"{fig.stem}.png"), fig.png)
        write_atomic(path(f"{fig.stem}.svg"), fig.svg)
    write_atomic(path("fit.json"), json.dumps(doc, indent=2, allow_nan=False) + "\n")
    title = title or f"Scaling report: {table.source}"
    sections = rep.outline(doc, [rep.FigureRef(f.stem, f.title, f.caption) for f in figures])
    write_atomic(path("report.md"), rep.to_markdown(title, sections))
    write_atomic(path("index.html"), rep.to_html(title, sections))
    return Written(doc, os.path.abspath(path("index.html")))
