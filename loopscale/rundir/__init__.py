"""The run directory: its format, written by the trainer and read by everything after it.

This package owns what a run and a sweep leave on disk, so the trainer, the sweep runner,
collect, report and the evaluators agree on it by importing it:

- status.py: RunStatus (summary.json's `status`), ExitCode, LaunchOutcome (attempts.jsonl).
- run.py: one run directory (config.json, metrics.jsonl, summary.json, checkpoints/,
  tensorboard/, eval/): RunDirectory, the trainer's writer; read_config (config.json ->
  Config, older runs included), read_summary, last_metrics_row.
- checkpoint.py: orbax checkpoints of model, optimiser and data state; verified restore with
  fallback; parameters-only restore.
- load.py: load_run(dir, step=None, mesh=None) -> (Config, params), on any mesh.
- sweep.py: a sweep directory (plan.csv, runs/RUN_ID/ with run.json, command.sh,
  attempts.jsonl, train.log, locks).
- events.py: TensorBoard events written synchronously.

Files are written atomically and JSON read back through loopscale/files.py. Import the
submodules directly (`from loopscale.rundir.run import RunDirectory`): load.py and
checkpoint.py bring in JAX and orbax, which collect and report do not need.
"""
