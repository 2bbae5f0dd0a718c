"""`loopscale plan --sweep=sweeps/NAME.py[:ARG] --out=plan.csv`: expands a sweep into runs
without training anything (loopscale/sweep/plan.py has the rules, schema.py the sweep file).

One row per run: run_id (hash of the resolved config), family, budget, shape fields, parameter
counts, flops_per_token (the config's flop_convention), tokens, steps, batch_size, lr, seed,
flops (what the run will spend, within the sweep's tolerance of its budget), est_device_hours
(tokens x the compiled step's FLOPs per token / (--peak-flops x --mfu)), and the experiment
file and overrides that `loopscale train` gets. Prints a summary per budget and family; what
the planner left out or warns about goes to stderr. A budget no shape can meet exits 2.

--topology=SLICE (e.g. v5p-128) compiles the train step of each distinct shape for the slice
(loopscale/sweep/sizing.py; progress on stderr): `chips` is the fewest power-of-two chips a
run fits on, a step too big for one host first split into 2, 4, ... micro-batches on one host
(train.grad_accum, in its overrides and so its run id; a note names each such shape and a line
gives the wall time without), `est_step_time_s` XLA's estimated step time there,
est_device_hours chips x steps x that time, and two more lines give the sweep's estimated wall time on the slice, packed as
`loopscale sweep --launcher=tpu-pod --topology=SLICE` launches it and one run at a time on all
chips, each run counting --startup-s of start-up (packing.py). Without it the two columns stay
empty."""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict

from loopscale.commands.common import add_cache_arg

# A run's fixed cost before its first step, assumed (not measured): starting the process,
# compiling the train and eval steps, restoring; the issue that motivated packing put it at
# "minutes" on a TPU host.
STARTUP_S = 120.0


def add_sweep_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sweep", required=True,
                        help="sweep file, sweeps/NAME.py[:ARG]; override its fields with "
                        "--sweep.a.b=v, and every run's config fields with --config.a.b=v")
    parser.add_argument("--peak-flops", type=float, default=None, metavar="FLOPS",
                        help="device peak FLOP/s for est_device_hours (default: the sweep's)")
    parser.add_argument("--mfu", type=float, default=None,
                        help="assumed model FLOPs utilisation, 0-1 (default: the sweep's)")
    parser.add_argument("--topology", default="",
                        help="TPU slice, e.g. v5p-128: compile each distinct shape for it to "
                        "find the chips each run needs and its step time (slow: minutes for "
                        "paper-size shapes)")
    add_cache_arg(parser)
    parser.add_argument("--startup-s", type=float, default=STARTUP_S, metavar="SECONDS",
                        help="with --topology: a run's start-up (process, compile, restore) "
                        f"in the wall-time estimates (default {STARTUP_S:g}, assumed)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="expand a sweep into runs, without training",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_sweep_arg(p)
    p.add_argument("--out", required=True, help="where to write the plan table (CSV)")
    p.set_defaults(run=run)


def make_plan(args: argparse.Namespace):
    from loopscale.sweep.plan import plan_file

    result = plan_file(args.sweep, args.overrides, args.peak_flops, args.mfu)
    for note in result.notes:
        sys.stderr.write(f"loopscale {args.command}: note: {note}\n")
    return result


def size(args: argparse.Namespace, result):
    """With --topology: the plan with each run's chips and compiled step time (sizing.py);
    otherwise None."""
    if not args.topology:
        return None
    from loopscale.aot import kept, topology
    from loopscale.errors import UsageError
    from loopscale.sweep import packing, sizing

    if args.startup_s < 0:
        raise UsageError(f"--startup-s must be at least 0, got {args.startup_s:g}")
    slc = packing.parse_slice(args.topology)
    topology.quiet_libtpu()  # before JAX starts a backend

    def log(line: str) -> None:
        sys.stderr.write(f"loopscale {args.command}: {line}\n")

    log(f"compiling the train step of each distinct shape for {slc.name} (tiny shapes take "
        "seconds, paper-size ones minutes)")
    with kept.kept_in(args.compile_cache or None):
        sized = sizing.size_plan(result, slc, log)
    for note in sized.plan.notes[len(result.notes):]:
        sys.stderr.write(f"loopscale {args.command}: note: {note}\n")
    return sized


def wall_time_lines(sized, startup_s: float) -> list[str]:
    """The sweep's estimated wall time on the slice, packed and one run at a time."""
    from loopscale.sweep import packing

    slc, needs = sized.slice, sized.needs

    def hours(estimate) -> str:
        s = estimate.seconds
        if s is None:
            return f"n/a ({estimate.problem})"
        return f"{s / 3600:.3g} h" if s >= 3600 else f"{s / 60:.3g} min" if s >= 60 \
            else f"{s:.3g} s"

    lines = _wall_time_lines(slc, needs, startup_s, hours)
    if sized.unpacked is not None:
        # Sizing as it was before it traded micro-batches for chips, beside.
        own = sized.unpacked
        traded = sum(a.chips != b.chips for a, b in zip(needs, own))
        packed = hours(packing.packed_wall_time(slc, own, startup_s))
        serial = hours(packing.serial_wall_time(slc, own, startup_s))
        lines.append(f"  ({traded} run(s) planned in micro-batches to fit one host; each at its "
                     f"own train.grad_accum instead: packed {packed}, one run at a time on all "
                     f"chips {serial})")
    return lines


def _wall_time_lines(slc, needs, startup_s: float, hours) -> list[str]:
    from loopscale.sweep import packing

    sizes = packing.phases(slc, needs)
    mix = ", ".join(f"{len(p.run_ids)} on {p.size} chip(s)" if p.size
                    else f"{len(p.run_ids)} on the whole slice" for p in sizes)
    return [
        f"estimated wall time on {slc.name} ({slc.chips} chips, {slc.hosts} host(s) of "
        f"{slc.chips_per_host}; {mix}): packed "
        f"{hours(packing.packed_wall_time(slc, needs, startup_s))}, one run at a time on all "
        f"chips {hours(packing.serial_wall_time(slc, needs, startup_s))}",
        f"  (steps at XLA's estimated step time, plus {startup_s:g} s start-up a run "
        f"(--startup-s); the steps alone: packed {hours(packing.packed_wall_time(slc, needs, 0))}"
        f", one at a time {hours(packing.serial_wall_time(slc, needs, 0))})",
    ]


def summary_lines(result) -> list[str]:
    """One line per (budget, family): sizes, widths, steps, spend, estimated device time."""
    groups = defaultdict(list)
    for r in result.runs:
        groups[(r.budget, r.family)].append(r.row)
    lines = [f"{'budget':>8}  {'family':<12} {'runs':>4} {'d_model':>9} {'params':>13} "
             f"{'steps':>11} {'flops/budget':>12} {'device h':>9}"]
    for (budget, family), rows in groups.items():
        trunks = rows[0]["role"] == "trunk"
        def span(key, fmt=str):
            lo, hi = min(r[key] for r in rows), max(r[key] for r in rows)
            return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"
        ratio = "-" if budget is None else span("flops_over_budget", "{:.3f}".format)
        lines.append(
            f"{'trunks' if trunks else '-' if budget is None else f'{budget:.3g}':>8}  "
            f"{family:<12} {len(rows):>4} "
            f"{span('d_model'):>9} {span('params', _short):>13} {span('steps'):>11} "
            f"{ratio:>12} {sum(r['est_device_hours'] for r in rows):>9.3g}")
    hours = sum(r.row["est_device_hours"] for r in result.runs)
    spent = sum(r.row["flops_spent"] for r in result.runs)
    roles = Counter(r.row["role"] for r in result.runs)
    branched = ""
    if roles["trunk"]:
        points = sum(r.row["flops"] for r in result.runs if r.row["role"] != "trunk")
        branched = (f" ({roles['trunk']} trunks, {roles['branch']} cooldown branches, "
                    f"{roles['run']} standalone: {spent / points:.0%} of the {points:.3g} "
                    "FLOPs the points would spend on their own)")
    lines.append(f"{len(result.runs)} runs, {spent:.3g} FLOPs{branched}, "
                 f"about {hours:.3g} device hours ({hours * 60:.3g} minutes)")
    return lines


def _short(n: float) -> str:
    """12,345,678 -> 12.3M: parameter counts that fit a column."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def run(args: argparse.Namespace) -> int:
    from loopscale.sweep.plan_table import write_csv

    result = make_plan(args)
    sized = size(args, result)
    if sized:
        result = sized.plan
    write_csv(result.runs, args.out)
    print("\n".join(summary_lines(result)))
    if sized:
        print("\n".join(wall_time_lines(sized, args.startup_s)))
    print(f"wrote {args.out}")
    return 0
