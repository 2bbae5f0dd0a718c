"""One training job: an experiment file and its overrides trained in a run directory, then
measured if asked. `loopscale train` runs one; so does each of a sweep's warm workers
(sweep/worker.py), with no command line between them.

A job is what `loopscale train` is told: `--config=experiments/NAME.py[:ARG]`, its
`--config.a.b=v` overrides as typed, `--workdir=DIR`, and `--eval=WHAT`, the `loopscale eval`
measurements to take once the run has completed. `TrainJob.argv` writes it back as those
arguments (the launch scripts and command.sh run them), so a job and its command line say the
same thing.

Bad input (a malformed config, an unknown field, an unknown measurement) is a UsageError raised
before any device or file is touched.
"""

from __future__ import annotations

import dataclasses
import os

from loopscale.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Distributed:
    """How the processes of a multi-host run find each other. `coordinator` (HOST:PORT of
    process 0) starts jax.distributed explicitly, with `num_processes` and `process_id`;
    `detect` lets JAX find the cluster itself (TPU pod slices, Slurm); neither: one process."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    detect: bool = False

    @classmethod
    def from_env(cls, detect: bool = False) -> Distributed:
        """The explicit coordinator from JAX's own variables, as `loopscale train` defaults to."""
        def env_int(name: str) -> int | None:
            value = os.environ.get(name)
            return int(value) if value else None

        return cls(os.environ.get("JAX_COORDINATOR_ADDRESS"), env_int("JAX_NUM_PROCESSES"),
                   env_int("JAX_PROCESS_ID"), detect)

    def initialize(self) -> None:
        """Starts jax.distributed as asked; with `detect`, UsageError in one line when JAX's
        auto-detection finds no cluster (rather than its ValueError deep in initialize)."""
        import jax

        if self.detect and not self.coordinator and _cluster_env() is None:
            raise UsageError(
                "--distributed: no cluster found to join (JAX detects a Cloud TPU pod slice, "
                "Slurm, Open MPI or Kubernetes from their environment variables); on one host "
                "drop --distributed, or start each process with --coordinator=HOST:PORT "
                "--num-processes=N --process-id=I")
        if self.coordinator or self.detect:
            # CPU processes reduce over gloo; only the CPU backend reads this, and it must be
            # set before any backend starts.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if self.coordinator:
            jax.distributed.initialize(coordinator_address=self.coordinator,
                                       num_processes=self.num_processes,
                                       process_id=self.process_id)
        elif self.detect:
            jax.distributed.initialize()


def _cluster_env():
    """JAX's detector of the cluster `jax.distributed.initialize()` would join here, or None:
    JAX's own detectors in the order it tries them (it lists them nowhere public, hence the
    private module). Presence only: reading the coordinator may query a metadata server."""
    from jax._src import clusters

    return next((env for env in clusters.ClusterEnv._cluster_types
                 if not env.opt_in_only_method and env.is_env_present()), None)


def detected_cluster() -> tuple[str, str, int, int] | None:
    """What `jax.distributed.initialize()` would join here: (JAX's detector for it, e.g.
    SlurmCluster; the coordinator HOST:PORT; the number of processes; this process's id), or
    None when no cluster is detected."""
    from jax._src import clusters

    env = _cluster_env()
    if env is None:
        return None
    detect = clusters.ClusterEnv.auto_detect_unset_distributed_params
    coordinator, processes, process_id, _ = detect(None, None, None, None, env.name, 60)
    return env.__name__, coordinator, processes, process_id


@dataclasses.dataclass(frozen=True)
class TrainJob:
    experiment: str  # experiments/NAME.py[:ARG]
    workdir: str
    overrides: tuple[str, ...] = ()  # "--config.a.b=v", as typed
    measure: str = ""  # `loopscale eval` names, comma-separated; "" measures nothing
    allow_cpu: bool = False  # train an accelerator-sized run on a CPU all the same

    def argv(self) -> list[str]:
        """The arguments of `loopscale train` that run this job."""
        evals = [f"--eval={self.measure}"] if self.measure else []
        return [f"--config={self.experiment}", *self.overrides, f"--workdir={self.workdir}",
                *evals, *(["--allow-cpu"] if self.allow_cpu else [])]


# A run planned to spend more training FLOPs than this is meant for an accelerator: on a CPU
# it refuses unless --allow-cpu. At CPU_FLOPS (an assumed order of magnitude: `make bench`
# measured loopscale's steps at 4-67 GFLOP/s on a 2-core CPU) 1e15 is about 14 hours; every
# `tiny` preset plans at most 1.2e13 (FLT at 12 loops), every `small` and `paper` one 7e15 or
# more (a `paper` preset's default 200 steps included).
CPU_FLOPS_LIMIT = 1e15
CPU_FLOPS = 2e10


def refuse_on_cpu(config) -> None:
    """UsageError in one line when this process would train an accelerator-sized run on CPUs
    only (what a GPU node without the `gpu` extra silently does)."""
    import jax

    from loopscale.train.loop_schedule import planned_flops_per_token

    if jax.default_backend() != "cpu":
        return
    t = config.train
    total = planned_flops_per_token(config) * t.steps * t.batch_size * t.seq_len
    if total > CPU_FLOPS_LIMIT:
        hours = total / CPU_FLOPS / 3600
        raise UsageError(
            f"{config.name} plans {total:.2g} training FLOPs and JAX sees only CPUs (about "
            f"{hours:,.0f} hours at {CPU_FLOPS:.0e} FLOP/s): install the gpu extra (make "
            f"install-gpu) or run on a TPU, or pass --allow-cpu to train here anyway")


def run(job: TrainJob, distributed: Distributed = Distributed()) -> int:
    """Trains (or resumes) the job's run, then takes its measurements if it completed; the
    exit code (rundir/status.py ExitCode). UsageError on bad input."""
    from loopscale.config import load_config, parse
    from loopscale.evaluate.suite import evaluate_run, parse_what
    from loopscale.rundir.run import read_summary
    from loopscale.rundir.status import ExitCode, RunStatus
    from loopscale.train.trainer import train

    bad = [o for o in job.overrides if not o.startswith("--config.")]
    if bad:
        raise UsageError(f"a training job takes --config.* overrides only, not {bad[0]}")
    config = parse(load_config(job.experiment, list(job.overrides)))
    what = parse_what(job.measure, "--eval") if job.measure else ()
    distributed.initialize()
    if not job.allow_cpu:
        refuse_on_cpu(config)
    code = train(config, job.workdir)
    completed = RunStatus.of(read_summary(job.workdir)) is RunStatus.COMPLETED
    if what and code == ExitCode.OK and completed:
        evaluate_run(job.workdir, what)
    return code
