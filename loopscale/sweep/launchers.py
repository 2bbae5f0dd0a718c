"""Launch scripts for clusters: the plan as bash that runs `loopscale train` once per run on
the chips of a TPU slice (`tpu-pod`) or the nodes of a Slurm job (`slurm`).

Both scripts are resumable the same way the local runner is: `loopscale train` skips a run
whose summary says completed or diverged and resumes an interrupted one from its checkpoint,
so a script (or a Slurm array task) can simply be run again. The workdir may be a gs:// path.

- tpu-pod, given the runs' chips on the slice (`--topology`, sizing.py): the script, run from
  any machine with gcloud, follows packing.py's phases. Runs that fit on one host's chips are
  packed: per phase (one chip count), one `slot` loop per block of chips of every host takes
  the next unclaimed run of the phase's queue (claims are atomic `mkdir`s in a temporary
  directory of this invocation) and trains it with `gcloud compute tpus tpu-vm ssh
  --worker=N --command=...`, a process of its own restricted to its chips by libtpu's
  variables (the script's comments say what each does), so hosts never idle while runs are
  left. Runs needing more chips than a host has then run one after another on the whole slice
  (`--worker=all`, `loopscale train --distributed` on every host, jax.distributed finding the
  hosts from the TPU metadata). A run whose summary says completed or diverged is not launched
  again, so re-running the script after an interruption only resumes what is unfinished.
  Without sizes every run takes the whole slice in turn.
- slurm: one sbatch array job, one array task per run, `--nodes` nodes each; `srun` starts one
  `loopscale train` per node with JAX_COORDINATOR_ADDRESS (the first node of the allocation),
  JAX_NUM_PROCESSES (the number of nodes) and JAX_PROCESS_ID (SLURM_PROCID) set explicitly,
  which `loopscale train` reads.
Both set XLA's flags of their platform for every run (parallel/xla_flags.py): LIBTPU_INIT_ARGS
on the TPU hosts, XLA_FLAGS on a Slurm job with GPUs, each after the user's own.

Cooldown branches (plan.py) start from their trunk's checkpoint, so both scripts run every
trunk (and unbranched run) before any branch: the tpu-pod script's branch phases come after
all trunk phases (each phase waits for the last); the slurm script, run with `bash`, submits
the trunks' array and then the branches' array with `--dependency=afterany` on it (a branch
whose trunk failed then fails in one line, its checkpoint missing, and runs again with the
script once the trunk is retried).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from loopscale.parallel import xla_flags
from loopscale.rundir.status import ExitCode
from loopscale.sweep.packing import Phase, phases, slots
from loopscale.sweep.plan_table import PlannedRun
from loopscale.sweep.sizing import Sized

LAUNCHERS = ("tpu-pod", "slurm")


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    repo: str = "~/loopscale"  # the project checkout on every host (experiment paths are relative)
    loopscale: str = "loopscale"  # the console script on the hosts
    tpu_name: str = "my-tpu"
    zone: str = "us-central2-b"
    project: str = ""
    nodes: int = 1
    gpus_per_node: int = 0
    parallel: int = 0  # Slurm: at most this many array tasks at once (0: no limit)
    time: str = "24:00:00"
    partition: str = ""
    sbatch_args: tuple[str, ...] = ()  # extra `#SBATCH` options, e.g. --account=X


def budget_text(budget: float | None) -> str:
    return "-" if budget is None else f"{budget:.3g}"


def _join(path: str, *parts: str) -> str:
    return "/".join([path.rstrip("/"), *parts])


def trunks_first(runs: Sequence[PlannedRun]) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(every run that starts from scratch, trunks included; the cooldown branches), each in
    plan order: the order a launcher must start them in."""
    branches = [run for run in runs if run.config.train.branch_from]
    return [run for run in runs if not run.config.train.branch_from], branches


def train_args(run: PlannedRun, workdir: str) -> list[str]:
    """The arguments of `loopscale train` for one run (the same as the local runner's)."""
    return run.train_args(_join(workdir, "runs", run.run_id))


def _header(name: str, runs: Sequence[PlannedRun], workdir: str, how: str) -> str:
    return (f"# loopscale sweep {name}: {len(runs)} runs into {workdir}\n"
            f"# {how}\n# Written by `loopscale sweep --launcher`. Running it again resumes: "
            "`loopscale train` skips\n# completed and diverged runs and resumes interrupted "
            "ones from their checkpoints.\n")


def tpu_pod_script(name: str, runs: Sequence[PlannedRun], workdir: str, o: ClusterOptions,
                   sized: Sized | None = None) -> str:
    """The script of module docstring; `sized` (the runs' chips on a slice) packs them, and
    without it every run takes the whole slice in turn."""
    q = shlex.quote
    groups = [group for group in trunks_first(runs) if group]  # branches after their trunks
    if sized is None:
        plan_phases = [Phase(None, tuple(run.run_id for run in group)) for group in groups]
        how = "Runs every run in turn on all hosts of one TPU slice"
    else:
        slc = sized.slice
        need = {n.run_id: n for n in sized.needs}
        plan_phases = [phase for group in groups
                       for phase in phases(slc, [need[run.run_id] for run in group])]
        how = (f"Packs the runs onto the chips of {slc.name} ({slc.chips} chips, {slc.hosts} "
               f"host(s) of {slc.chips_per_host})")
    if len(groups) > 1:
        how += ", the cooldown branches after every trunk"
    chips = {n.run_id: n.chips for n in sized.needs} if sized else {}
    lines = [
        "#!/usr/bin/env bash",
        _header(name, runs, workdir, how + ":\n#   TPU_NAME=my-slice ZONE=us-central2-b bash "
                "tpu-pod.sh\n# Each run's output goes to $LOGS/RUN_ID.log here."),
        "set -uo pipefail",
        f"TPU_NAME=\"${{TPU_NAME:-{o.tpu_name}}}\"",
        f"ZONE=\"${{ZONE:-{o.zone}}}\"",
        f"PROJECT=\"${{PROJECT:-{o.project}}}\"",
        f"REPO=\"${{REPO:-{o.repo}}}\"",
        f"LOOPSCALE=\"${{LOOPSCALE:-{o.loopscale}}}\"",
        f"LOGS=\"${{LOGS:-tpu-pod-logs/{name}}}\"",
        f"WORKDIR={q(workdir.rstrip('/'))}",
        f"CACHE={q(_join(workdir, 'jax_cache'))}",
        "# libtpu's flags for every run (loopscale/parallel/xla_flags.py: collectives overlapped",
        "# with compute), after any of your own in LIBTPU_INIT_ARGS.",
        "LIBTPU_ARGS=\"${LIBTPU_INIT_ARGS:+$LIBTPU_INIT_ARGS }"
        f"{xla_flags.as_args(xla_flags.TPU)}\"",
        "mkdir -p \"$LOGS\"",
        "# This invocation's bookkeeping: a run is started by the slot that first creates",
        "# $CLAIMS/RUN_ID (mkdir is atomic), and failures are listed in $CLAIMS/failed.",
        "CLAIMS=$(mktemp -d \"${TMPDIR:-/tmp}/loopscale-claims.XXXXXX\")",
        "trap 'rm -rf \"$CLAIMS\"' EXIT",
        "# Interrupted: stop every slot and its ssh sessions (the whole process group).",
        "trap 'trap - INT TERM; kill 0' INT TERM",
        "",
        *_run_args_function(runs, workdir, chips),
        "",
        "# finished RUN_ID: its summary says completed or diverged (then nothing is launched).",
        "finished() {",
        "  local summary=\"$WORKDIR/runs/$1/summary.json\"",
        "  case \"$summary\" in",
        "    gs://*) gcloud storage cat \"$summary\" 2>/dev/null ;;",
        "    *) cat \"$summary\" 2>/dev/null ;;",
        "  esac | grep -Eq '\"status\": *\"(completed|diverged)\"'",
        "}",
        "",
        "# ssh_run RUN_ID WORKER ENV [FLAG]: `loopscale train [FLAG]` of the run on host WORKER",
        "# (`all`: on every host) with the variables ENV; a failure is recorded.",
        "ssh_run() {",
        "  local id=\"$1\" worker=\"$2\" env=\"$3\" flag=\"${4:-}\" remote rc",
        "  run_args \"$id\"",
        "  remote=\"cd $REPO && $env LIBTPU_INIT_ARGS=$(printf %q \"$LIBTPU_ARGS\") "
        "JAX_COMPILATION_CACHE_DIR=$(printf %q \"$CACHE\") "
        "$LOOPSCALE train $flag $(printf '%q ' \"${ARGS[@]}\")\"",
        "  gcloud compute tpus tpu-vm ssh \"$TPU_NAME\" --zone=\"$ZONE\" "
        "${PROJECT:+--project=\"$PROJECT\"} --worker=\"$worker\" --command=\"$remote\" "
        "</dev/null >>\"$LOGS/$id.log\" 2>&1",
        "  rc=$?",
        "  # 0: completed, 3: diverged (a result, not a failure); anything else is retried by",
        "  # running this script again (`loopscale train` resumes from the checkpoint).",
        "  if [ \"$rc\" -ne 0 ] && [ \"$rc\" -ne 3 ]; then",
        "    echo \"run $id failed (exit $rc; log: $LOGS/$id.log)\" >&2",
        "    echo \"$id\" >>\"$CLAIMS/failed\"",
        "  fi",
        "}",
        "",
        "# slot WORKER CHIPS BOUNDS PORT RUN_ID...: one process at a time on chips CHIPS of host",
        "# WORKER, taking the queue's runs that no other slot has claimed. libtpu's variables",
        "# make the process a one-process slice of its own on just those chips:",
        "#   TPU_VISIBLE_CHIPS             the host's chips this process opens (the others are",
        "#                                 another slot's);",
        "#   TPU_CHIPS_PER_PROCESS_BOUNDS  their extent along the chip axes (2 chips: 1,2,1);",
        "#   TPU_PROCESS_BOUNDS=1,1,1      one process in this slice (instead of the pod's",
        "#                                 hosts from the TPU metadata);",
        "#   TPU_PROCESS_PORT              the port libtpu listens on for its slice's processes,",
        "#                                 one per slot so that they do not collide;",
        "#   TPU_PROCESS_ADDRESSES         the addresses of the slice's processes: only itself,",
        "#                                 so it neither waits for nor contacts other hosts;",
        "#   CLOUD_TPU_TASK_ID=0           its index among them (else the host's worker id);",
        "#   ALLOW_MULTIPLE_LIBTPU_LOAD=1  lets several processes of one host load libtpu,",
        "#                                 which its lock file would refuse.",
        "# No jax.distributed: each run is a single process.",
        "slot() {",
        "  local worker=\"$1\" chips=\"$2\" bounds=\"$3\" port=\"$4\" id; shift 4",
        "  for id in \"$@\"; do",
        "    mkdir \"$CLAIMS/$id\" 2>/dev/null || continue",
        "    finished \"$id\" && continue",
        "    echo \"==> $id on host $worker, chips $chips\"",
        "    ssh_run \"$id\" \"$worker\" \"ALLOW_MULTIPLE_LIBTPU_LOAD=1 TPU_VISIBLE_CHIPS=$chips "
        "TPU_CHIPS_PER_PROCESS_BOUNDS=$bounds TPU_PROCESS_BOUNDS=1,1,1 TPU_PROCESS_PORT=$port "
        "TPU_PROCESS_ADDRESSES=localhost:$port CLOUD_TPU_TASK_ID=0\"",
        "  done",
        "}",
        "",
        "# whole_slice RUN_ID...: each run in turn on every chip of the slice, `loopscale train",
        "# --distributed` on all hosts (jax.distributed finds them from the TPU metadata).",
        "whole_slice() {",
        "  local id",
        "  for id in \"$@\"; do",
        "    mkdir \"$CLAIMS/$id\" 2>/dev/null || continue",
        "    finished \"$id\" && continue",
        "    echo \"==> $id on all hosts\"",
        "    ssh_run \"$id\" all \"\" --distributed",
        "  done",
        "}",
        "",
    ]
    lines += [
        "# One session with every host first, in the foreground: gcloud creates and copies its",
        "# ssh key here (and may ask), not in dozens of sessions at once, and a wrong TPU_NAME",
        "# or ZONE stops the script before any run is claimed.",
        "gcloud compute tpus tpu-vm ssh \"$TPU_NAME\" --zone=\"$ZONE\" "
        "${PROJECT:+--project=\"$PROJECT\"} --worker=all --command=true </dev/null || exit 1",
        "",
    ]
    for i, phase in enumerate(plan_phases):
        lines.append(f"# Phase {i + 1}/{len(plan_phases)}: " + _phase_text(phase, sized))
        queue = " ".join(phase.run_ids)
        if phase.size is None:
            lines.append(f"whole_slice {queue}")
        else:
            blocks = slots(sized.slice, phase.size)
            lines.append(f"QUEUE=({queue})")
            for b in blocks:
                lines.append(f"slot {b.worker} {','.join(map(str, b.chips))} {b.bounds} {b.port} "
                             "\"${QUEUE[@]}\" &")
            lines.append("wait")
        lines.append("")
    lines += [
        "failed=$(cat \"$CLAIMS/failed\" 2>/dev/null | wc -l | tr -d ' ')",
        "echo \"$failed run(s) failed\" >&2",
        "[ \"$failed\" -eq 0 ]",
        "",
    ]
    return "\n".join(lines)


def _phase_text(phase: Phase, sized: Sized | None) -> str:
    n = len(phase.run_ids)
    if phase.size is None:
        return f"{n} run(s) one after another, each on the whole slice."
    per = sized.slice.chips_per_host // phase.size
    return (f"{n} run(s) on {phase.size} chip(s) each, {per} at a time on each of the "
            f"{sized.slice.hosts} host(s), longest first.")


def _run_args_function(runs: Sequence[PlannedRun], workdir: str,
                       chips: dict[str, int | None]) -> list[str]:
    q = shlex.quote
    lines = ["# run_args RUN_ID: ARGS=(the run's `loopscale train` arguments).", "run_args() {",
             "  case \"$1\" in"]
    for run in runs:
        need = chips.get(run.run_id)
        lines.append(f"    # {run.family} budget={budget_text(run.budget)} "
                     f"d_model={run.config.model.d_model} steps={run.config.train.steps}"
                     + (f" chips={need}" if need else ""))
        lines.append(f"    {run.run_id}) ARGS=(" + " ".join(q(a) for a in train_args(run, workdir))
                     + ") ;;")
    lines += ["  esac", "}"]
    return lines


def slurm_script(name: str, runs: Sequence[PlannedRun], workdir: str,
                 o: ClusterOptions) -> str:
    q = shlex.quote
    first, branches = trunks_first(runs)
    runs = first + branches  # array indices: the trunks' first
    limit = f"%{o.parallel}" if o.parallel else ""
    array = f"0-{len(first) - 1}{limit}"
    sbatch = [f"--job-name=loopscale-{name}", f"--array={array}", f"--nodes={o.nodes}",
              "--ntasks-per-node=1", f"--time={o.time}", "--output=slurm-%x-%A_%a.out"]
    if o.gpus_per_node:
        sbatch.append(f"--gpus-per-node={o.gpus_per_node}")
    if o.partition:
        sbatch.append(f"--partition={o.partition}")
    sbatch += list(o.sbatch_args)
    lines = [
        "#!/usr/bin/env bash",
        *(f"#SBATCH {s}" for s in sbatch),
        _header(name, runs, workdir, "One array task per run, one `loopscale train` per node:"
                + ("\n#   bash slurm.sh   (submits the trunks, then the branches after them)"
                   if branches else "\n#   sbatch slurm.sh")),
        "set -euo pipefail",
        f"REPO=\"${{REPO:-{o.repo}}}\"",
        f"LOOPSCALE=\"${{LOOPSCALE:-{o.loopscale}}}\"",
        "",
    ]
    if branches:
        lines += [
            f"# Run with bash (not in an array task): submit tasks 0-{len(first) - 1} (every run "
            "that starts",
            f"# from scratch), then {len(first)}-{len(runs) - 1} (the cooldown branches) once "
            "they have all ended.",
            "if [ -z \"${SLURM_ARRAY_TASK_ID:-}\" ]; then",
            "  trunks=$(sbatch --parsable \"$0\")",
            f"  sbatch --dependency=\"afterany:${{trunks%%;*}}\" "
            f"--array={len(first)}-{len(runs) - 1}{limit} \"$0\"",
            "  exit",
            "fi",
            "",
        ]
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
        f"export JAX_COMPILATION_CACHE_DIR={q(_join(workdir, 'jax_cache'))}",
        *_gpu_flags(o),
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


def _gpu_flags(o: ClusterOptions) -> list[str]:
    """XLA:GPU's flags for a GPU allocation (none for CPU nodes)."""
    if not o.gpus_per_node:
        return []
    return ["# XLA:GPU's flags for every run (loopscale/parallel/xla_flags.py: the latency-hiding",
            "# scheduler overlaps NCCL's collectives with compute), after any of your own.",
            f"export XLA_FLAGS=\"${{XLA_FLAGS:+$XLA_FLAGS }}{xla_flags.as_args(xla_flags.GPU)}\""]


SCRIPTS = {"tpu-pod": "tpu-pod.sh", "slurm": "slurm.sh"}


def script(launcher: str, name: str, runs: Sequence[PlannedRun], workdir: str,
           options: ClusterOptions, sized: Sized | None = None) -> tuple[str, str]:
    """(file name, text) of the launch script; `sized` packs a tpu-pod script's runs."""
    if launcher == "tpu-pod":
        return SCRIPTS[launcher], tpu_pod_script(name, runs, workdir, options, sized)
    return SCRIPTS[launcher], slurm_script(name, runs, workdir, options)
