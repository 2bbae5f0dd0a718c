"""How many chips each planned run needs on a TPU slice, and how long its steps take there,
read from its real train step compiled for the slice's generation (loopscale/aot: libtpu's
compiler on this machine, no TPU needed).

Runs that differ only in schedule, LR, seed or data share one compiled step (shape_key), so
each distinct shape is compiled once per call: on 1, 2, 4, ... chips with the run's own mesh
config (-1 fills the chips), smallest first, until the step fits in HBM; a step that one host's
chips cannot hold is first tried there in 2, 4, ... micro-batches (fit_shape), and its runs are
planned so (with_overrides). A chip count over
which the batch or a sharded parameter cannot be split does not count (the trainer would refuse
it too). The step time on that count, and on the whole slice (where runs too big for one host
go, and what one-run-at-a-time would use), is XLA's cost-model estimate (aot.step_cost), an
optimistic one: it has no input pipeline, host overhead or imperfect overlap. Where it gives
no time (libtpu's cost model comes out negative for programs with sort or top_k custom
calls, which the model avoids, and for multi-slice programs), or one at or below zero, the runs of that shape are timed from the plan's analytic device hours
(--peak-flops x --mfu) spread over their chips instead, and a note says so. A tiny shape
compiles in seconds, a paper-size one in minutes, and every call compiles again (with
JAX_COMPILATION_CACHE_DIR set, a second compile of a paper-size step took as long here) unless
the caller keeps the compiled figures (aot/kept.py, `--compile-cache`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence

from loopscale.config import Config
from loopscale.errors import UsageError
from loopscale.sweep.packing import Need, Slice
from loopscale.files import to_json
from loopscale.sweep.plan import config_hash, merge, overrides_text, resolve
from loopscale.sweep.plan_table import Plan, PlannedRun
from loopscale.sweep.schema import Overrides

def shape_key(config: Config) -> str:
    """Equal for configs whose train steps compile to programs of the same memory and cost:
    Config.step_shape, less the LR (a constant inside the program, of no weight in either)."""
    shape = dataclasses.replace(config, train=dataclasses.replace(config.train, lr=0.0))
    text = json.dumps(to_json(shape.step_shape), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class ShapeFit:
    chips: int | None  # the smallest power of two the step fits on; None: not even the slice
    step_time_s: float | None  # XLA's estimate on `chips` chips, as it comes
    slice_step_time_s: float | None  # XLA's estimate on the whole slice, as it comes
    slice_splits: bool = True  # whether the batch (and parameters) split over the whole slice
    why: str = ""  # why it fits nowhere
    # Micro-batches a step where more than the run's own fit it on one host (step_time_s is
    # then the accumulating step's); `unpacked`, the fit at the run's own (more hosts).
    grad_accum: int | None = None
    unpacked: ShapeFit | None = None


def fit_shape(config: Config, slc: Slice) -> ShapeFit:
    """The fewest chips `config`'s step fits on. A step too big for one host's chips first
    tries 2, 4, ... times the micro-batches a step on one host (the same batch in
    smaller pieces: less activation memory, the same parameters) before taking more hosts:
    packed runs keep every host busy, and a run over several hosts leaves the others idle or
    waits for a whole slice (packing.py)."""
    from loopscale.aot import compile as aot

    host = min(slc.chips_per_host, slc.chips)
    n, why = _fewest_chips(aot, config, slc, 1, host)
    if n is not None:
        return _timed(aot, config, slc, n)
    accumulating = _accumulating(aot, config, aot.tpu_target(slc.topology_name(host)))
    n, more_why = _fewest_chips(aot, config, slc, 2 * host, slc.chips)
    unpacked = (_timed(aot, config, slc, n) if n is not None
                else ShapeFit(None, None, None, False, more_why or why))
    if accumulating is None:
        return unpacked
    packed = _timed(aot, accumulating, slc, host,
                    whole=None if unpacked.chips is None else unpacked)
    return dataclasses.replace(packed, grad_accum=accumulating.train.grad_accum,
                               unpacked=unpacked)


def _fewest_chips(aot, config: Config, slc: Slice, least: int, most: int):
    """(the fewest of least, 2 least, ... most chips the step fits on or None, why not)."""
    why, n = "", least
    while n <= most:
        fits, why = _fits(aot, config, aot.tpu_target(slc.topology_name(n)))
        if fits:
            return n, ""
        n *= 2
    return None, why


def _accumulating(aot, config: Config, target) -> Config | None:
    """`config` with the fewest micro-batches (2, 4, ... times its own) whose step fits on
    `target`, or None (the batch splits no further)."""
    accum = 2 * config.train.grad_accum
    while config.train.batch_size % accum == 0:
        trial = dataclasses.replace(config,
                                    train=dataclasses.replace(config.train, grad_accum=accum))
        if _fits(aot, trial, target)[0]:
            return trial
        accum *= 2
    return None


def _timed(aot, config: Config, slc: Slice, n: int, whole: ShapeFit | None = None) -> ShapeFit:
    """`config` on `n` chips with XLA's step times there and on the whole slice (`whole`'s
    slice time where given: a packed run's, timed as it would run alone on the slice)."""
    step = aot.step_cost(config, aot.tpu_target(slc.topology_name(n)).devices)["est_step_time_s"]
    if whole is not None:
        return ShapeFit(n, step, whole.slice_step_time_s, whole.slice_splits)
    if n == slc.chips:
        return ShapeFit(n, step, step)
    try:
        cost = aot.step_cost(config, aot.tpu_target(slc.topology_name(slc.chips)).devices)
    except UsageError:  # e.g. a batch of 256 over 512 chips
        return ShapeFit(n, step, None, slice_splits=False)
    return ShapeFit(n, step, cost["est_step_time_s"])


def _fits(aot, config: Config, target) -> tuple[bool, str]:
    import jax

    try:
        out = aot.report(config, target, "train", cost=False)
    except UsageError as e:  # the batch or a parameter cannot be split over these chips
        return False, str(e)
    except jax.errors.JaxRuntimeError as e:
        # libtpu's compiler refuses a program whose buffers exceed HBM outright.
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return False, str(e).strip().splitlines()[0]
    if out["fits"]:
        return True, ""
    return False, (f"needs {out['memory_per_chip']['total'] / 1e9:.1f} GB per chip on "
                   f"{out['chips']} chips")


@dataclasses.dataclass(frozen=True)
class Sized:
    plan: Plan  # rows with chips, est_step_time_s and est_device_hours from the compiles
    slice: Slice
    needs: tuple[Need, ...]  # in plan order
    shapes: int  # distinct shapes compiled
    # Where a shape was given micro-batches to fit one host: every run's needs at its own
    # accumulation instead (what sizing gave before it packed), in plan order; else None.
    unpacked: tuple[Need, ...] | None = None


def size_plan(plan: Plan, slc: Slice, log: Callable[[str], None] = lambda _: None) -> Sized:
    """Every run's chips and step time on `slc`, one compile search per distinct shape
    (fit_shape). A run whose shape fits one host only in micro-batches is planned with them
    (train.grad_accum, so a new run id; its branches follow it: with_overrides)."""
    keys = [shape_key(run.config) for run in plan.runs]
    fits: dict[str, ShapeFit] = {}
    notes = list(plan.notes)
    distinct = list(dict.fromkeys(keys))
    for i, key in enumerate(distinct):
        run = plan.runs[keys.index(key)]
        what = f"{run.family} d_model={run.config.model.d_model}"
        t0 = time.perf_counter()
        fit = fits[key] = fit_shape(run.config, slc)
        if fit.chips is None:
            notes.append(f"{what} does not fit on {slc.name}: {fit.why}")
        elif not _xla_times_usable(fit):
            notes.append(f"{what}: XLA's step time estimate is {_seconds(fit.step_time_s)} on "
                         f"{fit.chips} chip(s) and {_seconds(fit.slice_step_time_s)} on "
                         f"{slc.chips}; its runs are timed analytically instead "
                         "(--peak-flops x --mfu)")
        if fit.unpacked is not None:
            notes.append(_packed_note(what, run.config, fit))
        log(f"shape {i + 1}/{len(distinct)} ({what}, {keys.count(key)} run(s)): "
            + (f"{fit.chips} chip(s)" + (f" in {fit.grad_accum} micro-batches" if
                                         fit.grad_accum else "")
               + f", XLA's step time {_seconds(fit.step_time_s)}" if fit.chips
               else "does not fit")
            + f" ({time.perf_counter() - t0:.0f} s to compile)")
    runs = with_overrides(plan.runs, {
        run.run_id: (("train.grad_accum", fits[key].grad_accum),)
        for run, key in zip(plan.runs, keys) if fits[key].grad_accum})
    rows, needs = [], []
    for run, key in zip(runs, keys):
        fit = fits[key]
        step, whole = _step_times(run, fit, slc)
        row = {**run.row, "chips": fit.chips, "est_step_time_s": step}
        if step is not None:
            row["est_device_hours"] = fit.chips * run.config.train.steps * step / 3600
        rows.append(dataclasses.replace(run, row=row))
        needs.append(_need(run, fit.chips, step, whole))
    unpacked = None
    if any(fits[key].unpacked for key in keys):
        unpacked = tuple(_need(run, f.chips, *_step_times(run, f, slc)) for run, f in
                         zip(plan.runs, (fits[key].unpacked or fits[key] for key in keys)))
    return Sized(Plan(plan.sweep, tuple(rows), tuple(notes)), slc, tuple(needs),
                 len(distinct), unpacked)


def _need(run: PlannedRun, chips: int | None, step: float | None,
          whole: float | None) -> Need:
    steps = run.config.train.steps
    return Need(run.run_id, chips, None if step is None else steps * step,
                None if whole is None else steps * whole)


def _packed_note(what: str, config: Config, fit: ShapeFit) -> str:
    own, micro = config.train.grad_accum, config.train.batch_size // fit.grad_accum
    elsewhere = (f"{fit.unpacked.chips} chips" if fit.unpacked.chips
                 else "more chips than the slice has")
    return (f"{what} fits one host ({fit.chips} chips) in {fit.grad_accum} micro-batches of "
            f"{micro} sequences a step (train.grad_accum={fit.grad_accum}; its own {own} "
            f"needs {elsewhere}): its runs are planned so, under new run ids")


def _seconds(t: float | None) -> str:
    return "none" if t is None else f"{t:.3g} s"


def _xla_times_usable(fit: ShapeFit) -> bool:
    # None where the backend's cost model has no time; a time at or below zero where the
    # extrapolation from shallow compiles (aot.step_cost) went wrong.
    times = [fit.step_time_s] + ([fit.slice_step_time_s] if fit.slice_splits else [])
    return all(t is not None and t > 0 for t in times)


def _step_times(run: PlannedRun, fit: ShapeFit, slc: Slice) -> tuple[float | None, float | None]:
    """Step time on the run's chips and on the whole slice (None: it cannot run there): XLA's,
    or where XLA's is unusable, the plan's analytic device time spread over the chips."""
    if fit.chips is None:
        return None, None
    if _xla_times_usable(fit):
        return fit.step_time_s, fit.slice_step_time_s if fit.slice_splits else None
    device_s = run.row["est_device_hours"] * 3600 / run.config.train.steps
    return device_s / fit.chips, device_s / slc.chips if fit.slice_splits else None


def with_overrides(runs: Sequence[PlannedRun],
                   extra: dict[str, Overrides]) -> tuple[PlannedRun, ...]:
    """The runs with `extra` (run id -> overrides) merged into theirs, each changed run
    resolved again under its new id (every field is hashed), and a branch of a changed trunk
    pointed at the trunk's new id (trunks come before their branches in a plan). What sizing
    uses to give a run the micro-batches that fit it on one host (size_plan)."""
    renamed: dict[str, str] = {}
    out = []
    for run in runs:
        more = list(extra.get(run.run_id, ()))
        trunk = run.config.train.branch_from
        if trunk in renamed:
            more.append(("train.branch_from", renamed[trunk]))
        if not more:
            out.append(run)
            continue
        overrides = merge(run.overrides, more)
        config = resolve(run.experiment, overrides)
        run_id = renamed[run.run_id] = config_hash(config)
        row = {**run.row, "run_id": run_id, "branch_of": config.train.branch_from or None,
               "overrides": overrides_text(overrides)}
        out.append(dataclasses.replace(run, run_id=run_id, overrides=overrides, config=config,
                                       row=row))
    return tuple(out)
