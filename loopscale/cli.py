"""The `loopscale` console script: one subcommand per module in loopscale/commands/.

Each command module exposes `register(subparsers)`, which adds its parser and sets `run`.
Bad input raises UsageError anywhere below; here it becomes one line on stderr and exit 2.
`--verbose` (any subcommand) adds the traceback: of a UsageError here, and of the errors that
commands report in one line themselves (they log them at DEBUG on the `loopscale` logger).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from loopscale.commands import (
    bench,
    collect,
    compile,
    coordcheck,
    demo,
    eval,
    fit,
    flops,
    plan,
    report,
    status,
    sweep,
    train,
)
from loopscale.errors import UsageError

# Subcommands in the order `loopscale --help` lists them.
COMMANDS = (flops, fit, report, coordcheck, train, eval, compile, plan, sweep, status, collect,
            demo, bench)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line and exit 2 (argparse prints the usage too)."""

    def error(self, message: str):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="loopscale", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for command in COMMANDS:
        command.register(sub)
    for command_parser in sub.choices.values():
        command_parser.add_argument("--verbose", action="store_true",
                                    help="print the traceback of an error, not only its line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from loopscale.aot.topology import quiet_libtpu

    quiet_libtpu()  # before JAX starts a backend
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `--config.a.b=v` (or `--sweep.a.b=v`) overrides are the only arguments left unparsed.
    overrides = [a for a in extra if a.startswith(("--config.", "--sweep."))]
    unknown = [a for a in extra if a not in overrides]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.overrides = overrides
    # The handler lives for this command only: main() also runs in-process (tests, notebooks),
    # where a handler left on the logger would keep writing to a stream that has gone away.
    log, handler = logging.getLogger("loopscale"), logging.StreamHandler(sys.stderr)
    if args.verbose:
        log.setLevel(logging.DEBUG)
        log.addHandler(handler)
    try:
        return int(args.run(args) or 0)
    except UsageError as e:
        if args.verbose:
            traceback.print_exc()
        sys.stderr.write(f"loopscale {args.command}: error: {e}\n")
        return 2
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)


if __name__ == "__main__":
    sys.exit(main())
