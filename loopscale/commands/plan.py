"""`loopscale plan --sweep=sweeps/NAME.py[:ARG] --out=plan.csv`: expands a sweep into runs
without training anything (loopscale/sweep/plan.py has the rules, schema.py the sweep file).

One row per run: run_id (hash of the resolved config), family, budget, shape fields, parameter
counts, flops_per_token (the config's flop_convention), tokens, steps, batch_size, lr, seed,
flops (what the run will spend, within the sweep's tolerance of its budget), est_device_hours
(tokens x the compiled step's FLOPs per token / (--peak-flops x --mfu)), and the experiment
file and overrides that `loopscale train` gets. Prints a summary per budget and family; what
the planner left out or warns about goes to stderr. A budget no shape can meet exits 2."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict


def add_sweep_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweep", required=True,
                        help="sweep file, sweeps/NAME.py[:ARG]; override its fields with "
                        "--sweep.a.b=v, and every run's config fields with --config.a.b=v")
    parser.add_argument("--peak-flops", type=float, default=None, metavar="FLOPS",
                        help="device peak FLOP/s for est_device_hours (default: the sweep's)")
    parser.add_argument("--mfu", type=float, default=None,
                        help="assumed model FLOPs utilisation, 0-1 (default: the sweep's)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="expand a sweep into runs, without training",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_sweep_arg(p)
    p.add_argument("--out", required=True, help="where to write the plan table (CSV)")
    p.set_defaults(run=run)


def make_plan(args: argparse.Namespace):
    from loopscale.sweep import load_sweep
    from loopscale.sweep.plan import parse_config_overrides, plan

    config = parse_config_overrides([o for o in args.overrides if o.startswith("--config.")])
    result = plan(load_sweep(args.sweep, args.overrides), args.peak_flops, args.mfu, config)
    for note in result.notes:
        sys.stderr.write(f"loopscale {args.command}: note: {note}\n")
    return result


def summary_lines(result) -> list[str]:
    """One line per (budget, family): sizes, widths, steps, spend, estimated device time."""
    groups = defaultdict(list)
    for r in result.runs:
        groups[(r.budget, r.family)].append(r.row)
    lines = [f"{'budget':>8}  {'family':<12} {'runs':>4} {'d_model':>9} {'params':>13} "
             f"{'steps':>11} {'flops/budget':>12} {'device h':>9}"]
    for (budget, family), rows in groups.items():
        def span(key, fmt=str):
            lo, hi = min(r[key] for r in rows), max(r[key] for r in rows)
            return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"
        ratio = "-" if budget is None else span("flops_over_budget", "{:.3f}".format)
        lines.append(
            f"{'-' if budget is None else f'{budget:.3g}':>8}  {family:<12} {len(rows):>4} "
            f"{span('d_model'):>9} {span('params', _short):>13} {span('steps'):>11} "
            f"{ratio:>12} {sum(r['est_device_hours'] for r in rows):>9.3g}")
    hours = sum(r.row["est_device_hours"] for r in result.runs)
    lines.append(f"{len(result.runs)} runs, {sum(r.row['flops'] for r in result.runs):.3g} FLOPs, "
                 f"about {hours:.3g} device hours ({hours * 60:.3g} minutes)")
    return lines


def _short(n: float) -> str:
    """12,345,678 -> 12.3M: parameter counts that fit a column."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def run(args: argparse.Namespace) -> int:
    from loopscale.sweep.plan import write_csv

    result = make_plan(args)
    write_csv(result.runs, args.out)
    print("\n".join(summary_lines(result)))
    print(f"wrote {args.out}")
    return 0
