"""Sweeps: a sweep file -> planned runs (plan.py) -> run directories, trained here (runner.py)
or on a cluster (launchers.py) -> one results table (collect.py) for `loopscale fit`.

    sweep = load_sweep("sweeps/isoflop_cpu.py", ["--sweep.budgets=(3e11,)"])
    runs = plan.plan(sweep).runs

schema.py says what a sweep file holds (sweep files start from its `base_sweep()`); rundirs.py
what a sweep directory holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from loopscale.config.loader import load_config
from loopscale.sweep.schema import Sweep, base_sweep, parse_sweep


def load_sweep(spec: str, overrides: Sequence[str] = ()) -> Sweep:
    """Reads `sweeps/NAME.py[:ARG]` with `--sweep.a.b=v` overrides (UsageError if bad). Its
    experiment paths are found from any directory (schema.locate_experiment)."""
    cfg = load_config(spec, [o for o in overrides if o.startswith("--sweep.")], flag="sweep")
    return parse_sweep(cfg, sweep_file=spec.partition(":")[0])


__all__ = ["Sweep", "base_sweep", "load_sweep", "parse_sweep"]
