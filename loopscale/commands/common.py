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
