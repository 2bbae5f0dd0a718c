"""`loopscale train`: one run, on a mesh, resumable, leaving a complete run directory.

The flow: validate the workdir -> mesh -> sharded state (fresh or restored with the data
iterator) -> jitted step per loop count -> loop (log, evaluate, checkpoint, watch for
divergence and SIGTERM) -> final checkpoint and summary.json. Exit status: 0 completed (or
stopped cleanly by SIGTERM, to be resumed), 1 failed (a full disk, checkpoints that do not
restore: one line on stderr, status `failed`; run again to resume), 3 diverged.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import signal
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from loopscale import data as data_lib
from loopscale import flops as flops_lib
from loopscale.config import Config, DataSource
from loopscale.data import permutation
from loopscale.errors import UsageError
from loopscale.evaluate.lm import evaluate, jit_eval_step
from loopscale.model import LoopedLM
from loopscale.rundir.checkpoint import Checkpointer, CheckpointError, abstract_like, one_line
from loopscale.rundir.run import CHECKPOINTS, RunDirectory, branch_source
from loopscale.rundir.status import ExitCode, RunStatus
from loopscale.train import diagnostics
from loopscale.train import mesh as mesh_lib
from loopscale.train.optimizer import build_optimizer
from loopscale.train.peak import device_peak_flops
from loopscale.train.state_metrics import StateMetrics
from loopscale.train.step import TrainState, train_step

# Failures of the machine rather than of the code: a full disk, a lost filesystem, checkpoints
# that do not restore. They end the run with status `failed`, one line on stderr and
# ExitCode.FAILED; any other exception is a bug and keeps its traceback.
ENVIRONMENT_ERRORS = (OSError, CheckpointError)


class _Stop:
    """Set by SIGTERM: the loop saves a checkpoint at the end of the current step and exits."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame):
        self.requested = True


@dataclasses.dataclass
class _Setup:
    config: Config
    mesh: jax.sharding.Mesh
    model: LoopedLM
    tx: object
    lr_factor: object  # step -> lr_t / peak (optimizer.py: the schedule lives outside tx)
    state_shardings: object
    batch_sharding: object
    # The compiled functions of this step shape in this process: "init", "eval", and
    # "train" / "loop_grad" / "act_grad" by loop count (shared by every run of the shape;
    # _shared).
    compiled: dict


_MAX_SHAPES = 8
_SHARED: collections.OrderedDict = collections.OrderedDict()


def _shared(config: Config, mesh: jax.sharding.Mesh, build) -> tuple:
    """(model, tx, state shardings, compiled functions) of this run's step shape, built once
    per process: a warm sweep worker (sweep/worker.py) trains run after run, and runs of one
    shape at other budgets, schedules or branch points then reuse the model, the optimiser
    and every compiled function instead of tracing and compiling them again. The last
    _MAX_SHAPES shapes are kept. Keyed by the device objects, not their ids: two TPU
    topologies compiled for in one process number their devices alike."""
    key = (config.step_shape, tuple(mesh.devices.flat), tuple(mesh.shape.items()))
    if key not in _SHARED:
        _SHARED[key] = (*build(), {})
        while len(_SHARED) > _MAX_SHAPES:
            _SHARED.popitem(last=False)
    _SHARED.move_to_end(key)
    return _SHARED[key]


def _boxed_state_fn(model: LoopedLM, tx, seq_len: int):
    """rng -> TrainState whose params and optimiser state carry their logical axis names."""
    def init(rng):
        params = model.init(rng, jnp.zeros((1, seq_len), jnp.int32))["params"]
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
    return init


def setup(config: Config, devices=None) -> _Setup:
    mesh = mesh_lib.make_mesh(config.mesh, devices)
    dp = mesh_lib.data_parallel_size(mesh)
    if config.train.batch_size % (dp * config.train.grad_accum):
        raise UsageError(f"train.batch_size={config.train.batch_size} must be divisible by "
                         f"data-parallel size {dp} x train.grad_accum={config.train.grad_accum}")
    _, lr_factor = build_optimizer(config.train, config.model)

    def build():
        model = LoopedLM(config.model)
        tx, _ = build_optimizer(config.train, config.model)
        abstract = jax.eval_shape(_boxed_state_fn(model, tx, config.train.seq_len),
                                  jax.random.PRNGKey(0))
        shardings = mesh_lib.logical_shardings(abstract, mesh)
        mesh_lib.check_divisible(nn.unbox(abstract).params, shardings.params)
        return model, tx, shardings

    model, tx, shardings, compiled = _shared(config, mesh, build)
    return _Setup(config, mesh, model, tx, lr_factor, shardings, mesh_lib.batch_sharding(mesh),
                  compiled)


def init_state(s: _Setup):
    if "init" not in s.compiled:
        init = _boxed_state_fn(s.model, s.tx, s.config.train.seq_len)
        s.compiled["init"] = jax.jit(lambda rng: nn.unbox(init(rng)),
                                     out_shardings=s.state_shardings)
    return s.compiled["init"](jax.random.PRNGKey(s.config.seed))


def abstract_state(s: _Setup):
    """The train state's shapes, dtypes and shardings, allocating nothing."""
    return abstract_like(jax.eval_shape(lambda: init_state(s)), s.state_shardings)


def jit_train_step(s: _Setup, n_loops: int):
    """The train step as it runs: explicit shardings, the state donated (one per loop count)."""
    step = functools.partial(train_step, model=s.model, tx=s.tx, train=s.config.train,
                             n_loops=n_loops)
    return jax.jit(step, in_shardings=(s.state_shardings, s.batch_sharding,
                                       mesh_lib.replicated(s.mesh)),
                   out_shardings=(s.state_shardings, None), donate_argnums=0)


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A dispatched train step whose metrics the host has not read yet."""

    done: int  # the step count once it has run
    metrics: dict
    n_loops: int
    lr_factor: float
    dispatched: float  # time.time() when it was dispatched


def _loops_for_step(config: Config, step: int) -> int:
    choices = config.train.loop_choices
    if not choices:
        return config.model.n_loops
    return int(np.random.default_rng([config.seed, step]).choice(choices))


def _host_row(metrics: dict) -> dict:
    return {k: (float(v) if np.ndim(v) == 0 else np.asarray(v).tolist())
            for k, v in jax.device_get(metrics).items()}


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


def _run(s: _Setup, run: RunDirectory, workdir: str, started: float) -> int:
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


def _restore(s: _Setup, checkpointer: Checkpointer, train_ds, workdir: str):
    """(start step, state, data iterator, unigram counts or None if unknown): the newest
    checkpoint that restores (bad ones moved aside with a warning), or a fresh start."""
    def warn(line: str) -> None:
        if jax.process_index() == 0:
            print(f"loopscale train: warning: {workdir}: {line}", file=sys.stderr)

    data_iter = train_ds.iterator()
    restored = checkpointer.restore_latest(abstract_state(s), data_iter, warn)
    if restored:
        return restored.step, restored.state, data_iter, restored.unigram_counts
    # Nothing restored: a fresh iterator, since a failed restore may have set this one's state.
    data_iter = train_ds.iterator()
    t = s.config.train
    if t.branch_from:
        return _branch_start(s, workdir, data_iter)
    return 0, init_state(s), data_iter, np.zeros(0, np.int64)


def _branch_start(s: _Setup, workdir: str, data_iter):
    """A cooldown branch's first start: model, optimiser, data and unigram state from its
    trunk's checkpoint at the branch point (read-only: the trunk may still be training)."""
    t = s.config.train
    trunk = branch_source(workdir, t.branch_from)
    source = Checkpointer(trunk / CHECKPOINTS, keep=1, read_only=True)
    try:
        if t.branch_step not in source.manager.all_steps():
            raise UsageError(f"train.branch_from={t.branch_from}: {trunk} has no checkpoint at "
                             f"train.branch_step={t.branch_step}")
        state, counts = source.restore(t.branch_step, abstract_state(s), data_iter)
    finally:
        source.manager.close()
    return t.branch_step, state, data_iter, counts


def _loop(s: _Setup, run: RunDirectory, workdir: str, started: float, accounting: dict,
          train_ds, eval_ds, checkpointer: Checkpointer, summary: dict) -> int:
    config, t = s.config, s.config.train
    pi = jax.process_index()
    # MFU counts model FLOPs (6N per use + full attention matmuls), not recomputation or waste.
    model_flops_per_token = accounting["flops_per_token_by_convention"]["6n_attn"]
    start, state, data_iter, counts = _restore(s, checkpointer, train_ds, workdir)
    rows = run.open_metrics(start)

    stop = _Stop()
    previous_handler = signal.signal(signal.SIGTERM, stop)
    steps_fns = s.compiled.setdefault("train", {})
    state_metrics = StateMetrics(config, s.model, s.compiled)
    if "eval" not in s.compiled:
        s.compiled["eval"] = jit_eval_step(s.model, t, config.model.n_loops,
                                           param_shardings=s.state_shardings.params,
                                           batch_sharding=s.batch_sharding)
    eval_fn = s.compiled["eval"]
    answers = config.data.source is DataSource.PERMUTATION

    def held_out(params) -> dict:
        """The eval loss per exit; for the permutation task also the answers' accuracy."""
        out = evaluate(eval_fn, params, eval_ds, s.batch_sharding)
        if answers:
            out.update(state_metrics.answer_accuracy(params, eval_ds, s.batch_sharding))
        return out
    compile_time = 0.0
    tokens_per_step = t.batch_size * t.seq_len
    # The schedule's multiplier for every step, evaluated once (not one small dispatch a step).
    lr_factors = np.asarray(jax.vmap(s.lr_factor)(jnp.arange(t.steps)), np.float32)

    @functools.cache
    def train_flops_per_token(n_loops: int) -> float:
        model = dataclasses.replace(config.model, n_loops=n_loops)
        return flops_lib.flops_per_token(model, t.seq_len, config.flop_convention)

    # Training compute spent so far, recomputed from the steps (the loop count of each step is
    # a function of seed and step), so it does not depend on which rows were logged.
    flops_done = sum(train_flops_per_token(_loops_for_step(config, i)) for i in range(start)) \
        * tokens_per_step
    peak = t.peak_flops or device_peak_flops()
    vocab = max(config.model.vocab_size, train_ds.vocab_size)
    divergence = diagnostics.DivergenceRule(ceiling=diagnostics.DivergenceRule.ceiling_for(vocab))
    oscillation = diagnostics.GradientOscillation()
    unigram = diagnostics.UnigramEntropy(vocab)
    # Counts of the steps before `start` come from the checkpoint; a checkpoint written before
    # they were kept leaves the entropy unknown (None) rather than wrong.
    unigram_known = counts is not None and len(counts) in (0, vocab)
    if unigram_known and len(counts):
        unigram.counts[:] = counts
    for row in rows:  # replay host-side trackers over the kept history
        if "grad_norm" in row:
            oscillation.update(row["grad_norm"])
            divergence.check(diagnostics.watched_loss(row))
    status, reason, done = RunStatus.RUNNING, None, start
    run.write_summary(summary)

    progress = None
    if pi == 0 and sys.stderr.isatty():
        from tqdm import tqdm

        progress = tqdm(total=t.steps, initial=start, desc=config.name, unit="step")
    # The host runs one step ahead (as nanodo does): step t+1 is dispatched before step t's
    # metrics are read, so the host's work (the next batch, logging) overlaps the device's.
    # It waits for the step it dispatched wherever the state itself is needed (evaluation,
    # checkpoint, per-loop gradients, the last step) or SIGTERM asked to stop: there no step
    # runs ahead, so a checkpoint holds the data iterator exactly at its step.
    pending: _Pending | None = None
    last_read = time.time()

    def read(p: _Pending, extra: dict) -> str | None:
        """Waits for step p, logs its row; returns why the run diverged, if it did."""
        nonlocal flops_done, last_read, done
        row = _host_row(p.metrics)
        now = time.time()
        dt = now - max(p.dispatched, last_read)  # from when it could start to when it was read
        last_read, done = now, p.done
        flops_done += train_flops_per_token(p.n_loops) * tokens_per_step
        row.update(
            step=p.done, n_loops=p.n_loops, lr=t.lr * float(p.lr_factor),
            tokens=p.done * tokens_per_step, flops=flops_done,
            step_time_s=dt, tokens_per_s=tokens_per_step / dt,
            mfu=model_flops_per_token * tokens_per_step / dt / peak,
            **oscillation.update(row["grad_norm"]), **extra,
        )
        rows.append(row)
        if p.done % t.log_every == 0 or p.done == t.steps:
            run.log(row)
        if progress:
            progress.update(1)
            progress.set_postfix(loss=f"{row['loss']:.3f}")
        return divergence.check(diagnostics.watched_loss(row))

    try:
        for step in range(start, t.steps):
            local = next(data_iter)
            unigram.update(np.asarray(local["targets"]), np.asarray(local["mask"]))
            n_loops = _loops_for_step(config, step)
            if t.intermediate_supervision and "hop_labels" in local:
                local = {**local, **permutation.supervision_labels(local, n_loops,
                                                                config.model.n_unique)}
            batch = mesh_lib.global_batch(local, s.batch_sharding)
            lr_factor = lr_factors[step]
            if n_loops not in steps_fns:
                t0 = time.time()
                steps_fns[n_loops] = jit_train_step(s, n_loops).lower(state, batch, lr_factor).compile()
                compile_time += time.time() - t0
                last_read = time.time()
            state, metrics = steps_fns[n_loops](state, batch, lr_factor)
            if pending is not None:
                reason = read(pending, {})  # the previous step, while this one runs
                if reason:
                    status = RunStatus.DIVERGED
                    break
            pending = _Pending(step + 1, metrics, n_loops, lr_factor, time.time())
            after = step + 1
            evaluates = t.eval_every and after % t.eval_every == 0 and after != t.steps
            saves = after != t.steps and (
                (t.checkpoint_every and after % t.checkpoint_every == 0) or after in t.keep_steps)
            if not (state_metrics.due(after) or evaluates or saves or after == t.steps
                    or stop.requested):
                continue
            reason = read(pending, state_metrics.measure(state.params, batch, n_loops, after))
            pending = None
            if reason:
                status = RunStatus.DIVERGED
                break
            if evaluates:
                rows.append({"step": done, **held_out(state.params)})
                run.log(rows[-1])
            if saves:
                checkpointer.save(done, state, data_iter, unigram.counts)
            if stop.requested:
                break
        else:
            reason = divergence.check_end()  # a run too short for the patience rule
            status = RunStatus.DIVERGED if reason else RunStatus.COMPLETED
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        if progress:
            progress.close()

    final = {}
    if status is RunStatus.COMPLETED or (stop.requested and status is not RunStatus.DIVERGED):
        if checkpointer.latest_step() != done:
            checkpointer.save(done, state, data_iter, unigram.counts)
    if status is RunStatus.COMPLETED:
        # A finished run re-run (its summary.json lost) already holds its final evaluation.
        final = next((r for r in rows if r["step"] == t.steps and "eval_loss" in r), None)
        if final is None:
            final = {"step": t.steps, **held_out(state.params)}
            rows.append(final)
            run.log(final)
    checkpointer.close()
    run.close()

    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    train_rows = [r for r in rows if "loss" in r]
    entropy = unigram.value() if unigram_known else None
    summary.update(
        status=status,
        final_train_loss=train_rows[-1]["loss"] if train_rows else None,
        final_eval_loss=final.get("eval_loss"),
        final_eval_accuracy=final.get("eval_accuracy"),
        eval_loss_per_loop=final.get("eval_loss_per_loop"),
        best_eval_loss=min(evals) if evals else None,
        steps=train_rows[-1]["step"] if train_rows else start,
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
        summary.update(diverged_step=done, diverged_reason=reason)
    run.write_summary(summary)
    if pi == 0:
        losses = ", ".join(f"{k} {summary[k]:.4f}" for k in ("final_train_loss", "final_eval_loss")
                           if summary[k] is not None)
        print(f"{workdir}: {status.value} at step {summary['steps']}; {losses}")
    return _exit_code(status)


def _exit_code(status: RunStatus) -> ExitCode:
    return ExitCode.DIVERGED if status is RunStatus.DIVERGED else ExitCode.OK
