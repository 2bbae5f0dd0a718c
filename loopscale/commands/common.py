"""Pieces shared by several subcommands."""

from __future__ import annotations

import argparse

from loopscale.config import Config, load_config, parse


def add_config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", required=True,
        help="experiment file, experiments/NAME.py[:ARG]; override fields with --config.a.b=v",
    )


def load_experiment(args: argparse.Namespace) -> Config:
    """The validated Config of `--config` with its `--config.*` overrides (UsageError if bad)."""
    overrides = [o for o in args.overrides if o.startswith("--config.")]
    return parse(load_config(args.config, overrides))


def add_fit_args(parser: argparse.ArgumentParser, bootstrap_default: int) -> None:
    """The fitting flags `fit` and `report` share (both run loopscale.scaling.fit)."""
    parser.add_argument("--params-column", default="params",
                        help="parameter count to fit against (e.g. params_active, params_unique)")
    parser.add_argument("--tokens-column", default="tokens")
    parser.add_argument("--loss-column", default="loss")
    parser.add_argument("--flops-column", default="flops",
                        help="compute column; without it C = 6 * params * tokens")
    parser.add_argument("--bootstrap", type=int, default=bootstrap_default, metavar="N",
                        help="bootstrap resamples for the intervals (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resamples")
    parser.add_argument("--level", type=float, default=0.95, help="interval coverage")
    parser.add_argument("--spline", action="store_true",
                        help="per-budget minimum from a smoothing spline instead of a parabola")
    parser.add_argument("--grid", choices=("hoffmann", "small"), default="hoffmann",
                        help="parametric starting grid: hoffmann (4,500 starts, the published "
                        "protocol) or small (108, quick looks)")
    parser.add_argument("--holdout", default=None, metavar="largest|BUDGET",
                        help="also fit without one budget (the largest, or this one in FLOPs) "
                        "and predict its compute-optimal loss and size (fit.json `holdout`)")
    parser.add_argument("--fit.E_min", dest="e_min", type=float, default=None, metavar="E",
                        help="lower bound on the parametric fit's irreducible loss E")
    parser.add_argument("--fit.E_max", dest="e_max", type=float, default=None, metavar="E",
                        help="upper bound on E (equal to --fit.E_min: E fixed)")


def fit_options_args(args: argparse.Namespace) -> dict:
    """The FitOptions fields `fit` and `report` read alike from add_fit_args' flags, checked
    (UsageError naming the flag)."""
    from loopscale.errors import UsageError

    if args.bootstrap < 0:
        raise UsageError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    if not 0.0 < args.level < 1.0:
        raise UsageError(f"--level must be between 0 and 1, got {args.level}")
    for flag, value in (("--fit.E_min", args.e_min), ("--fit.E_max", args.e_max)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be > 0, got {value}")
    if args.e_min is not None and args.e_max is not None and args.e_min > args.e_max:
        raise UsageError(f"--fit.E_min {args.e_min} is above --fit.E_max {args.e_max}")
    bounds = None if args.e_min is None and args.e_max is None else (args.e_min, args.e_max)
    return {"bootstrap": args.bootstrap, "seed": args.seed, "level": args.level,
            "spline": args.spline, "grid": args.grid, "holdout": args.holdout,
            "e_bounds": bounds}


def add_cache_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile-cache", default="", metavar="DIR",
                        help="keep each compiled program's figures in DIR and read them back "
                        "instead of compiling the same program again (loopscale/aot/kept.py): "
                        "an interrupted sizing goes on where it stopped")
