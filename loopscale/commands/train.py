"""`loopscale train --config=experiments/NAME.py[:ARG] --workdir=DIR`: one training run.

Multi-host: every process runs the same command. `--coordinator=HOST:PORT --num-processes=N
--process-id=I` (or the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) start jax.distributed explicitly; `--distributed` lets JAX detect the cluster
(TPU pod slices, Slurm). On CPUs the collectives run over gloo. The run itself is
loopscale/job.py's, which a sweep's warm workers call too.
"""

from __future__ import annotations

import argparse

from loopscale.commands.common import add_config_arg
from loopscale.job import Distributed, TrainJob
from loopscale.job import run as run_job


def register(subparsers) -> None:
    env = Distributed.from_env()
    p = subparsers.add_parser("train", help="train one run; resumes if DIR holds a checkpoint")
    add_config_arg(p)
    p.add_argument("--workdir", required=True, help="run directory (local or any etils.epath path)")
    p.add_argument("--eval", default="", metavar="WHAT",
                   help="`loopscale eval` measurements to take once the run has completed "
                   "(e.g. ppl,loops), in the same process")
    p.add_argument("--coordinator", default=env.coordinator,
                   help="HOST:PORT of process 0, for multi-process runs")
    p.add_argument("--num-processes", type=int, default=env.num_processes)
    p.add_argument("--process-id", type=int, default=env.process_id)
    p.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() with cluster auto-detection")
    p.add_argument("--allow-cpu", action="store_true",
                   help="train a run planned past 1e15 FLOPs even where JAX sees only CPUs")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    job = TrainJob(args.config, args.workdir,
                   tuple(o for o in args.overrides if o.startswith("--config.")), args.eval,
                   args.allow_cpu)
    return run_job(job, Distributed(args.coordinator, args.num_processes, args.process_id,
                                    args.distributed))
