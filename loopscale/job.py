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
        import jax

        if self.coordinator:
            # Only the CPU backend reads this; set before any backend starts.
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            jax.distributed.initialize(coordinator_address=self.coordinator,
                                       num_processes=self.num_processes,
                                       process_id=self.process_id)
        elif self.detect:
            jax.distributed.initialize()


@dataclasses.dataclass(frozen=True)
class TrainJob:
    experiment: str  # experiments/NAME.py[:ARG]
    workdir: str
    overrides: tuple[str, ...] = ()  # "--config.a.b=v", as typed
    measure: str = ""  # `loopscale eval` names, comma-separated; "" measures nothing

    def argv(self) -> list[str]:
        """The arguments of `loopscale train` that run this job."""
        evals = [f"--eval={self.measure}"] if self.measure else []
        return [f"--config={self.experiment}", *self.overrides, f"--workdir={self.workdir}",
                *evals]


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
    code = train(config, job.workdir)
    completed = RunStatus.of(read_summary(job.workdir)) is RunStatus.COMPLETED
    if what and code == ExitCode.OK and completed:
        evaluate_run(job.workdir, what)
    return code
