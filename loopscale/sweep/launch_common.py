"""What the launch scripts of every cluster share: the options of `loopscale sweep
--launcher`, the order runs must start in (trunks before their cooldown branches), each run's
`loopscale train` arguments, and the bash that names them (launch_tpu.py, launch_slurm.py)."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from loopscale.errors import UsageError
from loopscale.rundir.status import ExitCode
from loopscale.sweep.plan_table import PlannedRun


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
    gpus_per_run: int = 0  # Slurm: packs runs this many GPUs each on a node (0: whole nodes)

    def check(self) -> None:
        """UsageError in one line for options that cannot make a script."""
        if self.nodes < 1:
            raise UsageError(f"--nodes must be at least 1, got {self.nodes}")
        if self.gpus_per_run < 0 or self.gpus_per_node < 0:
            raise UsageError("--gpus-per-node and --gpus-per-run must be at least 0")
        if not self.gpus_per_run:
            return
        if not self.gpus_per_node or self.gpus_per_node % self.gpus_per_run:
            raise UsageError(f"--gpus-per-run={self.gpus_per_run} packs runs onto a node's GPUs: "
                             f"it must divide --gpus-per-node (got {self.gpus_per_node})")
        if self.nodes != 1:
            raise UsageError("--gpus-per-run packs runs within one node: it needs --nodes=1, "
                             f"got {self.nodes}")

    @property
    def packs(self) -> bool:
        return 0 < self.gpus_per_run < self.gpus_per_node


def budget_text(budget: float | None) -> str:
    return "-" if budget is None else f"{budget:.3g}"


def join_path(path: str, *parts: str) -> str:
    return "/".join([path.rstrip("/"), *parts])


def trunks_first(runs: Sequence[PlannedRun]) -> tuple[list[PlannedRun], list[PlannedRun]]:
    """(every run that starts from scratch, trunks included; the cooldown branches), each in
    plan order: the order a launcher must start them in."""
    branches = [run for run in runs if run.config.train.branch_from]
    return [run for run in runs if not run.config.train.branch_from], branches


def train_args(run: PlannedRun, workdir: str) -> list[str]:
    """The arguments of `loopscale train` for one run (the same as the local runner's)."""
    return run.train_args(join_path(workdir, "runs", run.run_id))


def header(name: str, runs: Sequence[PlannedRun], workdir: str, how: str) -> str:
    return (f"# loopscale sweep {name}: {len(runs)} runs into {workdir}\n"
            f"# {how}\n# Written by `loopscale sweep --launcher`. Running it again resumes: "
            "`loopscale train` skips\n# completed and diverged runs and resumes interrupted "
            "ones from their checkpoints.\n")


def run_args_function(runs: Sequence[PlannedRun], workdir: str,
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


def claims(whose: str) -> list[str]:
    """Bash: $CLAIMS, the packing slots' bookkeeping (`whose`: this invocation's, this
    node's), removed on exit."""
    return [f"# {whose} bookkeeping: a run is started by the slot that first creates",
            "# $CLAIMS/RUN_ID (mkdir is atomic), and failures are listed in $CLAIMS/failed.",
            "CLAIMS=$(mktemp -d \"${TMPDIR:-/tmp}/loopscale-claims.XXXXXX\")",
            "trap 'rm -rf \"$CLAIMS\"' EXIT"]


def record_failure(indent: str, again: str) -> list[str]:
    """Bash after a run's `rc=$?`: a failure (not a divergence) is said and listed in
    $CLAIMS/failed; `again` is what to run again to retry it."""
    diverged = ExitCode.DIVERGED.value
    return [f"{indent}# 0: completed, {diverged}: diverged (a result, not a failure); anything "
            "else is retried by",
            f"{indent}# running {again} again (`loopscale train` resumes from the checkpoint).",
            f"{indent}if [ \"$rc\" -ne 0 ] && [ \"$rc\" -ne {diverged} ]; then",
            f"{indent}  echo \"run $id failed (exit $rc; log: $LOGS/$id.log)\" >&2",
            f"{indent}  echo \"$id\" >>\"$CLAIMS/failed\"",
            f"{indent}fi"]


# Bash at the end: how many runs failed, and the script's status (0: none).
FAILURES = ["failed=$(cat \"$CLAIMS/failed\" 2>/dev/null | wc -l | tr -d ' ')",
            "echo \"$failed run(s) failed\" >&2",
            "[ \"$failed\" -eq 0 ]"]

