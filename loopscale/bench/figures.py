"""The figures of `loopscale bench`, one function each: what is divided by what, and how.

Every function takes the shared `Context` (the scale, and the compiled steps already built, so
a step used by two figures is compiled once) and returns a result.Figure. `FIGURES` lists them
in the order of the table, with their targets (issue 10 of the project's tracker).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from loopscale import checkout, flops
from loopscale.bench import fit_time, host, lean, steps, sweep_share, timing, torch_ref
from loopscale.bench.result import SKIPPED, Figure, Target, measured, not_measured, reported
from loopscale.bench.scale import Scale
from loopscale.bench.timing import Timing
from loopscale.config.presets import PAPER_LOG_EVERY
from loopscale.errors import UsageError


# The compiled steps built so far in this process, by (scale, experiment, overrides): kept
# across suite runs, so a step that two figures time, or two runs of the suite in one process
# (tests/test_bench.py runs its figures in two), is compiled once. A step is the same program
# on the same state whichever figure or run calls it (each call replaces its donated state);
# its compile_s is that of its one compile. Compile times that are figures themselves
# (compile_loops, steps.compile_seconds) never come from here: they compile fresh.
_STEPS: dict[tuple, steps.TrainStep] = {}


@dataclasses.dataclass
class Context:
    scale: Scale
    # The demo sweep slice, run by the first sweep row that asks (`subsweep`): its rows read
    # one run of it, which takes minutes; per Context, so each suite run measures it afresh.
    # A slice that failed is kept as its error, so the other rows report it, not rerun it.
    _subsweep: sweep_share.Subsweep | Exception | None = dataclasses.field(default=None,
                                                                            repr=False)

    def subsweep(self) -> sweep_share.Subsweep | None:
        """The scale's slice of the demo sweep, run once for this Context; None at a scale
        that runs no sweep."""
        s = self.scale
        if s.sweep is None:
            return None
        if self._subsweep is None:
            try:
                self._subsweep = sweep_share.measure(checkout.demo_sweep(), s.sweep,
                                                     s.sweep_concurrency)
            except Exception as e:
                self._subsweep = e
        if isinstance(self._subsweep, Exception):
            raise self._subsweep
        return self._subsweep

    def config(self, name: str, *overrides: str):
        return steps.load(name, [*self.scale.shape_overrides(), *overrides])

    def step(self, name: str, *overrides: str) -> steps.TrainStep:
        """The trainer's compiled step of experiments/NAME at this scale (built once a
        process, see `_STEPS`)."""
        key = (self.scale, name, overrides)
        if key not in _STEPS:
            _STEPS[key] = steps.TrainStep(self.config(name, *overrides))
        return _STEPS[key]

    def time(self, variants: dict[str, Callable[[], object]]) -> dict[str, Timing]:
        return timing.interleaved(variants, self.scale.reps, self.scale.warmup)

    def how(self) -> str:
        s = self.scale
        return (f"medians of {s.reps} interleaved steps after {s.warmup} warm-up; "
                f"{s.describe()}")


def _spec(name: str, *overrides: str) -> str:
    flags = " ".join(o.replace("--config.", "") for o in overrides)
    return f"{name}{' ' + flags if flags else ''}"


def _times(timings: dict[str, Timing], **compile_s: float) -> dict:
    out = {f"{name}_step": t.to_json() for name, t in timings.items()}
    out.update({f"{name}_compile_s": s for name, s in compile_s.items()})
    return out


def _fastest_ratio(timings: dict[str, Timing], num: str, den: str) -> float:
    """The ratio of the fastest samples: beside the medians' when other processes share the
    cores (a busy machine slows some samples by whole scheduler slices)."""
    return min(timings[num].samples) / min(timings[den].samples)


def _step_ratio(ctx: Context, key: str, title: str, target: Target, num: tuple, den: tuple,
                what: str, also: tuple = ()) -> Figure:
    """num step / den step, each (experiment, *overrides), timed side by side; `also`, a third
    step timed with them whose ratio to den the note reports beside the figure's."""
    steps_ = {"num": ctx.step(*num), "den": ctx.step(*den)}
    if also:
        steps_["also"] = ctx.step(*also)
    t = ctx.time(steps_)
    note = f"{what}: {_spec(*num)} / {_spec(*den)}; trainer.jit_train_step; {ctx.how()}"
    extra = {}
    if also:
        extra["ratio_also"] = timing.ratio(t, "also", "den")
        note += f"; measured beside them, {_spec(*also)} / den: {extra['ratio_also']:.2f}"
    return measured(key, title, target, timing.ratio(t, "num", "den"), note,
                    {**_times(t, **{k: v.compile_s for k, v in steps_.items()}),
                     "ratio_of_fastest": _fastest_ratio(t, "num", "den"), **extra})


# ---------------------------------------------------------------- the figures

def base_vs_lean(ctx: Context, key: str, title: str, target: Target) -> Figure:
    base = ctx.step("base.py:tiny", f"--config.model.n_unique={ctx.scale.layers}")
    ref = lean.LeanStep(base.config, steps.synthetic_batch(base.config))
    t = ctx.time({"base": base, "lean": ref})
    note = (f"{_spec('base.py:tiny', f'n_unique={ctx.scale.layers}')} (scanned, muP, the "
            "trainer's metrics) / loopscale/bench/lean.py (the same layers as a Python loop, "
            f"optax.adamw, loss only); {ctx.how()}")
    return measured(key, title, target, timing.ratio(t, "base", "lean"), note,
                    {**_times(t, base=base.compile_s, lean=ref.compile_s),
                     "ratio_of_fastest": _fastest_ratio(t, "base", "lean")})


# The loops of a looped model as a Python loop around the scan over its layers: no nested
# scan (model/transformer.py), the variant these CPU figures are also measured with.
LOOPS_IN_PYTHON = "--config.model.scan_loops=false"


def scan_vs_unrolled(ctx: Context, key: str, title: str, target: Target) -> Figure:
    looped = ("looped.py:tiny", f"--config.model.n_unique={ctx.scale.base_layers // 2}")
    return _step_ratio(ctx, key, title, target, looped,
                       (*looped, "--config.model.scan=false"),
                       "nested scans (loops, layers) / scan=false", also=(*looped, LOOPS_IN_PYTHON))


def compile_loops(ctx: Context, key: str, title: str, target: Target) -> Figure:
    few, many = ctx.scale.compile_loops
    configs = {k: ctx.config(f"flt.py:tiny,{k}") for k in (few, many)}
    t = timing.interleaved_samples(
        {f"loops_{k}": (lambda c=c: steps.compile_seconds(c)) for k, c in configs.items()},
        ctx.scale.compile_reps, warmup=min(1, ctx.scale.warmup))
    note = (f"lower + compile of a fresh jax.jit(trainer's step) on abstract inputs, "
            f"flt.py:tiny,{many} / flt.py:tiny,{few} (2 layers a loop, scanned), medians of "
            f"{ctx.scale.compile_reps} interleaved compiles after a warm-up of each, persistent "
            f"compilation cache off; {ctx.scale.describe()}")
    return measured(key, title, target, timing.ratio(t, f"loops_{many}", f"loops_{few}"), note,
                    {f"{name}_compile": v.to_json() for name, v in t.items()})


def looped_vs_base(ctx: Context, key: str, title: str, target: Target) -> Figure:
    n = ctx.scale.base_layers
    looped = ("looped.py:tiny", f"--config.model.n_unique={n // 2}")
    return _step_ratio(ctx, key, title, target, looped,
                       ("base.py:tiny", f"--config.model.n_unique={n}"),
                       f"same effective depth {n}, scanned (Base: one layer scan)",
                       also=(*looped, LOOPS_IN_PYTHON))


def flt_vs_lt(ctx: Context, key: str, title: str, target: Target) -> Figure:
    spec = f"flt.py:tiny,{ctx.scale.flt_loops}"
    return _step_ratio(ctx, key, title, target,
                       (spec, "--config.model.injection=flt"),
                       (spec, "--config.model.injection=none"), "injection flt / none")


def moe_vs_dense(ctx: Context, key: str, title: str, target: Target) -> Figure:
    depth = f"--config.model.n_unique={ctx.scale.layers}"
    dense = ctx.step("base.py:tiny", depth)
    moe = {d: ctx.step("moe.py:tiny", depth, f"--config.model.moe_dispatch={d}")
           for d in ("dropless", "capacity")}
    t = ctx.time({"dense": dense, **moe})
    ratios = {d: timing.ratio(t, d, "dense") for d in moe}
    best = min(ratios, key=ratios.get)
    cap = moe["capacity"].config.model.capacity_factor
    note = (f"the better of dropless {ratios['dropless']:.2f} and capacity {ratios['capacity']:.2f}"
            f" (factor {cap}): moe.py:tiny (top-2 of 8, expert width d_ff/2, so active FFN "
            f"FLOPs equal the dense FFN's) / base.py:tiny, {ctx.scale.layers} layers each; on a "
            f"CPU the dropless ragged_dot runs every expert densely; {ctx.how()}")
    return measured(key, title, target, ratios[best], note,
                    {**_times(t, dense=dense.compile_s, dropless=moe["dropless"].compile_s,
                              capacity=moe["capacity"].compile_s),
                     "ratio_dropless": ratios["dropless"], "ratio_capacity": ratios["capacity"],
                     "better": best})


def remat_memory(ctx: Context, key: str, title: str, target: Target) -> Figure:
    spec = f"flt.py:tiny,{ctx.scale.memory_loops}"
    mem = {r: steps.step_memory(ctx.config(spec, f"--config.model.remat={r}"))
           for r in ("loop", "none")}
    loop, none = mem["loop"], mem["none"]
    note = (f"XLA's buffer assignment of the compiled step (compiled.memory_analysis(): "
            f"arguments + outputs - aliased + temporaries + code), {spec} remat=loop / "
            f"remat=none: {loop['total'] / 1e6:.0f} MB / {none['total'] / 1e6:.0f} MB; "
            f"temporaries alone {loop['temporaries'] / none['temporaries']:.3f}; "
            f"{ctx.scale.describe()}")
    return measured(key, title, target, loop["total"] / none["total"], note,
                    {"remat_loop_bytes": loop, "remat_none_bytes": none})


def data_vs_step(ctx: Context, key: str, title: str, target: Target) -> Figure:
    from loopscale import data as data_lib

    step = ctx.step("base.py:tiny", f"--config.model.n_unique={ctx.scale.layers}")
    c = step.config
    it = data_lib.make_dataset(c.data, c.train, c.seed, "train").iterator()
    next(it)  # builds (or reads back) the packed corpus before the clock starts
    n = ctx.scale.data_batches

    def batches() -> float:
        return timing.stopwatch(lambda: [next(it) for _ in range(n)])() / n

    t = timing.interleaved_samples({"data": batches, "step": timing.stopwatch(step)},
                                   ctx.scale.reps, ctx.scale.warmup)
    tokens = step.tokens
    note = (f"next() of make_dataset({c.data.source.value}, {c.data.tokenizer}: the KJV text "
            f"packed) iterator, {n} batches a round, against the base.py:tiny step "
            f"({ctx.scale.layers} layers) on the same {c.train.batch_size} x "
            f"{c.train.seq_len} batch; {ctx.how()}")
    return measured(key, title, target, timing.ratio(t, "step", "data"), note,
                    {"data_batch": t["data"].to_json(), "train_step": t["step"].to_json(),
                     "data_tokens_per_s": tokens / t["data"].median,
                     "step_tokens_per_s": tokens / t["step"].median})


def _no_sweep(ctx: Context, key: str, title: str, target: Target, percent: bool) -> Figure:
    return not_measured(key, title, target, SKIPPED,
                        f"skipped: no sweep at the {ctx.scale.name} scale", percent=percent)


def _sweep_command(sub: sweep_share.Subsweep) -> str:
    return (f"`loopscale sweep --sweep={os.path.relpath(sub.sweep_file)} "
            f"{' '.join(sub.overrides)} --concurrency={sub.concurrency}` in a fresh directory "
            f"({sub.share['runs']} runs, {sub.share['steps']} steps, {sub.wall_s:.0f} s)")


def sweep_time_share(ctx: Context, key: str, title: str, target: Target) -> Figure:
    sub = ctx.subsweep()
    if sub is None:
        return _no_sweep(ctx, key, title, target, percent=True)
    figures = sub.share
    note = (f"{_sweep_command(sub)}: sum of the runs' step_time_s / (concurrency x wall "
            f"time); over the runs' own wall time {100 * figures['share_of_runs']:.0f}%; "
            f"compiles {100 * figures['compile_share_of_sweep']:.0f}% of the sweep")
    return measured(key, title, target, figures["share_of_sweep"], note, figures, percent=True)


def sweep_runs_share(ctx: Context, key: str, title: str, target: Target) -> Figure:
    sub = ctx.subsweep()
    if sub is None:
        return _no_sweep(ctx, key, title, target, percent=True)
    figures = sub.share
    note = (f"the same sweep as sweep_time_share, {_sweep_command(sub)}: sum of the runs' "
            f"step_time_s {figures['step_s']:.0f} s / sum of their summary.json wall_time_s "
            f"{figures['runs_wall_s']:.0f} s (leaves out worker start-up, JAX import and the "
            "runner; holds compiles, data set-up, evaluation and checkpoints)")
    return measured(key, title, target, figures["share_of_runs"], note, figures, percent=True)


def demo_vs_lean_flops(ctx: Context, key: str, title: str, target: Target) -> Figure:
    sub = ctx.subsweep()
    if sub is None:
        return _no_sweep(ctx, key, title, target, percent=False)
    demo, config = sub.flops, sub.median_config
    m, t = config.model, config.train
    # The lean step at the median run's own config (read back from its run directory), so
    # the shape is the demo's to the last field: layers, head size, d_ff, batch, sequence.
    ref = lean.LeanStep(config, steps.synthetic_batch(config))
    timed = ctx.time({"lean": ref})["lean"]
    tokens = t.batch_size * t.seq_len
    per_token = flops.flops_per_token(m, t.seq_len, config.flop_convention)
    computed = flops.computed_flops_per_token(m, t.seq_len)
    lean_rate = per_token * tokens / timed.median
    lean_computed = computed * tokens / timed.median
    ratio_computed = demo["computed_flops_per_s"] / lean_computed
    note = (f"{_sweep_command(sub)}: sum over runs of own steps x {t.batch_size} x "
            f"{t.seq_len} tokens x summary.json flops_per_token_train ({demo['flop_convention']}"
            f", embedding counted, attention matrices not) / sum of their step_time_s = "
            f"{demo['flops_per_s'] / 1e9:.2f} GFLOP/s, {sub.concurrency} runs at a time; / "
            f"loopscale/bench/lean.py at the median run's config (d_model {m.d_model}, "
            f"{m.n_heads} heads of {m.d_head}, d_ff {m.ffn_width}, {m.effective_depth} layers, "
            f"batch {t.batch_size} x {t.seq_len}, float32; {config.flop_convention.value} "
            f"{per_token:,.0f} FLOPs/token) timed alone, median of {len(timed.samples)} steps "
            f"after {ctx.scale.warmup} warm-up, {timed.median * 1e3:.2f} ms = "
            f"{lean_rate / 1e9:.2f} GFLOP/s; counting what the compiled steps execute "
            f"(flops.computed_flops_per_token: attention matrices in full) "
            f"{demo['computed_flops_per_s'] / 1e9:.2f} / {lean_computed / 1e9:.2f} GFLOP/s = "
            f"{ratio_computed:.2f}")
    return measured(key, title, target, demo["flops_per_s"] / lean_rate, note,
                    {"demo": {k: v for k, v in demo.items() if k != "per_run"},
                     "demo_runs": demo["per_run"], "lean_step": timed.to_json(),
                     "lean_compile_s": ref.compile_s, "lean_d_model": m.d_model,
                     "lean_flops_per_token": per_token,
                     "lean_computed_flops_per_token": computed,
                     "lean_flops_per_s": lean_rate, "lean_computed_flops_per_s": lean_computed,
                     "ratio_computed": ratio_computed, "concurrency": sub.concurrency})


def jax_vs_torch(ctx: Context, key: str, title: str, target: Target) -> Figure:
    if not torch_ref.available():
        return not_measured(key, title, target, SKIPPED,
                            "skipped: torch not installed (`pip install torch`, the CPU-only "
                            "build is enough)")
    spec = (f"flt.py:tiny,{ctx.scale.flt_loops}", "--config.model.injection=flt")
    jax_step = ctx.step(*spec)
    torch_step = torch_ref.make_step(jax_step.config)
    t = ctx.time({"jax": jax_step, "torch": torch_step})
    fastest = _fastest_ratio(t, "jax", "torch")
    note = (f"{_spec(*spec)} (trainer.jit_train_step) / loopscale/bench/torch_ref.py, a minimal "
            f"eager re-implementation of the FLT authors' model (their code is not vendored), "
            f"AdamW, {torch_ref.version()}; {ctx.how()}; fastest samples' ratio "
            f"{fastest:.2f}")
    return measured(key, title, target, timing.ratio(t, "jax", "torch"), note,
                    {**_times(t, jax=jax_step.compile_s), "ratio_of_fastest": fastest})


def fit_seconds(ctx: Context, key: str, title: str, target: Target) -> Figure:
    s = ctx.scale
    path = fit_time.chinchilla_csv()
    if path is None:
        return not_measured(key, title, target, SKIPPED,
                            "skipped: no data/reference/chinchilla_svg_extracted_data.csv in "
                            "the checkout (or $CHINCHILLA_CSV)")
    got = fit_time.time_fit(path, s.fit_grid, s.fit_bootstrap)
    fit, ci = got["fit"], got["interval_95"]
    note = (f"loopscale.scaling.parametric on the Chinchilla table ({got['runs']} runs, the five "
            f"highest losses dropped): {got['starts']} starts ({s.fit_grid} grid, "
            f"{got['converged']} converged) {got['grid_wall_s']:.1f} s, then {s.fit_bootstrap} "
            f"bootstrap refits {got['bootstrap_wall_s']:.1f} s, wall time; alpha "
            f"{fit['alpha']:.4f}, beta {fit['beta']:.4f}, E {fit['E']:.4f}"
            + (f" (95% alpha {ci['alpha'][0]:.3f}-{ci['alpha'][1]:.3f})" if ci.get("alpha") else ""))
    return measured(key, title, target, got["total_wall_s"], note, got)


def _paper_mfu(family: str, ctx: Context, key: str, title: str, target: Target) -> Figure:
    from loopscale.aot import compile as aot

    s = ctx.scale
    try:
        tpu = aot.tpu_target(s.mfu_topology)
    except UsageError as e:  # no TPU compiler here: libtpu is the `tpu` extra
        return not_measured(key, title, target, SKIPPED, f"skipped: {e}", percent=True)
    config = steps.load(f"{family}.py:{s.mfu_preset}")
    cost = aot.step_cost(config, tpu.devices)
    mfu = aot.est_mfu(config, tpu, cost["est_step_time_s"])
    if mfu is None:
        return not_measured(key, title, target, SKIPPED,
                            f"skipped: XLA gives no step time ({cost['cost_warning']})", percent=True)
    m = config.model
    note = (f"`loopscale compile --config=experiments/{family}.py:{s.mfu_preset} "
            f"--topology={s.mfu_topology}`'s est_mfu: model FLOPs (6N per token, attention in "
            f"full) / chips / XLA's estimated step time {cost['est_step_time_s']:.3g} s / peak; "
            f"d_model {m.d_model}, {m.n_unique} layers x {m.n_loops} loops, batch "
            f"{config.train.batch_size} x {config.train.seq_len}, {m.dtype.value}; XLA's cost "
            "model is optimistic (no input pipeline, ideal overlap)")
    return measured(key, title, target, mfu, note,
                    {**cost, "model_flops_per_step": aot.model_flops(config),
                     "chips": len(tpu.devices)}, percent=True)


def host_overhead(ctx: Context, key: str, title: str, target: Target) -> Figure:
    """At the accelerator presets' log_every (the figure), and at the CPU presets' 1 beside."""
    n = ctx.scale.host_steps
    got = {every: host.measure(n, ctx.scale.reps, ctx.scale.warmup, every)
           for every in (PAPER_LOG_EVERY, 1)}

    def how(every: int) -> str:
        g = got[every]
        walls, cpus = g["wall_s"], g["cpu_s"]
        return (f"log_every {every}: the loop thread's CPU time ({cpus[3 * n]:.2f} s for "
                f"{3 * n} steps - {cpus[n]:.2f} s for {n}, each the least of {host.PAIRS} "
                f"runs) / {2 * n} = {g['host_ms']:.2f} ms a "
                f"step; wall ({walls[3 * n]:.2f} s - {walls[n]:.2f} s) / {2 * n} = "
                f"{g['per_step_ms']:.2f} ms a step, less the compiled step alone "
                f"({1e3 * g['device_step']['median_s']:.2f} ms, the median of "
                f"{g['device_step']['samples']} calls after a warm-up) = {g['wall_ms']:.2f} ms")

    note = (f"loopscale train's loop on base.py:tiny at d_model 8, 1 layer, 1 x 8 tokens; "
            f"{how(PAPER_LOG_EVERY)} (the figure: the accelerator presets' interval); "
            f"{how(1)} (the CPU presets'); on this CPU XLA's threads share the cores with the "
            "loop, so the wall figures hold their contention too")
    return measured(key, title, target, got[PAPER_LOG_EVERY]["host_ms"], note,
                    {f"log_every_{every}": {**g, "wall_s": {str(k): v
                                                            for k, v in g["wall_s"].items()},
                                            "cpu_s": {str(k): v for k, v in g["cpu_s"].items()}}
                     for every, g in got.items()})


def mfu_base(ctx: Context, key: str, title: str, target: Target) -> Figure:
    return _paper_mfu("base", ctx, key, title, target)


def mfu_looped(ctx: Context, key: str, title: str, target: Target) -> Figure:
    return _paper_mfu("looped", ctx, key, title, target)


@dataclasses.dataclass(frozen=True)
class Spec:
    key: str
    title: Callable[[Scale], str]
    target: Target
    measure: Callable[[Context, str, str, Target], Figure]
    percent: bool = False
    unit: str = ""


def _grid(name: str):
    from loopscale.scaling.parametric import grid_starts

    return grid_starts(name)


def at_most(value: float, text: str | None = None) -> Target:
    return Target("<=", value, text or f"<= {value:.2f}")


FIGURES = (
    Spec("base_vs_lean", lambda s: "Base train step / lean plain-JAX step of the same shape",
         at_most(1.0), base_vs_lean),
    Spec("scan_vs_unrolled",
         lambda s: f"looped step ({s.base_layers // 2}x2), scanned / unrolled",
         at_most(1.05), scan_vs_unrolled),
    Spec("compile_loops",
         lambda s: f"compile time of the train step, {s.compile_loops[1]} loops / "
                   f"{s.compile_loops[0]} loops (scanned)",
         at_most(1.3), compile_loops),
    Spec("looped_vs_base",
         lambda s: f"Looped {s.base_layers // 2}x2 / Base {s.base_layers} step",
         at_most(1.05), looped_vs_base),
    Spec("flt_vs_lt", lambda s: "FLT / original LT step (injection flt / none)",
         at_most(1.05), flt_vs_lt),
    Spec("moe_vs_dense",
         lambda s: "MoE top-2 of 8 / dense step at equal active FLOPs (better of dropless, "
                   "capacity)",
         at_most(1.3), moe_vs_dense),
    Spec("remat_memory",
         lambda s: f"peak memory at {s.memory_loops} loops, loop remat / none",
         at_most(1 / 3, "<= 1/3"), remat_memory),
    Spec("data_vs_step", lambda s: "data pipeline tokens/s / train-step tokens/s, same batch",
         Target(">=", 10.0, ">= 10"), data_vs_step),
    Spec("sweep_time_share", lambda s: "share of a sweep's wall time spent in train steps",
         Target(">=", 0.70, ">= 70%"), sweep_time_share, percent=True),
    Spec("sweep_runs_share", lambda s: "train steps / the same sweep's runs' own wall time",
         Target(">=", 0.70, ">= 70%"), sweep_runs_share, percent=True),
    Spec("demo_vs_lean_flops",
         lambda s: "demo train-step FLOP/s (its runs summed) / lean step FLOP/s at the demo's "
                   "median width",
         Target(">=", 0.5, ">= 0.50"), demo_vs_lean_flops),
    Spec("jax_vs_torch",
         lambda s: "looped JAX step / FLT authors' PyTorch eager step of the same model",
         at_most(1.5, "reported; stretch <= 1.5"), jax_vs_torch),
    Spec("fit_seconds",
         lambda s: f"approach-3 fit, {len(_grid(s.fit_grid))} starts + {s.fit_bootstrap:,} "
                   "bootstraps, Chinchilla table (seconds)",
         reported(), fit_seconds, unit=" s"),
    Spec("host_overhead",
         lambda s: "the trainer loop's own CPU time a step on the host, trivial model "
                   "(milliseconds)",
         at_most(1.0, "<= 1 ms"), host_overhead, unit=" ms"),
    Spec("mfu_base", lambda s: f"estimated MFU, Base {s.mfu_preset} run on {s.mfu_topology}",
         reported(), mfu_base, percent=True),
    Spec("mfu_looped", lambda s: f"estimated MFU, Looped {s.mfu_preset} run on {s.mfu_topology}",
         reported(), mfu_looped, percent=True),
)
