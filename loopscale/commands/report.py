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
import sys

from loopscale.commands.common import add_fit_args, fit_options_args


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


def run(args: argparse.Namespace) -> int:
    # Imported here so `loopscale --help` and other commands do not load matplotlib/scipy.
    from loopscale.scaling import fit as fitting
    from loopscale.scaling.publish import check_out, write_report
    from loopscale.scaling.table import Columns
    from loopscale.sweep.collect import results_table

    checked = fit_options_args(args)
    check_out(args.out)
    columns = Columns(params=args.params_column, tokens=args.tokens_column,
                      loss=args.loss_column, flops=args.flops_column)
    table = results_table(args.source, columns)
    options = fitting.FitOptions(**checked)
    written = write_report(table, args.out, options, args.source, args.title)
    warnings, lines = written.lines()
    for line in warnings:
        sys.stderr.write(f"loopscale report: warning: {line}\n")
    print("\n".join(lines))
    return 0
