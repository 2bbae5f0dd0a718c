"""Launch scripts for clusters: the plan as bash that runs `loopscale train` once per run on
every host of a TPU slice (`tpu-pod`) or every node of a Slurm job (`slurm`).

Both scripts are resumable the same way the local runner is: `loopscale train` skips a run
whose summary says completed or diverged and resumes an interrupted one from its checkpoint,
so a script (or a Slurm array task) can simply be run again. The workdir may be a gs:// path.

- tpu-pod: one script runs the plan's runs one after another on one slice; each run is
  `gcloud compute tpus tpu-vm ssh $TPU_NAME --worker=all --command=...`, i.e. the same
  `loopscale train --distributed` on every host, where jax.distributed.initialize() finds the
  slice's hosts from the TPU metadata.
- slurm: one sbatch array job, one array task per run, `--nodes` nodes each; `srun` starts one
  `loopscale train` per node with JAX_COORDINATOR_ADDRESS (the first node of the allocation),
  JAX_NUM_PROCESSES (the number of nodes) and JAX_PROCESS_ID (SLURM_PROCID) set explicitly,
  which `loopscale train` reads.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from loopscale.sweep.plan import PlannedRun

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


def train_args(run: PlannedRun, workdir: str) -> list[str]:
    """The arguments of `loopscale train` for one run (the same as the local runner's)."""
    return [*run.config_args(), f"--workdir={_join(workdir, 'runs', run.run_id)}"]


def _header(name: str, runs: Sequence[PlannedRun], workdir: str, how: str) -> str:
    return (f"# loopscale sweep {name}: {len(runs)} runs into {workdir}\n"
            f"# {how}\n# Written by `loopscale sweep --launcher`. Running it again resumes: "
            "`loopscale train` skips\n# completed and diverged runs and resumes interrupted "
            "ones from their checkpoints.\n")


def tpu_pod_script(name: str, runs: Sequence[PlannedRun], workdir: str,
                   o: ClusterOptions) -> str:
    q = shlex.quote
    lines = [
        "#!/usr/bin/env bash",
        _header(name, runs, workdir, "Runs every run in turn on one TPU slice, on all of its "
                "hosts at once:\n#   TPU_NAME=my-slice ZONE=us-central2-b bash tpu-pod.sh"),
        "set -uo pipefail",
        f"TPU_NAME=\"${{TPU_NAME:-{o.tpu_name}}}\"",
        f"ZONE=\"${{ZONE:-{o.zone}}}\"",
        f"PROJECT=\"${{PROJECT:-{o.project}}}\"",
        f"REPO=\"${{REPO:-{o.repo}}}\"",
        f"LOOPSCALE=\"${{LOOPSCALE:-{o.loopscale}}}\"",
        f"CACHE={q(_join(workdir, 'jax_cache'))}",
        "failed=0",
        "",
        "# run RUN_ID TRAIN_ARGS...: `loopscale train --distributed` on every host of the slice.",
        "run() {",
        "  local id=\"$1\"; shift",
        "  local remote",
        "  remote=\"cd $REPO && JAX_COMPILATION_CACHE_DIR=$(printf %q \"$CACHE\") "
        "$LOOPSCALE train --distributed $(printf '%q ' \"$@\")\"",
        "  echo \"==> $id\"",
        "  gcloud compute tpus tpu-vm ssh \"$TPU_NAME\" --zone=\"$ZONE\" "
        "${PROJECT:+--project=\"$PROJECT\"} --worker=all --command=\"$remote\"",
        "  local rc=$?",
        "  # 0: completed, 3: diverged (a result, not a failure); anything else is retried by",
        "  # running this script again.",
        "  if [ \"$rc\" -ne 0 ] && [ \"$rc\" -ne 3 ]; then",
        "    echo \"run $id failed (exit $rc)\" >&2; failed=$((failed + 1))",
        "  fi",
        "}",
        "",
    ]
    for i, run in enumerate(runs):
        lines.append(f"# {i + 1}/{len(runs)} {run.family} budget={budget_text(run.budget)} "
                     f"d_model={run.config.model.d_model} steps={run.config.train.steps}")
        lines.append("run " + " ".join(q(a) for a in [run.run_id, *train_args(run, workdir)]))
    lines += ["", "echo \"$failed run(s) failed\" >&2", "[ \"$failed\" -eq 0 ]", ""]
    return "\n".join(lines)


def slurm_script(name: str, runs: Sequence[PlannedRun], workdir: str,
                 o: ClusterOptions) -> str:
    q = shlex.quote
    array = f"0-{len(runs) - 1}" + (f"%{o.parallel}" if o.parallel else "")
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
                "\n#   sbatch slurm.sh"),
        "set -euo pipefail",
        f"REPO=\"${{REPO:-{o.repo}}}\"",
        f"LOOPSCALE=\"${{LOOPSCALE:-{o.loopscale}}}\"",
        "",
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
        "cd \"${REPO/#\\~/$HOME}\"  # a leading ~ is not expanded inside quotes",
        "echo \"==> $RUN_ID on $SLURM_NNODES node(s)\"",
        "rc=0",
        "srun --ntasks=\"$SLURM_NNODES\" --ntasks-per-node=1 "
        "bash -c 'JAX_PROCESS_ID=$SLURM_PROCID exec \"$@\"' _ "
        "$LOOPSCALE train \"${ARGS[@]}\" || rc=$?",
        "# 3: diverged, a result like any other.",
        "if [ \"$rc\" -eq 3 ]; then exit 0; fi",
        "exit \"$rc\"",
        "",
    ]
    return "\n".join(lines)


SCRIPTS = {"tpu-pod": ("tpu-pod.sh", tpu_pod_script), "slurm": ("slurm.sh", slurm_script)}


def script(launcher: str, name: str, runs: Sequence[PlannedRun], workdir: str,
           options: ClusterOptions) -> tuple[str, str]:
    """(file name, text) of the launch script."""
    filename, build = SCRIPTS[launcher]
    return filename, build(name, runs, workdir, options)
