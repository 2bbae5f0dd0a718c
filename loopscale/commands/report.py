"""`loopscale report DIR --out=report/`: the fit of `loopscale fit` as figures and tables.

Writes into --out: fit.json, isoflop/frontiers/allocation/residuals/loss_vs_params .png and
.svg, report.md and index.html (a static page, no server needed), each atomically, index.html
last; other files in --out are left alone. Prints the path of index.html and the exponents.

The input is a sweep directory (plan.csv and/or runs/RUN/), whose run directories are read as
`loopscale collect` reads them, at the time of the report (a results.csv beside them may be
older and is not used); a results table (.csv or .parquet, the columns `loopscale fit` reads);
or a directory holding results.csv (or results.parquet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from loopscale.commands.common import add_fit_args, fitted_doc
from loopscale.errors import UsageError

TABLE_NAMES = ("results.csv", "results.parquet")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="figures and tables of a sweep (PNG/SVG, report.md, index.html)",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("source", help="sweep directory, results table (.csv/.parquet) or a "
                   "directory holding results.csv")
    p.add_argument("--out", required=True, help="folder for the report (created if needed)")
    add_fit_args(p, bootstrap_default=200)  # fewer resamples than `fit`: a quick look
    p.add_argument("--title", default=None, help="page title (default: from the source)")
    p.set_defaults(run=run)


def find_table(source: str) -> str:
    """The table to read: `source` itself, or the results table inside a directory."""
    if not os.path.isdir(source):
        if not os.path.exists(source):
            raise UsageError(f"no such table or directory: {source}")
        return source
    for name in TABLE_NAMES:
        path = os.path.join(source, name)
        if os.path.isfile(path):
            return path
    raise UsageError(f"{source} is neither a sweep directory (plan.csv, runs/) nor a directory "
                     "holding results.csv (or results.parquet)")


def load_source(source: str, columns):
    """The results table of a sweep directory (its runs, read now) or of a table file."""
    import pandas as pd

    from loopscale.scaling.table import prepare_table, read_table
    from loopscale.sweep.collect import RESULT_COLUMNS, collect_dir, is_sweep_dir

    if not is_sweep_dir(source):
        return read_table(find_table(source), columns)
    rows = collect_dir(source)
    if not rows:
        raise UsageError(f"{source}: the sweep directory holds no runs yet")
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))  # the columns collect writes
    return prepare_table(frame, columns, source=os.path.basename(os.path.abspath(source)))


def run(args: argparse.Namespace) -> int:
    # Imported here so `loopscale --help` and other commands do not load matplotlib/scipy.
    from loopscale.scaling import FitError
    from loopscale.scaling import fit as fitting
    from loopscale.scaling import plots
    from loopscale.files import write_atomic
    from loopscale.scaling import report as rep
    from loopscale.scaling.table import Columns

    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    if not 0.0 < args.level < 1.0:
        raise UsageError(f"--level must be between 0 and 1, got {args.level}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out} exists and is not a directory")
    columns = Columns(params=args.params_column, tokens=args.tokens_column,
                      loss=args.loss_column, flops=args.flops_column)
    table = load_source(args.source, columns)
    options = fitting.FitOptions(bootstrap=args.bootstrap, seed=args.seed, level=args.level,
                                 spline=args.spline, grid=args.grid)
    try:
        result = fitting.fit_results(table, options)
    except FitError as e:
        raise UsageError(str(e)) from e
    doc = fitted_doc(result, args.source)
    figures = plots.render_all(result)  # before writing anything: a plotting bug leaves no trace

    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)  # noqa: E731
    for fig in figures:
        write_atomic(out(f"{fig.stem}.png"), fig.png)
        write_atomic(out(f"{fig.stem}.svg"), fig.svg)
    write_atomic(out("fit.json"), json.dumps(doc, indent=2, allow_nan=False) + "\n")
    title = args.title or f"Scaling report: {table.source}"
    sections = rep.outline(doc, [rep.FigureRef(f.stem, f.title, f.caption) for f in figures])
    write_atomic(out("report.md"), rep.to_markdown(title, sections))
    write_atomic(out("index.html"), rep.to_html(title, sections))

    for line in doc["warnings"]:
        sys.stderr.write(f"loopscale report: warning: {line}\n")
    print(rep.exponents_text(doc))
    print(os.path.abspath(out("index.html")))
    return 0
