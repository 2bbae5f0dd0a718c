"""What the three analysis scripts share: the command line, a sweep's runs read once, what a run
lacks, and the report's files (report.md rendered by loopscale.scaling.report, PNGs at 100 dpi).

A script is `main(argv)` built by `entry(description, analyse, extra_args)`: it parses
`--workdir=SWEEP_DIR [--out=DIR]`, reads the sweep's runs (`read_runs`: the rows `loopscale
collect` makes, each with its config, summary and eval/ files), calls `analyse(runs, args)`,
which returns the report's sections and figures, and writes them into --out (default
SWEEP_DIR/analysis). Bad input (no such directory, not a sweep directory, no runs) is a
UsageError: one line on stderr, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from etils import epath

from loopscale.config import Config
from loopscale.errors import UsageError
from loopscale.files import read_json, read_jsonl, write_atomic
from loopscale.rundir.run import CONFIG, EVAL, METRICS, read_config
from loopscale.scaling import report as rep

DPI = 100  # the figures stay small (tens of KB) for a report read in a browser or on GitHub


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, a dict key
class Run:
    """One run of the sweep: collect's row, its config (None when unreadable) and summary."""

    run_id: str
    path: epath.Path
    row: dict
    config: Config | None
    summary: dict

    @property
    def family(self) -> str:
        return str(self.row.get("family") or (self.config.name if self.config else "?"))

    @property
    def status(self) -> str:
        return str(self.row.get("status", "pending"))

    def eval(self, name: str) -> dict | None:
        """RUN/eval/NAME.json (`loopscale eval --what=NAME`), or None when not measured."""
        return read_json(self.path / EVAL / f"{name}.json")

    def metrics(self) -> list[dict]:
        return read_jsonl(self.path / METRICS)

    def train_rows(self) -> list[dict]:
        """The logged training steps (evaluation rows have no `loss`)."""
        return [r for r in self.metrics() if "loss" in r]


@dataclasses.dataclass(frozen=True)
class Figure:
    stem: str  # written as STEM.png
    title: str
    caption: str
    png: bytes


@dataclasses.dataclass(frozen=True)
class Analysis:
    title: str
    sections: tuple[rep.Section, ...]
    figures: tuple[Figure, ...]
    files: tuple[tuple[str, str], ...] = ()  # (name, text) written beside report.md


def read_runs(workdir: str) -> list[Run]:
    """Every run of a sweep directory, in collect's order (UsageError if there is none)."""
    from loopscale.sweep.collect import collect_dir, is_sweep_dir

    if not os.path.isdir(workdir):
        raise UsageError(f"--workdir {workdir}: no such directory")
    if not is_sweep_dir(workdir):
        raise UsageError(f"--workdir {workdir}: not a sweep directory (no plan.csv or runs/)")
    runs = []
    for row in collect_dir(workdir):
        path = epath.Path(row["workdir"])
        config = None
        if (path / CONFIG).exists():
            try:
                config = read_config(path)
            except UsageError:
                config = None  # a config this loopscale cannot read: the row still counts
        # The directory's name: a sweep's run id, and a name of one's own for a run trained by
        # hand (whose row's run_id is its config's hash, the same for two copies of a config).
        runs.append(Run(path.name, path, row, config, read_json(path / "summary.json") or {}))
    if not any(r.config is not None for r in runs):
        raise UsageError(f"--workdir {workdir}: the sweep directory holds no trained runs yet")
    return runs


def png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def image(fig_ref: Figure) -> str:
    """A figure in report.md (a paragraph of Markdown: to_markdown escapes only `|<>\\`)."""
    return f"![{fig_ref.title}]({fig_ref.stem}.png) {fig_ref.caption}"


def num(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def missing(runs: Sequence[Run], what: str, name: Callable[[Run], str] | None = None
            ) -> str | None:
    """A sentence naming the runs that lack what a section needs, or None when none does."""
    if not runs:
        return None
    names = ", ".join((name or label)(r) for r in runs[:12]) + (", ..." if len(runs) > 12 else "")
    return f"Missing for {len(runs)} run(s) ({what}): {names}."


def label(run: Run) -> str:
    return f"{run.family}/{run.run_id}"


def write(analysis: Analysis, out: str) -> str:
    os.makedirs(out, exist_ok=True)
    for fig in analysis.figures:
        write_atomic(os.path.join(out, f"{fig.stem}.png"), fig.png)
    for name, text in analysis.files:
        write_atomic(os.path.join(out, name), text)
    path = os.path.join(out, "report.md")
    write_atomic(path, rep.to_markdown(analysis.title, analysis.sections))
    return path


def entry(description: str, analyse: Callable[[list[Run], argparse.Namespace], Analysis],
          extra_args: Callable[[argparse.ArgumentParser], None] | None = None
          ) -> Callable[[Sequence[str] | None], int]:
    """The script's main(argv) -> exit status."""
    from loopscale.cli import OneLineParser

    def main(argv: Sequence[str] | None = None) -> int:
        prog = os.path.basename(sys.argv[0]) if argv is None else "analysis"
        parser = OneLineParser(prog=prog, description=description)
        parser.add_argument("--workdir", required=True, help="the sweep directory")
        parser.add_argument("--out", default=None, help="report folder (default WORKDIR/analysis)")
        if extra_args:
            extra_args(parser)
        args = parser.parse_args(argv)
        try:
            analysis = analyse(read_runs(args.workdir), args)
            path = write(analysis, args.out or os.path.join(args.workdir, "analysis"))
        except UsageError as e:
            sys.stderr.write(f"{prog}: error: {e}\n")
            return 2
        print(path)
        return 0

    return main
