"""`loopscale collect DIR... --out=results.csv`: one row per run of sweep or run directories
(local or gs://), ready for `loopscale fit results.csv` (loopscale/sweep/collect.py documents
the columns). Runs that are pending, running, diverged or failed are rows with that status;
`fit` fits only the completed ones and lists the rest as excluded."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("collect", help="one results row per run, from run directories",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories or run directories")
    p.add_argument("--out", required=True, help="where to write the results table (CSV)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from loopscale.sweep.collect import collect, summary_line, write_results

    rows = collect(args.dirs)
    write_results(rows, args.out)
    print(summary_line(rows, args.out))
    return 0
