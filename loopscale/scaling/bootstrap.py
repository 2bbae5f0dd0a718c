"""Nonparametric cluster bootstrap: resample clusters of runs with replacement, refit, take
percentiles, and say when a figure is not identified.

Each fit (isoflop.py, parametric.py, recurrence.py) supplies a function from an index array (the
resampled rows) to its named figures; this module draws the resamples, collects the figures and
turns them into percentile intervals.

The unit of resampling (`Design`). With cooldown branches, the points of one trunk at every
budget share that trunk's initialisation and data order: they are one draw, not several, so
they move together. A cluster is a trunk with all its branches; a run trained on its own is its
own cluster (`cluster_labels`). Resampling rows one by one would treat a trunk's branches as
independent and make every interval too narrow.

Strata (the IsoFLOP fit: budgets) keep the design of a sweep fixed, so a resample never loses a
budget by chance. A cluster's stratum is the set of strata its rows lie in (a trunk whose
branches span budgets 1e10-1e11 is drawn among the trunks spanning the same budgets). A stratum
holding a single cluster would draw that cluster every time and hide its variation, so then the
clusters are drawn from all clusters at once (`Design.stratified` says which was done).

Failures. A resample whose refit fails records NaN for every figure; a figure that comes out
non-finite on one resample (an exponent whose law is degenerate there) records NaN for that
figure. An interval over the survivors would be conditioned on success and too narrow, so when
more than MAX_FAILED_SHARE of the resamples have no finite value for a figure, the figure is
*not identified*: `interval` returns None and `not_identified` says why ("not identified (41% of
refits failed)").

Determinism: every resample comes from one `np.random.default_rng(seed)` stream, drawn in
order, so the same seed, table and options give the same intervals. With every run its own
cluster the draws are exactly the row-wise bootstrap's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import spearmanr

Figures = Mapping[str, float]

# Above this share of failed refits a figure's interval is not reported (see the docstring).
MAX_FAILED_SHARE = 0.10


class Resampling:
    """What `Design.unit` says in fit.json's `bootstrap.resampling`."""

    RUNS = "runs"
    TRUNKS = "trunks (a cooldown trunk with all its branches; a standalone run alone)"


@dataclasses.dataclass(frozen=True)
class Design:
    """Which rows move together (clusters) and within which groups (strata) they are drawn.

    `clusters[i]`: the cluster label of row i; `members`: row indices per cluster in first-seen
    order; `groups`: cluster indices per stratum (one group of all clusters when unstratified).
    """

    members: tuple[np.ndarray, ...]
    groups: tuple[np.ndarray, ...]
    clustered: bool  # some cluster holds more than one row
    stratified: bool

    @property
    def unit(self) -> str:
        return Resampling.TRUNKS if self.clustered else Resampling.RUNS

    @property
    def n_clusters(self) -> int:
        return len(self.members)

    def to_json(self) -> dict:
        return {"resampling": self.unit, "clusters": self.n_clusters,
                "stratified": self.stratified}


def design(n: int, clusters: np.ndarray | None = None,
           strata: np.ndarray | None = None) -> Design:
    """The resampling design of `n` rows: `clusters` (labels, None: every row alone) drawn
    within `strata` (labels, None: all together); see the module docstring."""
    labels = np.arange(n) if clusters is None else np.asarray(clusters)
    if labels.shape != (n,):
        raise ValueError(f"{labels.shape[0]} cluster labels for {n} rows")
    members = tuple(np.flatnonzero(labels == c) for c in _in_order(labels))
    clustered = any(m.size > 1 for m in members)
    if strata is None:
        return Design(members, (np.arange(len(members)),), clustered, stratified=False)
    strata = np.asarray(strata)
    spans = [tuple(sorted(set(strata[m].tolist()))) for m in members]
    groups = tuple(np.array([k for k, s in enumerate(spans) if s == span])
                   for span in _in_order_list(spans))
    if len(groups) > 1 and any(g.size < 2 for g in groups):
        return Design(members, (np.arange(len(members)),), clustered, stratified=False)
    return Design(members, groups, clustered, stratified=True)


def cluster_labels(run_ids: Sequence[object], branch_of: Sequence[object]) -> np.ndarray:
    """A branch belongs to its trunk's cluster, any other run is its own: `branch_of[i]` (the
    trunk's run id) when set, else `run_ids[i]`. Empty values are None, NaN or ""."""
    def empty(v: object) -> bool:
        return v is None or v == "" or (isinstance(v, float) and v != v)

    out = [str(r) if empty(b) else str(b) for r, b in zip(run_ids, branch_of)]
    return np.array(out, dtype=object)


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """The figures of every resample (NaN where a resample's refit failed)."""

    n_resamples: int
    n_failed: int  # resamples whose refit failed outright
    level: float
    samples: Mapping[str, np.ndarray]  # figure name -> values, one per resample
    design: Design | None = None

    @property
    def failed_share(self) -> float:
        return self.n_failed / self.n_resamples if self.n_resamples else 0.0

    def failure_share(self, name: str) -> float:
        """The share of resamples with no finite value of `name` (whole-refit failures too)."""
        values = self.samples.get(name)
        if values is None or values.size == 0:
            return 1.0
        return float(np.mean(~np.isfinite(values)))

    def not_identified(self, name: str) -> str | None:
        """Why `name` has no interval, or None if it has one."""
        share = self.failure_share(name)
        return not_identified(share) if share > MAX_FAILED_SHARE else None

    def interval(self, name: str) -> tuple[float, float] | None:
        """The central `level` percentile interval of one figure; None if it is not identified
        (over MAX_FAILED_SHARE of refits failed for it) or has no samples."""
        values = self.samples.get(name)
        if values is None or self.not_identified(name):
            return None
        return percentile_interval(values, self.level)

    def rank_correlation(self, x: str, y: str) -> float | None:
        """Spearman's rank correlation of figures `x` and `y` across the resamples where both
        are finite (None under 3 such resamples, or when either is constant there): how the
        two move together, e.g. a parametric fit's alpha and beta trading off along a ridge."""
        a, b = self.samples.get(x), self.samples.get(y)
        if a is None or b is None:
            return None
        keep = np.isfinite(a) & np.isfinite(b)
        if keep.sum() < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
            return None
        return float(spearmanr(a[keep], b[keep]).statistic)

    def intervals(self) -> dict[str, tuple[float, float] | None]:
        return {name: self.interval(name) for name in self.samples}

    def reasons(self) -> dict[str, str]:
        """figure -> "not identified (...)" for every figure without an interval for that
        reason."""
        return {name: why for name in self.samples if (why := self.not_identified(name))}

    def to_json(self) -> dict:
        out = {"resamples": self.n_resamples, "failed": self.n_failed,
               "failed_share": self.failed_share}
        if self.design is not None:
            out.update(self.design.to_json())
        return out


def not_identified(share: float) -> str:
    """The reason a figure failing in `share` of its refits has no interval. Near the
    threshold one decimal, so that 10.3% does not read as the 10% that would be allowed."""
    percent = 100.0 * share
    shown = f"{percent:.1f}" if percent < 11.0 else f"{percent:.0f}"
    return f"not identified ({shown}% of refits failed)"


def percentile_interval(values: np.ndarray, level: float) -> tuple[float, float] | None:
    """The central `level` percentile interval of the finite values, or None under 2 of them;
    callers decide first whether the failures leave the figure identified."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size < 2:
        return None
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def resample(rng: np.random.Generator, plan: Design) -> np.ndarray:
    """Row indices of one resample: clusters drawn with replacement within each stratum, each
    drawn cluster contributing all its rows."""
    parts = []
    for group in plan.groups:
        for k in group[rng.integers(0, group.size, size=group.size)]:
            parts.append(plan.members[k])
    return np.concatenate(parts)


def run_bootstrap(refit: Callable[[np.ndarray], Figures | None], names: Sequence[str],
                  plan: Design, n_resamples: int, rng: np.random.Generator,
                  level: float = 0.95) -> Bootstrap:
    """Calls `refit(indices)` on `n_resamples` resamples drawn by `plan`; None means it
    failed."""
    samples = {name: np.full(n_resamples, np.nan) for name in names}
    failed = 0
    for i in range(n_resamples):
        figures = refit(resample(rng, plan))
        if figures is None:
            failed += 1
            continue
        for name in names:
            samples[name][i] = figures.get(name, np.nan)
    return Bootstrap(n_resamples=n_resamples, n_failed=failed, level=level, samples=samples,
                     design=plan)


def _in_order(values: np.ndarray) -> list:
    # np.unique sorts; keep first-appearance order so the draw does not depend on labels' order.
    return _in_order_list(values.tolist())


def _in_order_list(values: Sequence) -> list:
    seen: dict = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)
