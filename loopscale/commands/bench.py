"""`loopscale bench --out=runs/bench`: the performance table, every figure a ratio of two
things measured side by side in one process (interleaved repetitions, medians after warm-up):
the project's train step against a lean plain-JAX one, scanned against unrolled loops, compile
time against loop count, Looped against Base, FLT against the original LT, MoE against dense,
memory with loop remat against none, data pipeline against train step, train steps' share of
a demo sweep's time, and JAX against the FLT authors' PyTorch step (when torch is installed).
Writes OUT/results.json (ratios, targets, verdicts, absolute times) and OUT/results.md, and
prints the table. Under 10 minutes on a 2-core CPU. Exit 1 if a figure failed with an error
(its row says which); missing a target is a result, not an error."""

from __future__ import annotations

import argparse
from pathlib import Path

from loopscale.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    from loopscale.bench.scale import SCALES

    p = subparsers.add_parser(
        "bench", help="the performance table, every figure a ratio measured in one process",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--out", default="runs/bench", help="where results.json and results.md go")
    p.add_argument("--scale", choices=sorted(SCALES), default="full",
                   help="full: the real table; tiny: every figure's machinery in seconds "
                   "(its ratios mean nothing)")
    p.add_argument("--only", default="", metavar="KEY,...",
                   help="measure only these figures (keys as in results.json)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import jax

    from loopscale.bench import report, suite
    from loopscale.bench.figures import FIGURES
    from loopscale.bench.result import ERROR
    from loopscale.bench.scale import SCALES

    only = [k for k in args.only.split(",") if k]
    unknown = sorted(set(only) - {spec.key for spec in FIGURES})
    if unknown:
        raise UsageError(f"--only: unknown figure {', '.join(unknown)}; figures: "
                         f"{', '.join(spec.key for spec in FIGURES)}")
    # Compile times are measured: every compile must be a real one, not a cache hit.
    jax.config.update("jax_enable_compilation_cache", False)
    doc = suite.run(SCALES[args.scale], args.out, only)
    print(Path(args.out, report.MD_NAME).read_text())
    return 1 if any(f["status"] == ERROR for f in doc["figures"]) else 0
