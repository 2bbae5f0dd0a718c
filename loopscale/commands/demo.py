"""`loopscale demo`: the CPU demo end to end, in runs/demo.

sweep (sweeps/isoflop_cpu.py: Base, Looped, MoE and Looped-MoE at three FLOP budgets on the KJV
text) -> collect (runs/demo/results.csv) -> report (fit + figures in runs/demo/report/). Each
step is what the subcommand of the same name runs (the same library calls, printed as that
command), so an interrupted demo resumes where it stopped and a finished one only redraws the
report.

It runs from any directory: the default sweep is the checkout's sweeps/isoflop_cpu.py (the one
beside the package, installed editable with `pip install -e`), and --workdir is relative to the
current directory.
"""

from __future__ import annotations

import argparse
import os
import sys

from loopscale import checkout


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="the CPU demo sweep end to end (runs/demo)",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--sweep", default=None,
                   help="sweep file (default: sweeps/isoflop_cpu.py of the loopscale checkout)")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--bootstrap", type=int, default=200)
    p.set_defaults(run=run)


def _say(argv: list[str]) -> None:
    print(f"\n$ loopscale {' '.join(argv)}", flush=True)


def run(args: argparse.Namespace) -> int:
    from loopscale.scaling import fit as fitting
    from loopscale.scaling.publish import write_report
    from loopscale.scaling.table import Columns
    from loopscale.sweep import collect
    from loopscale.sweep.local import outcome_lines, run_local
    from loopscale.sweep.plan import plan_file
    from loopscale.sweep.runner import Options

    sweep = args.sweep or checkout.demo_sweep()
    workdir, results = args.workdir, os.path.join(args.workdir, "results.csv")
    report = os.path.join(workdir, "report")

    _say(["sweep", f"--sweep={sweep}", f"--workdir={workdir}",
          f"--concurrency={args.concurrency}"])
    plan = plan_file(sweep)
    for note in plan.notes:
        sys.stderr.write(f"loopscale sweep: note: {note}\n")
    outcome = run_local(plan, workdir, Options.standard(args.concurrency))
    print("\n".join(outcome_lines(outcome, plan, workdir)))
    if not outcome.ok:
        return 1

    _say(["collect", workdir, f"--out={results}"])
    rows = collect.collect([workdir])
    collect.write_results(rows, results)
    print(collect.summary_line(rows, results))

    _say(["report", results, f"--out={report}", "--params-column=params_active",
          f"--bootstrap={args.bootstrap}", "--grid=small"])
    table = collect.results_table(results, Columns(params="params_active"))
    written = write_report(table, report, fitting.FitOptions(bootstrap=args.bootstrap,
                                                             grid="small"), results)
    warnings, lines = written.lines()
    for line in warnings:
        sys.stderr.write(f"loopscale report: warning: {line}\n")
    print("\n".join(lines))
    return 0
