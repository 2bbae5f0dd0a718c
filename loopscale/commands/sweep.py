"""`loopscale sweep --sweep=sweeps/NAME.py[:ARG] --workdir=DIR`: trains a sweep's planned runs
here, resumably, or writes the scripts that launch them on a cluster.

Local (default): each run is its own `loopscale train` process under DIR/runs/RUN_ID,
--concurrency at a time, sharing JAX's compilation cache (DIR/jax_cache), with a progress bar
over the planned FLOPs. Running the command again skips completed and diverged runs, resumes
interrupted ones from their checkpoints and retries failed ones (--max-retries in all); a lock
keeps a second runner off DIR. Exit 0 when every run is completed or diverged, 1 otherwise.
--launcher=tpu-pod|slurm writes DIR/launch/<launcher>.sh instead (DIR may then be gs://);
--dry-run prints the commands or the script and writes nothing. With --topology=SLICE the
tpu-pod script packs the runs onto the slice's chips, each on the fewest chips its compiled
step fits on, many side by side on every host (loopscale/sweep/launchers.py, packing.py);
without it every run takes the whole slice in turn. With --gpus-per-run=N the slurm script packs
runs N GPUs each onto one node's --gpus-per-node, several side by side on each node."""

from __future__ import annotations

import argparse
import os
import shlex

from loopscale.commands.plan import add_sweep_arg, make_plan, size, wall_time_lines
from loopscale.errors import UsageError
from loopscale.sweep.runner import MAX_RETRIES, STALL_S


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a sweep here, resumably, or write cluster launch scripts",
        description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_sweep_arg(p)
    p.add_argument("--workdir", required=True, help="sweep directory (gs:// with --launcher)")
    p.add_argument("--launcher", choices=("local", "tpu-pod", "slurm"), default="local")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would run (local) or the launch script; write nothing")
    local = p.add_argument_group("local runner")
    local.add_argument("--concurrency", type=int, default=1, help="runs trained at once")
    local.add_argument("--max-retries", type=int, default=MAX_RETRIES,
                       help="relaunches of a failed run, counted over every invocation")
    local.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                       help="environment variable for every run, e.g. XLA_FLAGS=... (repeatable)")
    local.add_argument("--train-command", default=None,
                       help="command that trains one run, given --config... --workdir=... "
                       "(default: this Python's `-m loopscale.cli train`)")
    local.add_argument("--warm-workers", action=argparse.BooleanOptionalAction, default=True,
                       help="each slot trains run after run in one warm process (JAX imported "
                       "and each shape compiled once); off: a fresh process per run")
    local.add_argument("--stall-timeout", type=float, default=STALL_S, metavar="SECONDS",
                       help="kill and retry a run whose metrics have not grown for this long "
                       "(0: never)")
    cluster = p.add_argument_group("cluster launchers")
    cluster.add_argument("--script-dir", default=None,
                         help="where the launch script goes (default DIR/launch; "
                         "./launch/NAME for gs://)")
    cluster.add_argument("--repo", default="~/loopscale", help="project checkout on the hosts")
    cluster.add_argument("--loopscale-bin", default="loopscale", help="console script on the hosts")
    cluster.add_argument("--tpu-name", default="my-tpu")
    cluster.add_argument("--zone", default="us-central2-b")
    cluster.add_argument("--project", default="")
    cluster.add_argument("--nodes", type=int, default=1, help="Slurm nodes per run")
    cluster.add_argument("--gpus-per-node", type=int, default=0)
    cluster.add_argument("--gpus-per-run", type=int, default=0,
                         help="Slurm, one node a task: pack runs this many GPUs each, side by "
                         "side on each node (default 0: every run holds its whole nodes)")
    cluster.add_argument("--parallel", type=int, default=0, help="Slurm array tasks at once")
    cluster.add_argument("--time", default="24:00:00", help="Slurm time limit per run")
    cluster.add_argument("--partition", default="")
    cluster.add_argument("--sbatch-arg", action="append", default=[],
                         help="extra #SBATCH option, e.g. --account=X (repeatable)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.topology and args.launcher != "tpu-pod":
        raise UsageError("--topology packs the runs of --launcher=tpu-pod; the local and slurm "
                         "launchers do not use it")
    if args.gpus_per_run and args.launcher != "slurm":
        raise UsageError("--gpus-per-run packs the runs of --launcher=slurm; the local and "
                         "tpu-pod launchers do not use it")
    result = make_plan(args)
    if args.launcher != "local":
        return _write_launcher(args, result)
    from loopscale.sweep.local import check_workdir

    check_workdir(args.workdir)
    return _run_local(args, result)


def _run_local(args: argparse.Namespace, result) -> int:
    from loopscale.rundir import sweep as rundirs
    from loopscale.sweep.local import outcome_lines, run_local
    from loopscale.sweep.processes import DEFAULT_TRAIN_COMMAND, command
    from loopscale.sweep.runner import Options

    workdir = os.path.abspath(args.workdir)
    train_command = tuple(shlex.split(args.train_command)) if args.train_command \
        else DEFAULT_TRAIN_COMMAND
    env = []
    for item in args.env:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--env takes KEY=VALUE, got {item!r}")
        env.append((key, value))
    if args.stall_timeout < 0:
        raise UsageError(f"--stall-timeout must be >= 0, got {args.stall_timeout}")
    options = Options(concurrency=args.concurrency, max_retries=args.max_retries,
                      train_command=train_command, env=tuple(env), warm=args.warm_workers,
                      stall_s=args.stall_timeout)
    if args.dry_run:
        for run in result.runs:
            state = rundirs.status(rundirs.run_dir(workdir, run.run_id))
            argv = command(run, workdir, train_command)
            print(f"# {run.run_id} {run.family} ({state.value})\n{shlex.join(argv)}")
        return 0
    outcome = run_local(result, workdir, options)
    print("\n".join(outcome_lines(outcome, result, args.workdir)))
    return 0 if outcome.ok else 1


def _write_launcher(args: argparse.Namespace, result) -> int:
    import json

    from etils import epath

    from loopscale.files import is_local, write_atomic
    from loopscale.rundir import sweep as rundirs
    from loopscale.rundir.run import check_writable
    from loopscale.sweep.launchers import ClusterOptions, script
    from loopscale.sweep.plan_table import write_csv

    options = ClusterOptions(
        repo=args.repo, loopscale=args.loopscale_bin, tpu_name=args.tpu_name, zone=args.zone,
        project=args.project, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        parallel=args.parallel, time=args.time, partition=args.partition,
        sbatch_args=tuple(args.sbatch_arg), gpus_per_run=args.gpus_per_run)
    options.check()
    sized = size(args, result)
    if sized:
        result = sized.plan  # plan.csv and run.json get the chips and step times too
    name, text = script(args.launcher, result.sweep.name, result.runs, args.workdir, options,
                        sized)
    if args.dry_run:
        print(text, end="")
        return 0
    script_dir = args.script_dir or (os.path.join("launch", result.sweep.name)
                                     if not is_local(args.workdir)
                                     else os.path.join(args.workdir, "launch"))
    # A directory that cannot be written (under a file, read-only, a bucket that does not
    # exist) is one line before any file is: the plan and the run rows go to the workdir.
    for directory in (script_dir, args.workdir):
        check_writable(epath.Path(directory))
    path = os.path.join(script_dir, name)
    write_atomic(path, text)
    os.chmod(path, 0o755)
    # The plan and each run's plan row go where the runs will be (local or gs://), so collect
    # finds them.
    write_csv(result.runs, os.path.join(args.workdir, "plan.csv"))
    for run in result.runs:
        write_atomic(os.path.join(rundirs.run_dir(args.workdir, run.run_id), rundirs.RUN_ROW),
                     json.dumps(run.row, indent=2) + "\n")
    if sized:
        print("\n".join(wall_time_lines(sized, args.startup_s)))
    branched = any(run.config.train.branch_from for run in result.runs)
    how = "sbatch" if args.launcher == "slurm" and not branched else "bash"
    print(f"wrote {path} ({len(result.runs)} runs); launch it with `{how} {path}`")
    return 0
