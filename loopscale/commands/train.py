"""`loopscale train --config=experiments/NAME.py[:ARG] --workdir=DIR`: one training run.

Multi-host: every process runs the same command. `--coordinator=HOST:PORT --num-processes=N
--process-id=I` (or the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) start jax.distributed explicitly; `--distributed` lets JAX detect the cluster
(TPU pod slices, Slurm). On CPUs the collectives run over gloo.
"""

from __future__ import annotations

import argparse
import os

import jax

from loopscale.commands.common import add_config_arg, load_experiment
from loopscale.rundir.run import read_summary
from loopscale.rundir.status import RunStatus


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train one run; resumes if DIR holds a checkpoint")
    add_config_arg(p)
    p.add_argument("--workdir", required=True, help="run directory (local or any etils.epath path)")
    p.add_argument("--eval", default="", metavar="WHAT",
                   help="`loopscale eval` measurements to take once the run has completed "
                   "(e.g. ppl,loops), in the same process")
    p.add_argument("--coordinator", default=os.environ.get("JAX_COORDINATOR_ADDRESS"),
                   help="HOST:PORT of process 0, for multi-process runs")
    p.add_argument("--num-processes", type=int, default=_env_int("JAX_NUM_PROCESSES"))
    p.add_argument("--process-id", type=int, default=_env_int("JAX_PROCESS_ID"))
    p.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() with cluster auto-detection")
    p.set_defaults(run=run)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def initialize_distributed(args: argparse.Namespace) -> None:
    if args.coordinator:
        # Only the CPU backend reads this; set before any backend starts.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes, process_id=args.process_id)
    elif args.distributed:
        jax.distributed.initialize()


def run(args: argparse.Namespace) -> int:
    from loopscale.train.trainer import train

    config = load_experiment(args)  # bad config: exit 2 before any device or file is touched
    what = ()
    if args.eval:
        from loopscale.evaluate.suite import parse_what

        what = parse_what(args.eval, "--eval")
    initialize_distributed(args)
    code = train(config, args.workdir)
    if what and code == 0 and RunStatus.of(read_summary(args.workdir)) is RunStatus.COMPLETED:
        from loopscale.evaluate.suite import evaluate_run

        evaluate_run(args.workdir, what)
    return code
