"""The IsoFLOP planner: a validated Sweep -> the list of runs that spend its budgets.

Per family, every shape of the shape rule is resolved into a full experiment config (the same
`load_config` + `parse` path `loopscale train` takes, so the planned run is exactly the trained
one). For a budget C, a shape with training FLOPs per token f (the config's flop_convention:
loop-aware, MoE-active, flops.flops_per_token; a drawn loop count at its mean:
train/loop_schedule.planned_flops_per_token) trains tokens = C / f, i.e.
steps = round(C / (f * batch_size * seq_len)), and spends flops = steps * batch_size *
seq_len * f, which is within budget_tolerance of C (rounding to whole steps is the only loss).
Shapes needing fewer than min_steps (or more than max_steps) steps cannot meet the budget and
are left out. Of the rest, `shape.sizes` consecutive shapes are kept, centred on the one whose
tokens per parameter is closest to `shape.tokens_per_param` (the expected optimum), so each
IsoFLOP curve can have an interior minimum; a budget that no shape can meet is a UsageError.

Every planned run is an experiment file plus a list of `--config.a.b=v` overrides; its run_id is
a hash of the resolved config (config_hash), so the same sweep plans the same ids anywhere.
est_device_hours is analytic here (FLOPs over peak x MFU); for a TPU slice, sizing.py replaces
it with the compiled step's estimate and fills the `chips` and `est_step_time_s` columns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from loopscale import flops as flops_lib
from loopscale.config import Config, FFNKind, FlopConvention, Schedule, load_config, parse
from loopscale.errors import UsageError
from loopscale.files import to_json
from loopscale.sweep.plan_table import Plan, PlannedRun, Role, format_value
from loopscale.sweep.schema import Family, Overrides, ShapeKind, Sweep
from loopscale.train.loop_schedule import planned_flops_per_token
from loopscale.train.schedules import stable_end

# Fields added after sweeps were first planned, with the value that leaves a model as it was
# before them: at that value a field is left out of the hash, so a sweep planned before it
# existed keeps its run ids (and its finished runs) after an upgrade.
HASH_NEUTRAL = {("model", "n_prelude"): 0, ("model", "n_coda"): 0,
                ("model", "vocab_multiple"): 1, ("model", "loop_modulation"): "none",
                ("model", "attention"): "auto", ("model", "moe_matmul"): "auto",
                ("mesh", "zero1"): False,
                ("train", "loop_dist"): "fixed", ("train", "loop_mean"): 4.0,
                ("train", "loop_sigma"): 0.5, ("train", "loop_max"): 0,
                ("train", "bptt_loops"): 0,
                ("train", "grad_reduction"): "once"}


def config_hash(config: Config) -> str:
    """12 hex digits of the SHA-256 of the resolved config's canonical JSON. Every field is
    hashed: anything that could change the run changes its id (data paths and cache included,
    since `loopscale train` refuses a workdir whose config.json differs in any field), except
    the HASH_NEUTRAL fields at their neutral values."""
    tree = to_json(config)
    for (section, name), neutral in HASH_NEUTRAL.items():
        if tree[section][name] == neutral:
            del tree[section][name]
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def resolve(experiment: str, overrides: Overrides) -> Config:
    return parse(load_config(experiment, [f"--config.{k}={format_value(v)}" for k, v in overrides]))


def merge(*sources: Iterable[tuple[str, Any]]) -> Overrides:
    # Later sources win, and each field appears once, so the command line is unambiguous.
    merged: dict[str, Any] = {}
    for source in sources:
        for key, value in source:
            merged.pop(key, None)
            merged[key] = value
    return tuple(merged.items())


def _shape_sets(sweep: Sweep, family: Family, base: Config) -> list[Overrides]:
    rule = sweep.shape
    if rule.kind is ShapeKind.FAMILY:
        return [()]
    if rule.kind is ShapeKind.SHAPES:
        return list(rule.shapes)
    if rule.ffn_ratio and base.model.ffn is FFNKind.MOE and base.model.expert_d_ff:
        # A fixed expert width would not follow the ratio; d_ff // top_k does.
        raise UsageError(f"shape.ffn_ratio: family {family.name} fixes model.expert_d_ff="
                         f"{base.model.expert_d_ff}; set it to 0 (d_ff // top_k)")
    sets = []
    for d in rule.widths:
        if rule.n_heads:  # fixed head count: the head size grows with the width
            if d % rule.n_heads:
                raise UsageError(f"shape.widths: {d} is not a multiple of shape.n_heads="
                                 f"{rule.n_heads}")
            fields = [("model.d_model", d), ("model.n_heads", rule.n_heads),
                      ("model.head_dim", 0)]
        else:
            head = rule.head_dim or base.model.d_head  # fixed head size: heads grow with width
            if d % head:
                raise UsageError(f"shape.widths: {d} is not a multiple of the head size {head} "
                                 f"(family {family.name})")
            fields = [("model.d_model", d), ("model.n_heads", d // head)]
            if base.model.head_dim or rule.head_dim:
                fields.append(("model.head_dim", head))
        if rule.ffn_ratio:
            fields.append(("model.d_ff", max(1, round(rule.ffn_ratio * d))))
        sets.append(tuple(fields))
    return sets


def _fixed(sweep: Sweep, family: Family, extra_overrides: Overrides = ()) -> Overrides:
    """Overrides every run of the family shares, before shape, grid, lr and seed (which the
    planner sets, so they win over anything given here)."""
    extra = [("name", family.name)]
    if sweep.flop_convention is not None:
        extra.append(("flop_convention", sweep.flop_convention.value))
    if sweep.batch_size:
        extra.append(("train.batch_size", sweep.batch_size))
    if sweep.seq_len:
        extra.append(("train.seq_len", sweep.seq_len))
    return merge(sweep.overrides, family.overrides, extra, extra_overrides)


def _schedule(sweep: Sweep, steps: int) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = [("train.steps", steps)]
    if sweep.warmup_frac >= 0:
        out.append(("train.warmup_steps", int(round(sweep.warmup_frac * steps))))
    if sweep.evals:
        out.append(("train.eval_every", max(1, steps // sweep.evals)))
    if sweep.checkpoints:
        out.append(("train.checkpoint_every", max(1, steps // sweep.checkpoints)))
    return out


@dataclasses.dataclass(frozen=True)
class _Shape:
    """One shape of one family at one grid point, resolved, with its accounting."""

    overrides: Overrides
    config: Config
    counts: dict
    params: int  # the count of shape.params
    fpt: float  # training FLOPs per token (the config's convention)

    @property
    def tokens_per_step(self) -> int:
        return self.config.train.batch_size * self.config.train.seq_len


def _resolve_shape(experiment: str, overrides: Overrides, params_key: str) -> _Shape:
    config = resolve(experiment, overrides)
    counts = flops_lib.param_counts(config.model)
    fpt = planned_flops_per_token(config)
    return _Shape(overrides, config, counts, counts[params_key], fpt)


def _budget_steps(sweep: Sweep, shape: _Shape, budget: float) -> tuple[int | None, str]:
    """Steps that spend `budget` with this shape, or None and why it cannot."""
    exact = budget / (shape.fpt * shape.tokens_per_step)
    steps = max(1, int(round(exact)))
    what = _describe(shape)
    if steps < max(1, sweep.min_steps):
        return None, f"{what} would train {exact:.1f} steps (< min_steps={sweep.min_steps})"
    if sweep.max_steps and steps > sweep.max_steps:
        return None, f"{what} would train {exact:.0f} steps (> max_steps={sweep.max_steps})"
    spent = steps * shape.tokens_per_step * shape.fpt
    if abs(spent / budget - 1) > sweep.budget_tolerance:
        return None, (f"{what} spends {spent:.3g} in whole steps, more than "
                      f"{sweep.budget_tolerance:.0%} from the budget")
    return steps, ""


def _describe(shape: _Shape) -> str:
    m = shape.config.model
    return f"d_model={m.d_model} {m.n_unique}x{m.n_loops} ({shape.params:,} params)"


def _around_optimum(sweep: Sweep, fits: list[tuple[_Shape, int]]) -> tuple[list, str]:
    """`shape.sizes` consecutive shapes (by params) centred on the expected optimum."""
    fits = sorted(fits, key=lambda f: f[0].params)
    target = math.log(sweep.shape.tokens_per_param)
    ratios = [math.log(steps * s.tokens_per_step / s.params) for s, steps in fits]
    centre = min(range(len(fits)), key=lambda i: abs(ratios[i] - target))
    note = ""
    # Tokens per parameter fall as shapes grow: is the target beyond an end, by over 2x?
    beyond = math.log(2.0)
    if ratios[-1] > target + beyond or ratios[0] < target - beyond:
        side = "larger" if ratios[-1] > target + beyond else "smaller"
        note = (f"the expected optimum ({sweep.shape.tokens_per_param:g} tokens/param) needs "
                f"shapes {side} than the ladder holds; the minimum may sit at its edge")
    n = sweep.shape.sizes or len(fits)
    if len(fits) <= n:
        return fits, note
    lo = min(max(0, centre - n // 2), len(fits) - n)
    return fits[lo:lo + n], note


def plan_row(config: Config, family: str, budget: float | None, params_key: str,
             grid: Sequence[tuple[str, Any]] = (), experiment: str = "",
             overrides: Overrides = (), peak: float | None = None,
             mfu: float | None = None, role: Role = Role.RUN) -> dict:
    """The plan table's row of a resolved config (collect rebuilds it for bare run dirs).
    `tokens` and `flops` are the run's point on the IsoFLOP grid (a branch's include its
    trunk's steps), `flops_6n_attn` the same point under the 6n_attn convention; `flops_spent`
    and `est_device_hours` what the run itself computes."""
    m, t = config.model, config.train
    counts = flops_lib.param_counts(m)
    fpt = planned_flops_per_token(config)
    tokens = t.steps * t.batch_size * t.seq_len
    own_tokens = (t.steps - t.branch_step if t.branch_from else t.steps) * t.batch_size * t.seq_len
    spent = tokens * fpt
    hours = None
    if peak and mfu:
        # Device time from what the compiled step executes (grouped MoE matmuls, as on GPU/TPU),
        # the same numerator the trainer's MFU uses.
        computed = flops_lib.computed_flops_per_token(m, t.seq_len, ragged_dot_dense=False)
        hours = own_tokens * computed / (peak * mfu) / 3600.0
    return {
        "run_id": config_hash(config), "family": family, "budget": budget,
        "d_model": m.d_model, "n_heads": m.n_heads, "n_unique": m.n_unique, "n_loops": m.n_loops,
        "effective_depth": m.effective_depth, "ffn": m.ffn.value,
        **{field: format_value(value) for field, value in grid},
        "params": counts[params_key],
        **{k: counts[k] for k in ("params_unique", "params_effective", "params_active",
                                  "params_embedding", "params_once", "params_rec",
                                  "params_rec_active")},
        "flop_convention": config.flop_convention.value, "flops_per_token": fpt,
        "tokens": tokens, "steps": t.steps, "batch_size": t.batch_size, "seq_len": t.seq_len,
        "lr": t.lr, "seed": config.seed, "flops": spent,
        "flops_6n_attn": tokens * planned_flops_per_token(config, FlopConvention.ATTENTION),
        "flops_over_budget": spent / budget if budget else None,
        "est_device_hours": hours,
        # Filled in from compiles for a TPU slice (sizing.py, `loopscale plan --topology`).
        "chips": None, "est_step_time_s": None,
        "role": role.value, "branch_of": t.branch_from or None,
        "branch_step": t.branch_step if t.branch_from else None,
        "flops_spent": own_tokens * fpt,
        "experiment": experiment,
        "overrides": overrides_text(overrides),
    }


def overrides_text(overrides: Overrides) -> str:
    """The plan table's `overrides` cell: the run's `--config.` arguments."""
    return " ".join(f"--config.{k}={format_value(v)}" for k, v in overrides)


def parse_config_overrides(args: Sequence[str]) -> Overrides:
    """`--config.a.b=v` command-line arguments -> (("a.b", "v"), ...); ml_collections parses
    the values by the fields' types when each run's config is resolved."""
    out = []
    for arg in args:
        key, eq, value = arg.removeprefix("--config.").partition("=")
        if not eq or not key:
            raise UsageError(f"{arg}: overrides are --config.a.b=value")
        out.append((key, value))
    return tuple(out)


def plan_file(spec: str, overrides: Sequence[str] = (), peak_flops: float | None = None,
              mfu: float | None = None) -> Plan:
    """The plan of the sweep file `spec` (sweeps/NAME.py[:ARG]): its `--sweep.a.b=v` overrides
    applied to the sweep, its `--config.a.b=v` ones to every run (`loopscale plan` and `sweep`
    take both kinds on one command line)."""
    from loopscale.sweep import load_sweep

    config = parse_config_overrides([o for o in overrides if o.startswith("--config.")])
    return plan(load_sweep(spec, overrides), peak_flops, mfu, config)


def plan(sweep: Sweep, peak_flops: float | None = None, mfu: float | None = None,
         config_overrides: Overrides = ()) -> Plan:
    """Expands a sweep into runs (UsageError if a budget cannot be met by any shape).
    `config_overrides` apply to every run, after the sweep file's (`--config.a.b=v`)."""
    peak = peak_flops or sweep.peak_flops
    mfu = mfu or sweep.mfu
    if peak <= 0 or not 0 < mfu <= 1:
        raise UsageError("--peak-flops must be positive and --mfu in (0, 1]")
    if sweep.measure:
        from loopscale.evaluate.suite import parse_what

        parse_what(",".join(sweep.measure), "sweep.measure")  # names checked before anything is planned
    keyed: list[tuple[tuple, PlannedRun]] = []
    notes: list[str] = []
    grid_points = list(itertools.product(*[[(f, v) for v in vals] for f, vals in sweep.grid]))
    lrs = [(("train.lr", lr),) for lr in sweep.lrs] or [()]
    budgets: list[float | None] = list(sweep.budgets) or [None]
    for fi, family in enumerate(sweep.families):
        fixed = _fixed(sweep, family, config_overrides)
        base = resolve(family.experiment, fixed)
        shape_sets = _shape_sets(sweep, family, base)
        for gi, point in enumerate(grid_points):
            shapes = [_resolve_shape(family.experiment, merge(fixed, s, point), sweep.shape.params)
                      for s in shape_sets]
            chosen: dict[Overrides, list[tuple[int, float | None, int]]] = {}
            by_overrides = {s.overrides: s for s in shapes}
            for bi, budget in enumerate(budgets):
                for shape, steps in _choose(sweep, family, shapes, budget, notes):
                    chosen.setdefault(shape.overrides, []).append((bi, budget, steps))
            for li, lr in enumerate(lrs):
                for seed in sweep.seeds:
                    ctx = _Context(sweep, family, point, lr + (("seed", seed),), peak, mfu)
                    for shape_overrides, points in chosen.items():
                        shape = by_overrides[shape_overrides]
                        runs = (_branched(ctx, shape, points) if sweep.branches
                                else [(bi, _standalone(ctx, shape, budget, steps))
                                      for bi, budget, steps in points])
                        # Budget-major: small budgets finish first and are fittable early;
                        # trunks (bi -1) before everything, since branches start from them.
                        keyed.extend(((bi, fi, gi, li, seed, shape.params), run)
                                     for bi, run in runs)
    out, seen = [], set()
    for _, run in sorted(keyed, key=lambda kv: kv[0]):
        if run.run_id in seen:  # two spellings of one config (e.g. a grid value = the default)
            notes.append(f"{run.family}: run {run.run_id} planned twice; kept once")
            continue
        seen.add(run.run_id)
        out.append(run)
    return Plan(sweep, tuple(out), tuple(notes))


@dataclasses.dataclass(frozen=True)
class _Context:
    """What every run of one family, grid point, LR and seed shares."""

    sweep: Sweep
    family: Family
    grid: tuple[tuple[str, Any], ...]
    fixed: Overrides  # the LR and the seed
    peak: float
    mfu: float

    def run(self, budget: float | None, overrides: Overrides, role: Role) -> PlannedRun:
        family = self.family
        config = resolve(family.experiment, overrides)
        row = plan_row(config, family.name, budget, self.sweep.shape.params, self.grid,
                       family.experiment, overrides, self.peak, self.mfu, role)
        return PlannedRun(row["run_id"], family.name, budget, family.experiment, overrides,
                          config, row, self.sweep.measure)


def _standalone(ctx: _Context, shape: _Shape, budget: float | None, steps: int) -> PlannedRun:
    overrides = merge(shape.overrides, ctx.fixed, _schedule(ctx.sweep, steps))
    return ctx.run(budget, overrides, Role.RUN)


def _branched(ctx: _Context, shape: _Shape, points: list[tuple[int, float | None, int]]
              ) -> list[tuple[int, PlannedRun]]:
    """One shape's budgets as a constant-LR trunk and a WSD cooldown branch per budget. The
    trunk's LR up to each branch point is the WSD schedule's (the same warmup for all, from
    the smallest budget), so each branch trains exactly what a standalone WSD run of its
    budget would (tests/test_branches.py). A budget whose cooldown rounds to no step, or a
    shape planned at one budget only, is a standalone run."""
    t = shape.config.train
    if t.schedule is not Schedule.WSD:
        raise UsageError(f"sweep.branches needs warmup-stable-decay: family {ctx.family.name} "
                         f"has train.schedule={t.schedule.value} (set train.schedule=wsd)")
    sweep = ctx.sweep
    warmup = (int(round(sweep.warmup_frac * min(steps for _, _, steps in points)))
              if sweep.warmup_frac >= 0 else t.warmup_steps)
    starts = {steps: stable_end(steps, t.decay_frac, warmup) for _, _, steps in points}
    branchable = [p for p in points if starts[p[2]] < p[2]]
    alone = [(bi, _standalone(ctx, shape, budget, steps)) for bi, budget, steps in points
             if len(branchable) < 2 or starts[steps] >= steps]
    if len(branchable) < 2:
        return alone
    keep = tuple(sorted({starts[steps] for _, _, steps in branchable}))
    trunk = ctx.run(None, merge(shape.overrides, ctx.fixed, _schedule(sweep, keep[-1]), [
        ("train.schedule", Schedule.CONSTANT.value), ("train.warmup_steps", warmup),
        ("train.keep_steps", keep)]), Role.TRUNK)
    branches = [(bi, ctx.run(budget, merge(shape.overrides, ctx.fixed, _schedule(sweep, steps), [
        ("train.warmup_steps", warmup), ("train.branch_from", trunk.run_id),
        ("train.branch_step", starts[steps])]), Role.BRANCH)) for bi, budget, steps in branchable]
    return [(-1, trunk), *branches, *alone]


def _choose(sweep: Sweep, family: Family, shapes: list[_Shape], budget: float | None,
            notes: list[str]) -> list[tuple[_Shape, int]]:
    if budget is None:
        return [(s, sweep.steps or s.config.train.steps) for s in shapes]
    fits, why_not = [], []
    for shape in shapes:
        steps, reason = _budget_steps(sweep, shape, budget)
        (fits.append((shape, steps)) if steps else why_not.append(reason))
    if not fits:
        raise UsageError(f"budget {budget:.3g} cannot be met by any shape of family "
                         f"{family.name}: {'; '.join(why_not[:2])}"
                         + (f" (and {len(why_not) - 2} more)" if len(why_not) > 2 else ""))
    chosen, note = _around_optimum(sweep, fits)
    if note:
        notes.append(f"budget {budget:.3g}, {family.name}: {note}")
    want = sweep.shape.sizes
    if want and len(chosen) < want:
        why = f" ({'; '.join(why_not[:2])})" if why_not else ""
        notes.append(f"budget {budget:.3g}, {family.name}: only {len(chosen)} of {want} sizes "
                     f"fit{why}")
    return chosen
