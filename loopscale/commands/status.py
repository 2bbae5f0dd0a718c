"""`loopscale status --workdir=DIR`: a sweep's state at a glance, per family and budget (runs
done, running, stopped, failed, diverged, pending), the step and loss of the running ones, the
FLOPs spent against the plan, an ETA from the runs' step times, and the run ids that need
attention (loopscale/sweep/status.py says how each is read). Local or gs:// sweep directories.
`--json` prints the same as one JSON object."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("status", help="a sweep's state at a glance",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--workdir", required=True, help="the sweep directory (`loopscale sweep`'s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from loopscale.sweep import status

    doc = status.summary(status.read(args.workdir))
    print(json.dumps(doc, indent=2) if args.json else "\n".join(status.lines(doc)))
    return 0
