"""`loopscale train`: one run, on a mesh, resumable, leaving a complete run directory.

The flow: validate the workdir -> mesh -> sharded state (fresh or restored with the data
iterator) -> jitted step per loop count -> loop (log, evaluate, checkpoint, watch for
divergence and SIGTERM) -> final checkpoint and summary.json. Exit status: 0 completed (or
stopped cleanly by SIGTERM, to be resumed), 1 failed (a full disk, checkpoints that do not
restore: one line on stderr, status `failed`; run again to resume), 3 diverged.

This module holds the run's life (its start, the loop, its end or failure); the step shape's
model, state and compiled step are sharded_state.py, where a run starts is resume.py, and the
rows it logs are step_log.py. aot/compile.py and bench/steps.py reach the trainer's own step as
`trainer.setup`, `trainer.init_state`, `trainer.abstract_state` and `trainer.jit_train_step`,
so those names stay importable from here.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from loopscale import data as data_lib
from loopscale import flops as flops_lib
from loopscale.config import Config, DataSource, TrainConfig
from loopscale.data import permutation
from loopscale.errors import UsageError
from loopscale.parallel import mesh as mesh_lib
from loopscale.rundir.checkpoint import Checkpointer, CheckpointError, one_line
from loopscale.rundir.run import RunDirectory
from loopscale.rundir.status import ExitCode, RunStatus
from loopscale.train import diagnostics
from loopscale.train.eval_loss import evaluate, jit_eval_step
from loopscale.train.loop_schedule import loops_for_step, shared_frozen_slots
from loopscale.train.resume import restore
from loopscale.train.sharded_state import (  # noqa: F401 (the last two: see the docstring)
    Setup, jit_train_step, setup, abstract_state, init_state)
from loopscale.train.state_metrics import StateMetrics
from loopscale.train.step_log import Health, Pending, StepLog, Throughput

# Failures of the machine rather than of the code: a full disk, a lost filesystem, checkpoints
# that do not restore. They end the run with status `failed`, one line on stderr and
# ExitCode.FAILED; any other exception is a bug and keeps its traceback.
ENVIRONMENT_ERRORS = (OSError, CheckpointError)


class _Stop:
    """Set by SIGTERM: the loop saves a checkpoint at the end of the current step and exits.
    A context manager: SIGTERM is caught inside it, and its previous handler back after it."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame):
        self.requested = True

    def __enter__(self) -> _Stop:
        self._previous = signal.signal(signal.SIGTERM, self)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, self._previous)


def _loops_for_step(config: Config, step: int) -> int:
    return loops_for_step(config.train, config.model.n_loops, config.seed, step)


def train(config: Config, workdir: str, devices=None) -> int:
    """Runs (or resumes) one training run in `workdir` on `devices` (default: all)."""
    started = time.time()
    pi = jax.process_index()
    run = RunDirectory(workdir, write=pi == 0)
    run.check_config(config)
    previous = RunStatus.of(run.summary())
    if previous.done:
        print(f"{workdir}: run already {previous.value}; nothing to do", file=sys.stderr)
        return _exit_code(previous)

    s = setup(config, devices)
    with mesh_lib.activate(s.mesh):
        return _run(s, run, workdir, started)


def _run(s: Setup, run: RunDirectory, workdir: str, started: float) -> int:
    """The body of `train`, with the mesh and logical rules in context (mesh.activate)."""
    config = s.config
    pi, pc = jax.process_index(), jax.process_count()
    t = config.train
    accounting = flops_lib.report(config.model, t.seq_len, config.flop_convention,
                                  ragged_dot_dense=jax.default_backend() == "cpu")
    train_ds = data_lib.make_dataset(config.data, t, config.seed, "train", pi, pc)
    eval_ds = data_lib.make_dataset(config.data, t, config.seed, "eval", pi, pc)
    if train_ds.vocab_size > config.model.vocab_size:
        raise UsageError(f"model.vocab_size={config.model.vocab_size} is smaller than the data's "
                         f"vocabulary ({train_ds.vocab_size})")
    summary = {"status": RunStatus.RUNNING, **{k: v for k, v in accounting.items() if k.startswith("params_")},
               "flop_convention": accounting["flop_convention"],
               "flops_per_token_train": accounting["flops_per_token_train"],
               "flops_per_token_computed": accounting["flops_per_token_computed"]}
    checkpointer = None
    try:
        run.write_config(config)  # only once the config is known to be runnable
        checkpointer = Checkpointer(run.checkpoint_dir, t.keep_checkpoints, t.keep_steps)
        return _loop(s, run, workdir, started, accounting, train_ds, eval_ds, checkpointer, summary)
    except ENVIRONMENT_ERRORS as e:
        return _fail(run, workdir, started, checkpointer, summary, e)
    except Exception:  # a bug: status failed, and its traceback
        summary.update(status=RunStatus.FAILED, wall_time_s=time.time() - started)
        run.write_summary(summary)
        raise


def _fail(run: RunDirectory, workdir: str, started: float, checkpointer, summary: dict,
          error: BaseException) -> int:
    """Ends a run that the machine failed (ENVIRONMENT_ERRORS): status `failed` with the reason
    in summary.json if the disk still takes it, one line on stderr, ExitCode.FAILED. Running the
    same command again resumes from the last good checkpoint."""
    reason = one_line(error)
    logging.getLogger(__name__).debug("run failed", exc_info=error)  # shown by --verbose
    summary.update(status=RunStatus.FAILED, failed_reason=reason, wall_time_s=time.time() - started)
    for finish in (lambda: run.write_summary(summary), run.close,
                   checkpointer.close if checkpointer else lambda: None):
        try:
            finish()
        except Exception:  # the failing disk may refuse these too; the reason is on stderr
            pass
    if jax.process_index() == 0:
        print(f"loopscale train: error: {workdir}: run failed: {reason}", file=sys.stderr)
    return ExitCode.FAILED


def _loop(s: Setup, run: RunDirectory, workdir: str, started: float, accounting: dict,
          train_ds, eval_ds, checkpointer: Checkpointer, summary: dict) -> int:
    """From where the run stands to train.steps, or until it diverges or SIGTERM stops it;
    then the last checkpoint, the final evaluation and summary.json. Returns the exit status."""
    config, t = s.config, s.config.train
    restored, data_iter = restore(s, checkpointer, train_ds, workdir)
    start, state = restored.step, restored.state
    rows = run.open_metrics(start)
    with _Stop() as stop:
        state_metrics = StateMetrics(config, s.model, s.compiled)
        held_out = _held_out(s, state_metrics, eval_ds)
        past_loops = (_loops_for_step(config, i) for i in range(start))
        throughput = Throughput(config, accounting, past_loops)
        steps = _TrainSteps(s, throughput)
        health = Health(config, train_ds.vocab_size, restored, rows)
        run.write_summary(summary)
        # The host reads the device only at logged steps (train.log_every): the steps between
        # are dispatched without waiting and their metrics, left on the device, are fetched
        # together in one transfer, one step late (as nanodo does): the logged step is read
        # once the step after it has been dispatched, so the host's work (the next batch,
        # logging) overlaps the device's. Every step's row still passes the divergence rule,
        # at most log_every steps late. The host waits for the step it dispatched wherever the
        # state itself is needed (evaluation, checkpoint, per-loop gradients, the last step)
        # or SIGTERM asked to stop: there no step runs ahead, so a checkpoint holds the data
        # iterator exactly at its step, and no diverged state is ever saved.
        pending: list[Pending] = []
        finished, reason = False, None
        with StepLog(run, rows, config, throughput, health, start) as log:
            for step in range(start, t.steps):
                batch, n_loops = _next_batch(s, data_iter, health, step)
                state, metrics, lr_factor = steps.run(state, batch, step, n_loops)
                if pending and log.logged(pending[-1].done):
                    reason, pending = log.read(pending, {}), []
                    if reason:
                        break  # a step read while this one runs diverged
                pending.append(Pending(step + 1, metrics, n_loops, lr_factor, time.time()))
                due = _Due.at(t, step + 1, state_metrics, stop)
                if not due.wait:
                    continue
                reason = log.read(pending, state_metrics.measure(state.params, batch, n_loops,
                                                                 step + 1))
                pending = []
                if reason:
                    break
                if due.evaluate:
                    log.evaluation(held_out(state.params))
                if due.save:
                    # The rows it has seen stored first (they are written in a thread of their
                    # own): a failed write raises here, before a checkpoint skips past it.
                    run.flush()
                    checkpointer.save(log.done, state, data_iter, health.unigram.counts,
                                      health.watch())
                if stop.requested:
                    break
            else:
                # A run too short for the patience rule still meets the end-of-run one.
                finished, reason = True, health.divergence.check_end()
    status = (RunStatus.DIVERGED if reason else RunStatus.COMPLETED if finished
              else RunStatus.RUNNING)
    # Stopped by SIGTERM (still `running`) or completed: resumable from its last step.
    if status is not RunStatus.DIVERGED and checkpointer.latest_step() != log.done:
        run.flush()
        checkpointer.save(log.done, state, data_iter, health.unigram.counts, health.watch())
    final = log.final_evaluation(lambda: held_out(state.params)) \
        if status is RunStatus.COMPLETED else {}
    checkpointer.close()
    run.close()
    _summarise(summary, status, reason, log, final, health, steps.compile_time, started)
    run.write_summary(summary)
    _print_outcome(workdir, status, summary)
    return _exit_code(status)


def _held_out(s: Setup, state_metrics: StateMetrics, eval_ds):
    """params -> the eval loss per exit; for the permutation task also the answers' accuracy.
    The eval step is compiled once per step shape (s.compiled)."""
    if "eval" not in s.compiled:
        s.compiled["eval"] = jit_eval_step(s.model, s.config.train, s.config.model.n_loops,
                                           param_shardings=s.state_shardings.params,
                                           batch_sharding=s.batch_sharding)
    eval_fn = s.compiled["eval"]
    answers = s.config.data.source is DataSource.PERMUTATION

    def held_out(params) -> dict:
        out = evaluate(eval_fn, params, eval_ds, s.batch_sharding)
        if answers:
            out.update(state_metrics.answer_accuracy(params, eval_ds, s.batch_sharding))
        return out
    return held_out


class _TrainSteps:
    """The compiled train step per loop count, compiled on first use into the step shape's
    cache (s.compiled["train"], kept across runs), with the compile time this run spent. A
    truncated schedule's counts from bptt_loops up share one step (key ("shared", its room for
frozen loops)), which takes
    the frozen count as an argument (loop_schedule.shared_frozen_slots)."""

    def __init__(self, s: Setup, throughput: Throughput):
        self.s, self.throughput = s, throughput
        self.fns = s.compiled.setdefault("train", {})
        self.compile_time = 0.0
        self.max_frozen = shared_frozen_slots(s.config)
        self.lr_factors = _lr_factors(s.lr_factor, s.config.train.steps)

    def run(self, state, batch, step: int, n_loops: int):
        """Dispatches step `step`: (new state, its metrics on the device, its lr factor)."""
        lr_factor = self.lr_factors[step]
        k = self.s.config.train.bptt_loops
        shared = self.max_frozen and n_loops >= k
        # The shared step's shape depends on its room for frozen loops, which the schedule (a
        # host-only field, not in the step shape the cache is keyed by) sets.
        key, args = ((("shared", self.max_frozen), (np.int32(n_loops - k),)) if shared
                     else (n_loops, ()))
        if key not in self.fns:
            t0 = time.time()
            jitted = (jit_train_step(self.s, k, self.max_frozen) if shared
                      else jit_train_step(self.s, n_loops))
            self.fns[key] = jitted.lower(state, batch, lr_factor, *args).compile()
            self.compile_time += time.time() - t0
            self.throughput.restart()
        state, metrics = self.fns[key](state, batch, lr_factor, *args)
        return state, metrics, lr_factor


def _lr_factors(lr_factor, steps: int) -> np.ndarray:
    """The schedule's multiplier for every step, evaluated once (not one small dispatch a
    step), op by op as it always was. Over a whole multiple of _LR_BLOCK steps and cut: each
    op compiles once per array shape, so runs of other lengths in this process (a warm sweep
    worker's, a test process's) reuse the dozen or so small programs instead of compiling
    their own, about 0.5 s a run. Each step's factor is computed alone, so the padding
    changes no bit of it (checked for every schedule and cooldown at five lengths)."""
    padded = _LR_BLOCK * max(1, -(-steps // _LR_BLOCK))
    return np.asarray(jax.vmap(lr_factor)(jnp.arange(padded)), np.float32)[:steps]


_LR_BLOCK = 65_536  # steps: a few hundred kB of factors, evaluated in well under a millisecond


def _next_batch(s: Setup, data_iter, health: Health, step: int) -> tuple[dict, int]:
    """Step `step`'s global batch and loop count; its targets counted for the unigram entropy."""
    config = s.config
    local = next(data_iter)
    health.unigram.update(np.asarray(local["targets"]), np.asarray(local["mask"]))
    n_loops = _loops_for_step(config, step)
    if config.train.intermediate_supervision and "hop_labels" in local:
        local = {**local, **permutation.supervision_labels(local, n_loops,
                                                        config.model.n_unique)}
    return mesh_lib.global_batch(local, s.batch_sharding), n_loops


@dataclasses.dataclass(frozen=True)
class _Due:
    """What the step that brings the count to `after` needs besides running."""

    evaluate: bool
    save: bool
    wait: bool  # the host reads this step now, with its state: no step runs ahead of it

    @classmethod
    def at(cls, t: TrainConfig, after: int, state_metrics: StateMetrics, stop: _Stop) -> _Due:
        last = after == t.steps
        evaluate = bool(t.eval_every and after % t.eval_every == 0) and not last
        save = not last and bool((t.checkpoint_every and after % t.checkpoint_every == 0)
                                 or after in t.keep_steps)
        wait = state_metrics.due(after) or evaluate or save or last or stop.requested
        return cls(evaluate, save, wait)


def _summarise(summary: dict, status: RunStatus, reason: str | None, log: StepLog, final: dict,
               health: Health, compile_time: float, started: float) -> None:
    """summary.json's outcome: final and best losses, how far the run got, its time, the
    collapse and divergence rules' verdicts, and where and why it diverged if it did."""
    evals = [r["eval_loss"] for r in log.rows if "eval_loss" in r]
    train_rows = [r for r in log.rows if "loss" in r]
    entropy = health.entropy()
    summary.update(
        status=status,
        final_train_loss=train_rows[-1]["loss"] if train_rows else None,
        final_eval_loss=final.get("eval_loss"),
        final_eval_accuracy=final.get("eval_accuracy"),
        eval_loss_per_loop=final.get("eval_loss_per_loop"),
        best_eval_loss=min(evals) if evals else None,
        steps=train_rows[-1]["step"] if train_rows else log.start,
        tokens=train_rows[-1]["tokens"] if train_rows else 0,
        flops=train_rows[-1]["flops"] if train_rows else 0.0,
        wall_time_s=time.time() - started,
        compile_time_s=compile_time,
        unigram_entropy=entropy,
        collapsed=None if entropy is None else diagnostics.collapsed_run(train_rows, entropy),
        collapse_rule=diagnostics.COLLAPSE_RULE,
        divergence_rule=" ".join(diagnostics.DivergenceRule.__doc__.split()),
    )
    if status is RunStatus.DIVERGED:
        summary.update(diverged_step=log.done, diverged_reason=reason)


def _print_outcome(workdir: str, status: RunStatus, summary: dict) -> None:
    if jax.process_index() == 0:
        losses = ", ".join(f"{k} {summary[k]:.4f}" for k in ("final_train_loss", "final_eval_loss")
                           if summary[k] is not None)
        print(f"{workdir}: {status.value} at step {summary['steps']}; {losses}")


def _exit_code(status: RunStatus) -> ExitCode:
    return ExitCode.DIVERGED if status is RunStatus.DIVERGED else ExitCode.OK
