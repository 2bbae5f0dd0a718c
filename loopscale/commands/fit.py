"""`loopscale fit TABLE --out=fit.json`: IsoFLOP minima, power laws, the parametric fit and
bootstrap intervals per family, and the family comparison (loopscale/scaling/fit.py has the
fit.json schema). Prints a short table; warnings (e.g. edge minima) go to stderr."""

from __future__ import annotations

import argparse
import json
import sys

from loopscale.commands.common import add_fit_args, fit_options_args
from loopscale.errors import UsageError
from loopscale.files import write_atomic


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fit", help="fit scaling laws to a results table",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("table", help="results table, .csv or .parquet: params, tokens, loss "
                   "[, flops, family, status, budget, params_unique]")
    p.add_argument("--out", required=True, help="where to write fit.json")
    add_fit_args(p, bootstrap_default=1000)
    p.add_argument("--weighted", action="store_true",
                   help="weight IsoFLOP power laws by each minimum's bootstrap variance")
    p.add_argument("--budget-tolerance", type=float, default=0.02, metavar="DEX",
                   help="without a budget column, runs whose log10 flops agree within this "
                   "form one budget")
    p.add_argument("--compare", action="append", metavar="REF,OTHER",
                   help="family pair to compare (repeatable; default: every pair)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target-loss", type=float,
                        help="compare families at this loss")
    target.add_argument("--target-compute", type=float,
                        help="compare at the reference's loss at this compute (default: the "
                        "largest compute both families reached)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so `loopscale --help` and other commands do not load scipy/pandas.
    from loopscale.scaling import FitError
    from loopscale.scaling import fit as fitting
    from loopscale.scaling.table import Columns, read_table

    checked = fit_options_args(args)
    if args.budget_tolerance <= 0:
        raise UsageError(f"--budget-tolerance must be > 0, got {args.budget_tolerance}")
    for name in ("target_loss", "target_compute"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {value}")

    columns = Columns(params=args.params_column, tokens=args.tokens_column,
                      loss=args.loss_column, flops=args.flops_column)
    table = read_table(args.table, columns)
    pairs = _pairs(args.compare, table.families)
    options = fitting.FitOptions(
        **checked, weighted=args.weighted,
        budget_tolerance=args.budget_tolerance, pairs=pairs, target_loss=args.target_loss,
        target_compute=args.target_compute)
    try:
        result = fitting.fit_results(table, options)
    except FitError as e:
        raise UsageError(str(e)) from e
    doc = fitting.fit_document(result, args.table)
    write_atomic(args.out, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    for line in doc["warnings"]:
        sys.stderr.write(f"loopscale fit: warning: {line}\n")
    print(fitting.summary_table(doc))
    print(f"wrote {args.out}")
    return 0


def _pairs(specs: list[str] | None, families: tuple[str, ...]
           ) -> tuple[tuple[str, str], ...] | None:
    if not specs:
        return None
    pairs = []
    for spec in specs:
        parts = [s.strip() for s in spec.split(",")]
        if len(parts) != 2 or not all(parts):
            raise UsageError(f"--compare takes REF,OTHER, got {spec!r}")
        for name in parts:
            if name not in families:
                raise UsageError(f"--compare: no family {name!r} in the table "
                                 f"(families: {', '.join(families)})")
        pairs.append((parts[0], parts[1]))
    return tuple(pairs)


