"""The Slurm launch script: one sbatch array job.

Unpacked (the default), one array task per run, `--nodes` nodes each: `srun` starts one
`loopscale train` per node with JAX_COORDINATOR_ADDRESS (the first node of the allocation),
JAX_NUM_PROCESSES (the number of nodes) and JAX_PROCESS_ID (SLURM_PROCID) set explicitly,
which `loopscale train` reads.

Packed (`gpus_per_run` below `gpus_per_node`, one node a task): each array task is one node
whose GPUs are cut into slots of `gpus_per_run`; every slot is a loop that trains, one process
at a time with CUDA_VISIBLE_DEVICES set to its own GPUs (its share of the job's own list), the
task's runs that no other slot has claimed (an atomic `mkdir` in a temporary directory of the
node). The runs are dealt to the tasks longest first (the plan's analytic device hours), each
to the task with the least so far, so small shapes share a node instead of each holding all of
its GPUs. Every run gets the same number of GPUs: sizing per shape needs a compile for the GPU
(`loopscale compile` on one), which this launcher, written on any machine, does not have.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from loopscale.parallel import xla_flags
from loopscale.rundir.status import ExitCode
from loopscale.sweep.launch_common import (FAILURES, ClusterOptions, budget_text, claims,
                                           header, join_path, record_failure,
                                           run_args_function, train_args, trunks_first)
from loopscale.sweep.packing import deal
from loopscale.sweep.plan_table import PlannedRun


def _sbatch_lines(name: str, tasks: int, o: ClusterOptions) -> list[str]:
    limit = f"%{o.parallel}" if o.parallel else ""
    sbatch = [f"--job-name=loopscale-{name}", f"--array=0-{tasks - 1}{limit}",
              f"--nodes={o.nodes}", "--ntasks-per-node=1", f"--time={o.time}",
              "--output=slurm-%x-%A_%a.out"]
    if o.gpus_per_node:
        sbatch.append(f"--gpus-per-node={o.gpus_per_node}")
    if o.partition:
        sbatch.append(f"--partition={o.partition}")
    sbatch += list(o.sbatch_args)
    return ["#!/usr/bin/env bash", *(f"#SBATCH {s}" for s in sbatch)]


def _submit_branches(first: int, total: int, o: ClusterOptions, what: str) -> list[str]:
    """Run with bash outside an array task: submit tasks 0..first-1 (the #SBATCH array), then
    first..total-1 (the cooldown branches) once those have all ended."""
    limit = f"%{o.parallel}" if o.parallel else ""
    return [
        f"# Run with bash (not in an array task): submit tasks 0-{first - 1} ({what} that start",
        f"# from scratch), then {first}-{total - 1} (the cooldown branches) once they have all "
        "ended.",
        "if [ -z \"${SLURM_ARRAY_TASK_ID:-}\" ]; then",
        "  trunks=$(sbatch --parsable \"$0\")",
        f"  sbatch --dependency=\"afterany:${{trunks%%;*}}\" --array={first}-{total - 1}{limit} "
        "\"$0\"",
        "  exit",
        "fi",
        "",
    ]


def _slurm_setup(workdir: str, o: ClusterOptions) -> list[str]:
    return [f"REPO=\"${{REPO:-{o.repo}}}\"", f"LOOPSCALE=\"${{LOOPSCALE:-{o.loopscale}}}\"",
            f"export JAX_COMPILATION_CACHE_DIR={shlex.quote(join_path(workdir, 'jax_cache'))}",
            *_gpu_flags(o)]


def slurm_script(name: str, runs: Sequence[PlannedRun], workdir: str,
                 o: ClusterOptions) -> str:
    if o.packs:
        return slurm_packed_script(name, runs, workdir, o)
    q = shlex.quote
    first, branches = trunks_first(runs)
    runs = first + branches  # array indices: the trunks' first
    lines = [
        *_sbatch_lines(name, len(first), o),
        header(name, runs, workdir, "One array task per run, one `loopscale train` per node:"
                + ("\n#   bash slurm.sh   (submits the trunks, then the branches after them)"
                   if branches else "\n#   sbatch slurm.sh")),
        "set -euo pipefail",
        *_slurm_setup(workdir, o),
        "",
    ]
    if branches:
        lines += _submit_branches(len(first), len(runs), o, "every run")
    lines += [
        "case \"${SLURM_ARRAY_TASK_ID:?submit this script with sbatch}\" in",
    ]
    for i, run in enumerate(runs):
        lines.append(f"  {i}) RUN_ID={run.run_id}  # {run.family} budget={budget_text(run.budget)} "
                     f"d_model={run.config.model.d_model}")
        lines.append("     ARGS=(" + " ".join(q(a) for a in train_args(run, workdir)) + ") ;;")
    lines += [
        "  *) echo \"no run for array task $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;",
        "esac",
        "",
        "# jax.distributed: process 0 on the allocation's first node; one process per node.",
        "# awk reads the whole list: `head -n 1` would close the pipe early, and under",
        "# pipefail scontrol's SIGPIPE (status 141) would fail the task.",
        "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | awk 'NR == 1')",
        "export JAX_COORDINATOR_ADDRESS=\"$head_node:$((12000 + SLURM_JOB_ID % 20000))\"",
        "export JAX_NUM_PROCESSES=\"$SLURM_NNODES\"",
        "cd \"${REPO/#\\~/$HOME}\"  # a leading ~ is not expanded inside quotes",
        "echo \"==> $RUN_ID on $SLURM_NNODES node(s)\"",
        "rc=0",
        "srun --ntasks=\"$SLURM_NNODES\" --ntasks-per-node=1 "
        "bash -c 'JAX_PROCESS_ID=$SLURM_PROCID exec \"$@\"' _ "
        "$LOOPSCALE train \"${ARGS[@]}\" || rc=$?",
        f"# {ExitCode.DIVERGED.value}: diverged, a result like any other.",
        f"if [ \"$rc\" -eq {ExitCode.DIVERGED.value} ]; then exit 0; fi",
        "exit \"$rc\"",
        "",
    ]
    return "\n".join(lines)


def slurm_queues(runs: Sequence[PlannedRun], slots_per_node: int,
                 parallel: int = 0) -> list[list[str]]:
    """The run ids of each array task of a packed Slurm script (module docstring): as many
    tasks as fill every slot once (at most `parallel`), the runs dealt longest first."""
    tasks = -(-len(runs) // slots_per_node)
    if parallel:
        tasks = min(tasks, parallel)
    return deal([(run.run_id, run.row.get("est_device_hours") or 0.0) for run in runs], tasks)


def slurm_packed_script(name: str, runs: Sequence[PlannedRun], workdir: str,
                        o: ClusterOptions) -> str:
    per_node = o.gpus_per_node // o.gpus_per_run
    groups = [slurm_queues(group, per_node, o.parallel) for group in trunks_first(runs) if group]
    queues = [queue for group in groups for queue in group]
    branched = len(groups) > 1
    how = (f"Packs the runs {o.gpus_per_run} GPU(s) each, {per_node} side by side on each node "
           "of one array task:" + ("\n#   bash slurm.sh   (submits the trunks, then the branches "
                                  "after them)" if branched else "\n#   sbatch slurm.sh")
           + "\n# Each run's output goes to $LOGS/RUN_ID.log.")
    lines = [
        *_sbatch_lines(name, len(groups[0]), o),
        header(name, runs, workdir, how),
        "set -uo pipefail",
        *_slurm_setup(workdir, o),
        f"PER_RUN={o.gpus_per_run}  # GPUs of each run",
        f"SLOTS={per_node}  # runs side by side on the node",
        f"LOGS=\"${{LOGS:-slurm-logs/{name}}}\"",
        "",
    ]
    if branched:
        lines += _submit_branches(len(groups[0]), len(queues), o, "the runs")
    lines += [*run_args_function(runs, workdir, {}), "",
              "# This task's queue: the runs its slots take in turn.",
              "case \"${SLURM_ARRAY_TASK_ID:?submit this script with sbatch}\" in"]
    lines += [f"  {i}) QUEUE=({' '.join(queue)}) ;;" for i, queue in enumerate(queues)]
    lines += [
        "  *) echo \"no queue for array task $SLURM_ARRAY_TASK_ID\" >&2; exit 2 ;;",
        "esac",
        "",
        "# The job's GPUs as Slurm lists them (CUDA_VISIBLE_DEVICES; 0..N-1 where it sets none).",
        "IFS=, read -r -a GPUS <<<\"${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 "
        f"$((PER_RUN * SLOTS - 1)))}}\"",
        "if [ \"${#GPUS[@]}\" -lt $((PER_RUN * SLOTS)) ]; then",
        "  echo \"this task sees ${#GPUS[@]} GPU(s) (CUDA_VISIBLE_DEVICES), the script packs "
        "$((PER_RUN * SLOTS))\" >&2",
        "  exit 2",
        "fi",
        "mkdir -p \"$LOGS\" && LOGS=$(cd \"$LOGS\" && pwd)",
        "cd \"${REPO/#\\~/$HOME}\"  # a leading ~ is not expanded inside quotes",
        *claims("This node's"),
        "trap 'trap - INT TERM; kill 0' INT TERM  # cancelled: stop every slot's run",
        "",
        "# slot K: one `loopscale train` at a time on GPUs K*PER_RUN.. of the job's list, each",
        "# the queue's next unclaimed run; a single process, no jax.distributed.",
        "slot() {",
        "  local devices id rc",
        "  devices=$(IFS=,; echo \"${GPUS[*]:$(($1 * PER_RUN)):PER_RUN}\")",
        "  for id in \"${QUEUE[@]}\"; do",
        "    mkdir \"$CLAIMS/$id\" 2>/dev/null || continue",
        "    run_args \"$id\"",
        "    echo \"==> $id on GPU(s) $devices\"",
        "    CUDA_VISIBLE_DEVICES=\"$devices\" $LOOPSCALE train \"${ARGS[@]}\" </dev/null "
        ">>\"$LOGS/$id.log\" 2>&1",
        "    rc=$?",
        *record_failure("    ", "this task"),
        "  done",
        "}",
        "",
        "for k in $(seq 0 $((SLOTS - 1))); do slot \"$k\" & done",
        "wait",
        *FAILURES,
        "",
    ]
    return "\n".join(lines)


def _gpu_flags(o: ClusterOptions) -> list[str]:
    """XLA:GPU's flags for a GPU allocation (none for CPU nodes)."""
    if not o.gpus_per_node:
        return []
    return ["# XLA:GPU's flags for every run (loopscale/parallel/xla_flags.py: the latency-hiding",
            "# scheduler overlaps NCCL's collectives with compute), after any of your own.",
            f"export XLA_FLAGS=\"${{XLA_FLAGS:+$XLA_FLAGS }}{xla_flags.as_args(xla_flags.GPU)}\""]
