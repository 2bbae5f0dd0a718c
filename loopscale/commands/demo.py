"""`loopscale demo`: the CPU demo end to end, in runs/demo.

sweep (sweeps/isoflop_cpu.py: Base, Looped, MoE and Looped-MoE at three FLOP budgets on the KJV
text) -> collect (runs/demo/results.csv) -> report (fit + figures in runs/demo/report/). Each
step is the subcommand of the same name, so an interrupted demo resumes where it stopped and a
finished one only redraws the report.

It runs from any directory: the default sweep is the checkout's sweeps/isoflop_cpu.py (the one
beside the package, installed editable with `pip install -e`), and --workdir is relative to the
current directory.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import loopscale
from loopscale.errors import UsageError


def default_sweep() -> str:
    """The checkout's sweeps/isoflop_cpu.py; a UsageError where the package is not installed
    from a checkout (a non-editable install carries no sweeps/)."""
    path = Path(loopscale.__file__).resolve().parents[1] / "sweeps" / "isoflop_cpu.py"
    if not path.is_file():
        raise UsageError(f"no {path} beside the installed package (not an editable install of "
                         "the checkout); pass --sweep=PATH/sweeps/isoflop_cpu.py")
    return str(path)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="the CPU demo sweep end to end (runs/demo)",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--sweep", default=None,
                   help="sweep file (default: sweeps/isoflop_cpu.py of the loopscale checkout)")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--bootstrap", type=int, default=200)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from loopscale import cli

    sweep = args.sweep or default_sweep()
    results = os.path.join(args.workdir, "results.csv")
    steps = [
        ["sweep", f"--sweep={sweep}", f"--workdir={args.workdir}",
         f"--concurrency={args.concurrency}"],
        ["collect", args.workdir, f"--out={results}"],
        ["report", results, f"--out={os.path.join(args.workdir, 'report')}",
         "--params-column=params_active", f"--bootstrap={args.bootstrap}", "--grid=small"],
    ]
    for argv in steps:
        print(f"\n$ loopscale {' '.join(argv)}", flush=True)
        code = cli.main(argv)
        if code:
            return code
    return 0
