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
