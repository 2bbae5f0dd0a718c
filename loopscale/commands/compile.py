"""`loopscale compile --config=... --topology=v5p-128 [--slices=2] [--step=train|eval|eval:NAME]`:
compiles the real train (or eval, or an eval measurement's) step ahead of time for a TPU topology (libtpu's compiler,
no TPU needed) or, without --topology, for the local devices (GPUs), and prints JSON.

Keys: topology, chips, slices, device_kind, step, mesh (the config's mesh, -1 filled),
global_batch, seq_len, n_loops, dtype, hbm_bytes_per_chip, memory_per_chip (arguments,
outputs, aliased, temporaries, code, total: bytes per chip of the compiled program),
hbm_fraction, fits, model_flops_per_step (analytic, 6N + attention per token; a third of it
for eval), model_flops_per_step_maxtext (MaxText's count: no embedding lookup, causal
attention), xla_flops_per_chip, est_step_time_s (XLA's cost model), est_mfu and est_mfu_maxtext
(the two model FLOP counts per chip per estimated second over the chip's peak), collectives (per
kind: count and bytes per step), async_collectives (the real step compiled with the
platform's flags, parallel/xla_flags.py: collectives split into start/done pairs, and how many
have compute scheduled between), cost_warning (why a cost figure is missing or partial) and
compile_time_s. The cost figures come from shallow
unrolled compiles extrapolated to the full depth (loopscale/aot/compile.py says why);
`--no-cost` skips them. A step that does not fit exits 1 after the JSON, with one line saying
what it needs."""

from __future__ import annotations

import argparse
import json
import sys

from loopscale.aot.steps import STEPS
from loopscale.commands.common import add_cache_arg, add_config_arg, load_experiment
from loopscale.errors import UsageError
from loopscale.rundir.status import ExitCode


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compile", help="compile the train/eval step for a TPU topology or the local devices",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_config_arg(p)
    p.add_argument("--topology", default="",
                   help="v5p:4x4x4, v5p-128, v5litepod-256, v6e-256, ... (default: local devices)")
    p.add_argument("--slices", type=int, default=1, help="slices joined over DCN (data axis)")
    p.add_argument("--step", choices=STEPS, default="train",
                   help="train, eval, or eval:NAME, a loopscale eval measurement's device step")
    p.add_argument("--no-cost", dest="cost", action="store_false",
                   help="skip XLA's cost estimate (flops, step time, MFU, collectives)")
    add_cache_arg(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from loopscale.aot import compile as aot
    from loopscale.aot import kept

    config = load_experiment(args)
    if args.topology:
        target = aot.tpu_target(args.topology, args.slices)
    elif args.slices != 1:
        raise UsageError("--slices needs --topology")
    else:
        target = aot.local_target(config.train.peak_flops, config.model.dtype)
    with kept.kept_in(args.compile_cache or None):
        out = aot.report(config, target, args.step, cost=args.cost)
    print(json.dumps(out, indent=2))
    if out["fits"] is False:
        need = out["memory_per_chip"]["total"] / 1e9
        print(f"loopscale compile: {config.name} {args.step} step does not fit {out['topology']}: "
              f"needs {need:.1f} GB per chip, a chip has {out['hbm_bytes_per_chip'] / 1e9:.1f} GB",
              file=sys.stderr)
        return ExitCode.FAILED  # does not fit
    return 0

