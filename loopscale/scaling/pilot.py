"""The pilot's error budget: how wide an exponent's interval a sweep can give, before it runs.

A pilot trains a few seeds of a few shapes at one budget, as the sweep will train them. The
seed-to-seed spread of their eval losses, pooled over the shapes, is sigma_L: the noise every
point of the sweep carries. From it and the sweep's design the width of the interval on the
IsoFLOP exponent a (N_opt ~ C^a) follows by error propagation:

- At one budget the loss is fitted as a parabola in x = ln N around its vertex,
  L = c0 + c1 x + c2 x^2. For points x_i centred on the vertex, the least-squares slope has
  Var(c1) = sigma_L^2 / sum(x_i^2), and the vertex x* = -c1 / (2 c2) moves by
  sigma(x*) = sigma_L / (2 c2 sqrt(sum x_i^2)).
- a is the slope of x* against ln C over the budgets: sigma(a) = sigma(x*) / sqrt(sum (ln C_j -
  mean)^2), and the 95% interval is +-1.96 sigma(a).

That is a lower bound: it counts seed noise only (no misfit of the parabola, no
uncertainty in c2). The curvature c2 (nats per (ln N)^2) is not something a pilot at two widths
measures; it is given (`loopscale demo --curvature`). Gate: above NOISE_LIMIT nats (the default of
`--noise-limit`) the points cannot resolve the minimum at this scale, and the demo prints no
exponents.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from loopscale.errors import UsageError

NOISE_LIMIT = 0.05  # nats: issue #21's gate
Z95 = 1.959964


@dataclasses.dataclass(frozen=True)
class ShapeNoise:
    family: str
    budget: float
    d_model: int
    seeds: int
    mean: float
    std: float  # sample standard deviation over seeds (n - 1)


@dataclasses.dataclass(frozen=True)
class Pilot:
    shapes: tuple[ShapeNoise, ...]
    sigma_L: float  # pooled over the shapes: sqrt(sum of squared deviations / sum(n - 1))
    dof: int  # sum(n - 1)
    noise_limit: float  # the gate: above it, not resolved at this scale
    curvature: float  # c2, given
    spread_ln_n: float  # sqrt(sum x^2) per budget, mean over the sweep's budgets
    spread_ln_c: float  # sqrt(sum (ln C - mean)^2) over the sweep's budgets
    sigma_vertex: float  # sigma(ln N_opt) at one budget
    a_half_width: float  # 95%, seed noise only

    @property
    def resolved(self) -> bool:
        return self.sigma_L <= self.noise_limit

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["resolved"] = self.resolved
        out["note"] = ("a_half_width: the 95% half-width of the IsoFLOP exponent a that seed "
                       "noise alone allows (a lower bound), at the given curvature")
        return out


def seed_noise(rows: Iterable[Mapping]) -> tuple[tuple[ShapeNoise, ...], float, int]:
    """Per-shape spread of the completed rows' `loss` over seeds (a shape: family, budget and
    width; the rows differ in nothing else but the seed), and the pooled sigma_L with its
    degrees of freedom. A shape needs two seeds to count."""
    by_shape: dict[tuple[str, float, int], list[float]] = defaultdict(list)
    for row in rows:
        if row.get("loss") not in (None, ""):
            shape = (row["family"], float(row["budget"]), int(row["d_model"]))
            by_shape[shape].append(float(row["loss"]))
    shapes, squares, dof = [], 0.0, 0
    for (family, budget, d), losses in sorted(by_shape.items()):
        if len(losses) < 2:
            continue
        mean = sum(losses) / len(losses)
        ss = sum((x - mean) ** 2 for x in losses)
        shapes.append(ShapeNoise(family, budget, d, len(losses), mean,
                                 math.sqrt(ss / (len(losses) - 1))))
        squares, dof = squares + ss, dof + len(losses) - 1
    if not dof:
        raise UsageError("the pilot has no shape with two completed seeds: no noise to measure")
    return tuple(shapes), math.sqrt(squares / dof), dof


def centred_spread(values: Sequence[float]) -> float:
    """sqrt(sum (v - mean)^2): how far a design spreads its points."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values))


def design_spreads(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """(spread of ln N within a budget, mean over budgets; spread of ln C over budgets) for a
    sweep's (budget, params) points."""
    by_budget: dict[float, list[float]] = defaultdict(list)
    for budget, params in points:
        by_budget[float(budget)].append(math.log(float(params)))
    if len(by_budget) < 2:
        raise UsageError("an exponent needs a sweep of at least two budgets")
    within = [centred_spread(x) for x in by_budget.values()]
    return sum(within) / len(within), centred_spread([math.log(c) for c in by_budget])


def pilot(rows: Iterable[Mapping], points: Iterable[tuple[float, float]], curvature: float,
          noise_limit: float = NOISE_LIMIT) -> Pilot:
    """The pilot's noise (`rows`: its collected results) and the interval it predicts for the
    sweep whose (budget, params) points are `points`, gated at `noise_limit` nats."""
    if curvature <= 0:
        raise UsageError(f"--curvature={curvature} must be positive (nats per (ln N)^2)")
    if noise_limit <= 0:
        raise UsageError(f"--noise-limit={noise_limit} must be positive (nats)")
    shapes, sigma, dof = seed_noise(rows)
    spread_n, spread_c = design_spreads(points)
    sigma_vertex = sigma / (2 * curvature * spread_n)
    return Pilot(shapes=shapes, sigma_L=sigma, dof=dof, noise_limit=noise_limit,
                 curvature=curvature,
                 spread_ln_n=spread_n, spread_ln_c=spread_c, sigma_vertex=sigma_vertex,
                 a_half_width=Z95 * sigma_vertex / spread_c)


def lines(p: Pilot) -> list[str]:
    per_width = ", ".join(f"{s.family} d {s.d_model} at {s.budget:g}: {s.mean:.3f} +- "
                          f"{s.std:.3f} ({s.seeds} seeds)" for s in p.shapes)
    out = [f"pilot: eval loss {per_width}",
           f"pilot: seed noise sigma_L = {p.sigma_L:.4f} nats ({p.dof} degrees of freedom)"]
    if not p.resolved:
        out.append(f"pilot: not resolved at this scale (sigma_L {p.sigma_L:.3f} > "
                   f"{p.noise_limit:g} nats): the sweep's minima would be noise; no exponents")
        return out
    out.append(f"pilot: predicted 95% interval on a: +-{p.a_half_width:.3f} (seed noise only, "
               f"a lower bound; curvature {p.curvature:g} nats/(ln N)^2, sigma(ln N_opt) "
               f"{p.sigma_vertex:.3f} a budget)")
    return out
