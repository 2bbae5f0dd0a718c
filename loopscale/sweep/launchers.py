"""Launch scripts for clusters: the plan as bash that runs `loopscale train` once per run on
the chips of a TPU slice (`tpu-pod`, launch_tpu.py) or the nodes of a Slurm job (`slurm`,
launch_slurm.py), from what both share (launch_common.py).

Both scripts are resumable the same way the local runner is: `loopscale train` skips a run
whose summary says completed or diverged and resumes an interrupted one from its checkpoint,
so a script (or a Slurm array task) can simply be run again. The workdir may be a gs:// path.
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

from collections.abc import Sequence

from loopscale.sweep.launch_common import ClusterOptions
from loopscale.sweep.launch_slurm import slurm_script
from loopscale.sweep.launch_tpu import tpu_pod_script
from loopscale.sweep.plan_table import PlannedRun
from loopscale.sweep.sizing import Sized

LAUNCHERS = ("tpu-pod", "slurm")
SCRIPTS = {"tpu-pod": "tpu-pod.sh", "slurm": "slurm.sh"}


def script(launcher: str, name: str, runs: Sequence[PlannedRun], workdir: str,
           options: ClusterOptions, sized: Sized | None = None) -> tuple[str, str]:
    """(file name, text) of the launch script; `sized` packs a tpu-pod script's runs."""
    if launcher == "tpu-pod":
        return SCRIPTS[launcher], tpu_pod_script(name, runs, workdir, options, sized)
    return SCRIPTS[launcher], slurm_script(name, runs, workdir, options)
