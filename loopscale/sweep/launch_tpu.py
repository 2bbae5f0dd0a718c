"""The tpu-pod launch script, run from any machine with gcloud.

Given the runs' chips on the slice (`--topology`, sizing.py), it follows packing.py's phases.
Runs that fit on one host's chips are packed: per phase (one chip count), one `slot` loop per
block of chips of every host takes the next unclaimed run of the phase's queue (claims are
atomic `mkdir`s in a temporary directory of this invocation) and trains it with `gcloud
compute tpus tpu-vm ssh --worker=N --command=...`, a process of its own restricted to its
chips by libtpu's variables (the script's comments say what each does), so hosts never idle
while runs are left. Runs needing more chips than a host has then run one after another on the
whole slice (`--worker=all`, `loopscale train --distributed` on every host, jax.distributed
finding the hosts from the TPU metadata). A run whose summary says completed or diverged is not
launched again, so re-running the script after an interruption only resumes what is
unfinished. Without sizes every run takes the whole slice in turn.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from loopscale.parallel import xla_flags
from loopscale.sweep.launch_common import (FAILURES, ClusterOptions, claims, header,
                                           join_path, record_failure, run_args_function,
                                           trunks_first)
from loopscale.sweep.packing import Phase, phases, slots
from loopscale.sweep.plan_table import PlannedRun
from loopscale.sweep.sizing import Sized


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
        header(name, runs, workdir, how + ":\n#   TPU_NAME=my-slice ZONE=us-central2-b bash "
                "tpu-pod.sh\n# Each run's output goes to $LOGS/RUN_ID.log here."),
        "set -uo pipefail",
        f"TPU_NAME=\"${{TPU_NAME:-{o.tpu_name}}}\"",
        f"ZONE=\"${{ZONE:-{o.zone}}}\"",
        f"PROJECT=\"${{PROJECT:-{o.project}}}\"",
        f"REPO=\"${{REPO:-{o.repo}}}\"",
        f"LOOPSCALE=\"${{LOOPSCALE:-{o.loopscale}}}\"",
        f"LOGS=\"${{LOGS:-tpu-pod-logs/{name}}}\"",
        f"WORKDIR={q(workdir.rstrip('/'))}",
        f"CACHE={q(join_path(workdir, 'jax_cache'))}",
        "# libtpu's flags for every run (loopscale/parallel/xla_flags.py: collectives overlapped",
        "# with compute), after any of your own in LIBTPU_INIT_ARGS.",
        "LIBTPU_ARGS=\"${LIBTPU_INIT_ARGS:+$LIBTPU_INIT_ARGS }"
        f"{xla_flags.as_args(xla_flags.TPU)}\"",
        "mkdir -p \"$LOGS\"",
        *claims("This invocation's"),
        "# Interrupted: stop every slot and its ssh sessions (the whole process group).",
        "trap 'trap - INT TERM; kill 0' INT TERM",
        "",
        *run_args_function(runs, workdir, chips),
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
        *record_failure("  ", "this script"),
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
        *FAILURES,
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
