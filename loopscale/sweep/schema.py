"""A sweep file, validated once into frozen dataclasses (the sweep-side twin of config/schema.py).

A sweep file is an ml_collections file whose `get_config(arg)` starts from `base_sweep()` (every
field's default, in one place) and sets only what the sweep chooses:

    s = base_sweep()
    s.name = "widths"
    s.families = {"base": {"experiment": "experiments/base.py:tiny", "overrides": {}}}
    s.budgets = (1e10, 2e10)
    s.shape.kind, s.shape.widths = "width", (32, 64, 128)

`parse_sweep` requires every field below and rejects any other, at every level (a family's, the
shape's), so a typo fails at start-up in one line:

    name              str    label of the sweep
    families          dict   family name -> {experiment: "experiments/X.py[:ARG]",
                             overrides: nested dict of config fields, e.g. {model: {ffn: "moe"}}}
    select            str    comma-separated family names to plan, in this order ("" = all,
                             alphabetical); `--sweep.select=base,moe` plans fewer
    overrides         dict   nested config overrides applied to every family (before its own)
    flop_convention   str    "" (each family's) or 6n | 6n_emb | 6n_attn | 6n_attn_causal
    budgets           tuple  training FLOP budgets; empty: no IsoFLOP, every run trains `steps`
    budget_tolerance  float  a run's planned flops must be within this fraction of its budget
    shape             dict   rule: "width" (a d_model ladder at the family's depth, heads =
                             d_model / head size), "shapes" (explicit model-field sets) or
                             "family" (the family's own shape); widths; head_dim (head size
                             of the width rule, 0 = the family's) or n_heads (a fixed number of
                             heads of size d_model / n_heads; 0 = use head_dim); ffn_ratio
                             (> 0: d_ff = round(ratio * d_model) at every width, so the FFN
                             keeps its share of the parameters; 0 = the family's rule); shapes;
                             sizes (shapes kept per budget around the expected optimum, 0 = all),
                             tokens_per_param (where that optimum is expected), params (the count
                             that centring and `collect`'s `params` column use)
    batch_size, seq_len  int 0 keeps the family's
    seeds, lrs        tuple  empty lrs keeps the family's train.lr (under muP: the base-width LR
                             found by sweeps/lr_transfer.py, held across widths)
    grid              dict   nested config fields -> tuple of values: extra crossed axes
    steps             int    steps of runs without a budget (0 keeps the family's)
    min_steps, max_steps  int  a budget's shape needing fewer (more; 0 = no limit) is left out
    warmup_frac       float  warmup steps = round(frac * steps) (negative keeps the family's)
    evals, checkpoints  int  per run: eval_every / checkpoint_every = steps // n (0 keeps)
    measure           str    comma-separated `loopscale eval` measurements (e.g. "ppl,loops")
                             taken of each run as it completes: `loopscale train --eval=...`
                             in the local runner and the launch scripts alike ("" = none)
    branches          bool   cooldown branches (plan.py): each size trains once at constant LR
                             to its largest budget's branch point, and each budget is a short
                             WSD cooldown from that trunk's checkpoint (families' schedule wsd)
    peak_flops, mfu   float  defaults of `plan`'s --peak-flops / --mfu (est_device_hours)

A family's experiment is a path as `loopscale train --config=` takes it. A relative path is
looked up in the current directory first, then in the checkout the sweep file belongs to (the
parent of the sweep file's directory: sweeps/X.py names experiments/Y.py), so a sweep plans and
runs from any directory; a path found only the second way is planned, and launched, as an
absolute path (`locate_experiment`).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import os
import re
from pathlib import Path
from typing import Any

import ml_collections

from loopscale.config.schema import FlopConvention
from loopscale.errors import UsageError

PARAM_COUNTS = ("params_active", "params_unique", "params_effective", "params_total",
                "params_active_nonembedding")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ShapeKind(enum.Enum):
    WIDTH = "width"  # muP width ladder at the family's (effective) depth
    SHAPES = "shapes"  # explicit sets of model fields: a width/depth ladder
    FAMILY = "family"  # the family's own shape (grids over other fields)


# Overrides are kept as (dotted field, value) pairs, in a fixed order, so that the command a
# run is launched with is a pure function of the sweep file.
Overrides = tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    experiment: str  # experiments/NAME.py[:ARG], as located (locate_experiment)
    overrides: Overrides


@dataclasses.dataclass(frozen=True)
class ShapeRule:
    kind: ShapeKind
    widths: tuple[int, ...]
    head_dim: int  # 0: the family's head size
    n_heads: int  # > 0: this many heads at every width (head size d_model / n_heads)
    # > 0: d_ff = round(ffn_ratio * d_model) at every width (MoE experts d_ff // top_k). The
    # family's SwiGLU rule rounds d_ff up to a multiple of 64, which freezes it for every
    # d <= 24 and changes the model's shape along a small ladder.
    ffn_ratio: float
    shapes: tuple[Overrides, ...]  # model fields per shape, for kind=shapes
    sizes: int  # shapes per budget around the expected optimum (0: all)
    tokens_per_param: float
    params: str  # one of PARAM_COUNTS


@dataclasses.dataclass(frozen=True)
class Sweep:
    name: str
    families: tuple[Family, ...]  # in planning order
    overrides: Overrides
    flop_convention: FlopConvention | None
    budgets: tuple[float, ...]
    budget_tolerance: float
    shape: ShapeRule
    batch_size: int
    seq_len: int
    seeds: tuple[int, ...]
    lrs: tuple[float, ...]
    grid: tuple[tuple[str, tuple], ...]
    steps: int
    min_steps: int
    max_steps: int
    warmup_frac: float
    evals: int
    checkpoints: int
    branches: bool
    measure: tuple[str, ...]
    peak_flops: float
    mfu: float


def base_sweep() -> ml_collections.ConfigDict:
    """Every default of every sweep field, in one place. Sweep files start from here; `name`
    and `families` have none (the empty values fail parsing until the file sets them)."""
    s = ml_collections.ConfigDict()
    s.name = ""
    s.families = {}
    s.select = ""  # every family, alphabetically
    s.overrides = {}
    s.flop_convention = ""  # each family's
    s.budgets = ()  # no IsoFLOP: every run trains `steps`
    s.budget_tolerance = 0.05
    s.shape = {"kind": "family", "widths": (), "head_dim": 0, "n_heads": 0, "ffn_ratio": 0.0,
               "shapes": (), "sizes": 0, "tokens_per_param": 20.0, "params": "params_active"}
    s.batch_size, s.seq_len = 0, 0  # the family's
    s.seeds = (0,)
    s.lrs = ()  # the family's train.lr
    s.grid = {}
    s.steps = 0  # the family's
    s.min_steps, s.max_steps = 0, 0  # no limits
    s.warmup_frac = -1.0  # the family's warmup_steps
    s.evals, s.checkpoints = 0, 0  # the family's eval_every / checkpoint_every
    s.branches = False  # one run per (size, budget)
    s.measure = ""  # no evaluation beyond the trainer's own
    # est_device_hours: one TPU v5p chip's bf16 peak at 40% MFU (CPU sweeps set their own).
    s.peak_flops, s.mfu = 459e12, 0.4
    return s


def flatten(tree: Any, where: str, prefix: str = "") -> Overrides:
    """Nested dict of config fields -> sorted ((dotted.field, value), ...)."""
    if not isinstance(tree, (dict, ml_collections.ConfigDict)):
        raise UsageError(f"sweep field {where} must be a dict of config fields")
    out = []
    for key, value in dict(tree).items():
        if isinstance(value, (dict, ml_collections.ConfigDict)):
            out.extend(flatten(value, where, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return tuple(sorted(out))


def _get(d: Any, key: str, where: str) -> Any:
    if key not in d:
        raise UsageError(f"sweep field {where}{key} is missing")
    return d[key]


def _only(d: Any, known: set[str], where: str) -> None:
    unknown = sorted(set(d.keys()) - known)
    if unknown:
        raise UsageError(f"unknown sweep field {where}{unknown[0]}")


def _typed(value: Any, typ: type, where: str) -> Any:
    if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if typ is str and isinstance(value, str):
        return value
    if typ is bool and isinstance(value, bool):
        return value
    kind = {float: "a number", int: "an integer", str: "a string", bool: "true or false"}[typ]
    raise UsageError(f"sweep field {where}={value!r} must be {kind}")


def _tuple(value: Any, typ: type, where: str) -> tuple:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        value = (value,)  # a single value where a tuple is expected: `--sweep.seeds=3`
    if not isinstance(value, (list, tuple)):
        raise UsageError(f"sweep field {where}={value!r} must be a tuple")
    return tuple(_typed(v, typ, where) for v in value)


def _shape_set(spec: str, where: str) -> Overrides:
    """"d_model=256,n_unique=8" -> (("model.d_model", 256), ("model.n_unique", 8))."""
    pairs = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, eq, raw = part.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"{where}: {spec!r} is not of the form field=value,field=value")
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        pairs.append((f"model.{key.strip()}", value))
    if not pairs:
        raise UsageError(f"{where}: empty shape")
    return tuple(sorted(pairs))


def locate_experiment(spec: str, sweep_file: str) -> str:
    """A family's `experiments/X.py[:ARG]` as `loopscale train` will be given it: unchanged if
    its path is absolute or a file relative to the current directory; else, if the checkout of
    `sweep_file` (the parent of its directory) holds it, that file's absolute path; else
    unchanged (loading it then names the missing path)."""
    path, colon, arg = spec.partition(":")
    if not sweep_file or os.path.isabs(path) or os.path.isfile(path):
        return spec
    candidate = Path(sweep_file).resolve().parent.parent / path
    return f"{candidate}{colon}{arg}" if candidate.is_file() else spec


def _families(cfg: Any, select: str, sweep_file: str) -> tuple[Family, ...]:
    fams = _get(cfg, "families", "")
    if not isinstance(fams, (dict, ml_collections.ConfigDict)) or not fams:
        raise UsageError("sweep field families must name at least one family")
    names = [n.strip() for n in select.split(",") if n.strip()] or sorted(fams)
    out = []
    for name in names:
        if name not in fams:
            raise UsageError(f"sweep.select names no family {name!r} "
                             f"(families: {', '.join(sorted(fams))})")
        if not _NAME.match(name):
            raise UsageError(f"family name {name!r} must be letters, digits, '_', '-' or '.'")
        if names.count(name) > 1:
            raise UsageError(f"sweep.select names family {name!r} twice")
        f = fams[name]
        where = f"families.{name}."
        if not isinstance(f, (dict, ml_collections.ConfigDict)):
            raise UsageError(f"sweep field families.{name} must be a dict: experiment, overrides")
        _only(f, {"experiment", "overrides"}, where)
        experiment = _typed(_get(f, "experiment", where), str, where + "experiment")
        overrides = flatten(_get(f, "overrides", where), where + "overrides")
        out.append(Family(name, locate_experiment(experiment, sweep_file), overrides))
    return tuple(out)


def _shape(cfg: Any) -> ShapeRule:
    s = _get(cfg, "shape", "")
    w = "shape."
    if not isinstance(s, (dict, ml_collections.ConfigDict)):
        raise UsageError("sweep field shape must be a dict of the shape rule's fields")
    _only(s, set(base_sweep().shape.keys()), w)
    kind_raw = _get(s, "kind", w)
    try:
        kind = ShapeKind(kind_raw)
    except ValueError:
        allowed = ", ".join(k.value for k in ShapeKind)
        raise UsageError(f"sweep field shape.kind={kind_raw!r} is not one of: {allowed}") from None
    widths = _tuple(_get(s, "widths", w), int, w + "widths")
    specs = _tuple(_get(s, "shapes", w), str, w + "shapes")
    shapes = tuple(_shape_set(x, w + "shapes") for x in specs)
    rule = ShapeRule(
        kind=kind, widths=widths, shapes=shapes,
        head_dim=_typed(_get(s, "head_dim", w), int, w + "head_dim"),
        n_heads=_typed(_get(s, "n_heads", w), int, w + "n_heads"),
        ffn_ratio=_typed(_get(s, "ffn_ratio", w), float, w + "ffn_ratio"),
        sizes=_typed(_get(s, "sizes", w), int, w + "sizes"),
        tokens_per_param=_typed(_get(s, "tokens_per_param", w), float, w + "tokens_per_param"),
        params=_typed(_get(s, "params", w), str, w + "params"))
    if kind is ShapeKind.WIDTH and (not widths or min(widths) < 1):
        raise UsageError("shape.kind=width needs shape.widths, positive integers")
    if kind is ShapeKind.SHAPES and not shapes:
        raise UsageError("shape.kind=shapes needs shape.shapes, e.g. ('d_model=128,n_unique=4',)")
    if len(set(widths)) != len(widths) or len(set(shapes)) != len(shapes):
        raise UsageError("shape.widths / shape.shapes has a duplicate")
    if rule.params not in PARAM_COUNTS:
        raise UsageError(f"shape.params={rule.params!r} is not one of: {', '.join(PARAM_COUNTS)}")
    if rule.head_dim and rule.n_heads:
        raise UsageError("shape.head_dim and shape.n_heads are exclusive; set one to 0")
    if (min(rule.sizes, rule.head_dim, rule.n_heads, rule.ffn_ratio) < 0
            or rule.tokens_per_param <= 0):
        raise UsageError("shape.sizes, shape.head_dim, shape.n_heads and shape.ffn_ratio must "
                         "be >= 0, shape.tokens_per_param > 0")
    if rule.ffn_ratio and kind is not ShapeKind.WIDTH:
        raise UsageError("shape.ffn_ratio applies to shape.kind=width only")
    return rule


def _grid(cfg: Any) -> tuple[tuple[str, tuple], ...]:
    axes = []
    for field, values in flatten(_get(cfg, "grid", ""), "grid"):
        if not isinstance(values, (list, tuple)) or not values:
            raise UsageError(f"sweep field grid.{field} must be a non-empty tuple of values")
        axes.append((field, tuple(values)))
    return tuple(axes)


def parse_sweep(cfg: ml_collections.ConfigDict, sweep_file: str = "") -> Sweep:
    """Validates a sweep ConfigDict (raises UsageError with a one-line message); `sweep_file`,
    the file it came from, is where relative experiment paths are looked up second."""
    _only(cfg, set(base_sweep().keys()), "")  # base_sweep names every field
    g = lambda key, typ: _typed(_get(cfg, key, ""), typ, key)  # noqa: E731
    convention = g("flop_convention", str)
    if convention:
        try:
            convention = FlopConvention(convention)
        except ValueError:
            allowed = ", ".join(c.value for c in FlopConvention)
            raise UsageError(f"sweep field flop_convention={convention!r} is not one of: "
                             f"{allowed}") from None
    sweep = Sweep(
        name=g("name", str),
        families=_families(cfg, g("select", str), sweep_file),
        overrides=flatten(_get(cfg, "overrides", ""), "overrides"),
        flop_convention=convention or None,
        budgets=_tuple(_get(cfg, "budgets", ""), float, "budgets"),
        budget_tolerance=g("budget_tolerance", float),
        shape=_shape(cfg),
        batch_size=g("batch_size", int), seq_len=g("seq_len", int),
        seeds=_tuple(_get(cfg, "seeds", ""), int, "seeds"),
        lrs=_tuple(_get(cfg, "lrs", ""), float, "lrs"),
        grid=_grid(cfg),
        steps=g("steps", int), min_steps=g("min_steps", int), max_steps=g("max_steps", int),
        warmup_frac=g("warmup_frac", float), evals=g("evals", int),
        checkpoints=g("checkpoints", int), branches=g("branches", bool),
        measure=tuple(m.strip() for m in g("measure", str).split(",") if m.strip()),
        peak_flops=g("peak_flops", float), mfu=g("mfu", float))
    _check(sweep)
    return sweep


def _check(s: Sweep) -> None:
    if not _NAME.match(s.name):
        raise UsageError(f"sweep name {s.name!r} must be letters, digits, '_', '-' or '.'")
    if any(b <= 0 for b in s.budgets) or len(set(s.budgets)) != len(s.budgets):
        raise UsageError(f"sweep budgets {s.budgets} must be distinct positive FLOP counts")
    if not 0 < s.budget_tolerance < 1:
        raise UsageError(f"budget_tolerance={s.budget_tolerance} must be between 0 and 1")
    if not s.seeds:
        raise UsageError("sweep field seeds must hold at least one seed")
    if any(lr <= 0 for lr in s.lrs):
        raise UsageError(f"sweep lrs {s.lrs} must be positive")
    counts = ("batch_size", "seq_len", "steps", "min_steps", "max_steps", "evals", "checkpoints")
    for name in counts:
        if getattr(s, name) < 0:
            raise UsageError(f"sweep field {name}={getattr(s, name)} must be >= 0")
    if s.max_steps and s.max_steps < max(1, s.min_steps):
        raise UsageError(f"max_steps={s.max_steps} is below min_steps={s.min_steps}")
    if s.warmup_frac >= 1:
        raise UsageError(f"warmup_frac={s.warmup_frac} must be below 1")
    if s.peak_flops <= 0 or not 0 < s.mfu <= 1:
        raise UsageError("peak_flops must be positive and mfu in (0, 1]")
    planned = {"train.lr", "train.steps", "train.batch_size", "train.seq_len", "seed"}
    clash = sorted(planned & {f for f, _ in s.grid})
    if clash:
        raise UsageError(f"grid.{clash[0]} is set by the planner; use the sweep's own field")
    if s.shape.kind is ShapeKind.WIDTH and any(f == "model.d_model" for f, _ in s.grid):
        raise UsageError("grid.model.d_model clashes with shape.kind=width")
