"""Nonparametric bootstrap over runs: resample rows with replacement, refit, take percentiles.

Each fit (isoflop.py, parametric.py) supplies a function from an index array (the resampled
rows) to its named figures; this module draws the resamples, collects the figures and turns
them into percentile intervals. A resample whose refit fails records NaN for every figure and
counts in `n_failed`; intervals are taken over the finite values only, so a figure that is
often unidentifiable shows that in n_failed rather than in a silently narrow interval.

Determinism: every resample comes from one `np.random.default_rng(seed)` stream, drawn in
order, so the same seed, table and options give the same intervals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

Figures = Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """The figures of every resample (NaN where a resample's refit failed)."""

    n_resamples: int
    n_failed: int
    level: float
    samples: Mapping[str, np.ndarray]  # figure name -> values, one per resample

    def interval(self, name: str) -> tuple[float, float] | None:
        """The central `level` percentile interval of one figure, None if it has no samples."""
        values = self.samples.get(name)
        if values is None:
            return None
        values = values[np.isfinite(values)]
        if values.size < 2:
            return None
        tail = 100.0 * (1.0 - self.level) / 2.0
        low, high = np.percentile(values, [tail, 100.0 - tail])
        return float(low), float(high)

    def intervals(self) -> dict[str, tuple[float, float] | None]:
        return {name: self.interval(name) for name in self.samples}


def resample(rng: np.random.Generator, n: int, strata: np.ndarray | None = None) -> np.ndarray:
    """Row indices drawn with replacement; within each stratum when `strata` is given.

    Stratifying keeps the design of an IsoFLOP sweep (which budgets exist, how many runs
    each) fixed, so a resample never loses a budget by chance.
    """
    if strata is None:
        return rng.integers(0, n, size=n)
    parts = []
    for value in _in_order(strata):
        members = np.flatnonzero(strata == value)
        parts.append(members[rng.integers(0, members.size, size=members.size)])
    return np.concatenate(parts)


def run_bootstrap(refit: Callable[[np.ndarray], Figures | None], names: Sequence[str], n: int,
                  n_resamples: int, rng: np.random.Generator, strata: np.ndarray | None = None,
                  level: float = 0.95) -> Bootstrap:
    """Calls `refit(indices)` on `n_resamples` resamples of `n` rows; None means it failed."""
    samples = {name: np.full(n_resamples, np.nan) for name in names}
    failed = 0
    for i in range(n_resamples):
        figures = refit(resample(rng, n, strata))
        if figures is None:
            failed += 1
            continue
        for name in names:
            samples[name][i] = figures.get(name, np.nan)
    return Bootstrap(n_resamples=n_resamples, n_failed=failed, level=level, samples=samples)


def _in_order(values: np.ndarray) -> list:
    # np.unique sorts; keep first-appearance order so the draw does not depend on labels' order.
    seen: dict = {}
    for v in values.tolist():
        seen.setdefault(v, None)
    return list(seen)
