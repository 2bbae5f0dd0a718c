"""IsoFLOP per budget: which runs share a compute budget, and the loss-optimal size of each
budget's runs with its edge and usability flags (`BudgetMinimum`), plus the spread of that
minimum over resamples of the budget's own runs (the weights of a weighted fit). The power laws
through the minima are frontier_laws.py; isoflop.py puts the two together.

Budgets. The table's `budget` column when it has one. Otherwise runs are grouped by compute:
sorted by log10 C, a run joins the current group while its log10 C is within `tolerance`
(default 0.02 dex, about 4.7%) of the group's first run, else it starts a new group; the
budget is the geometric mean of its group's C. Planned IsoFLOP runs land within a percent of
their budget (rounding of steps and widths) and budgets are spaced far wider than 0.02 dex.

Per budget, loss against x = ln N (N = the fitted parameter count):
- parabola (default): least-squares quadratic over the runs, minimum at its vertex;
- spline: a smoothing spline (scipy make_smoothing_spline, penalty by GCV) through the mean
  loss per size, minimised on a 2,001-point grid over the sampled sizes; it needs 5 sizes, and
  a budget with fewer falls back to the parabola (its `method` says which was used).
  Checked against Porian et al. 2024's per-budget optima (data/reference/, 15 sweeps, 9-12 sizes
  over 1.5-2 decades): spline minima within 0.09 dex of theirs everywhere, while a parabola
  over so wide a grid is pulled by the curve's asymmetry (up to 0.3 dex off). Use the spline
  for wide grids; the parabola is the Chinchilla protocol for grids around the optimum.
A minimum is *on the edge* when the lowest (mean) loss observed is at the smallest or largest
size of the budget, or the fitted minimum lies outside the sampled sizes: the grid does not
bracket the optimum, so the minimum is an extrapolation. Edge minima, budgets whose loss is
not convex in ln N, and budgets with fewer than 3 sizes are kept in `minima` with used=False
and a reason, and left out of the power laws (fit.py adds a warning naming the budget).
D_opt: C is proportional to N*D within a budget, so ln D_opt = mean(ln N + ln D) - ln N_opt.

Where the minimum sits in the grid (every BudgetMinimum): `grid_dex` = log10(N_max / N_min)
over the budget's sizes, and `centring` = (ln N_opt - ln N_min) / (ln N_max - ln N_min): 0.5
for a minimum in the middle of the grid, near 0 or 1 at its ends (below 0 or above 1 for a
fitted minimum beyond the sampled sizes, an edge minimum; for a budget with no minimum, the
position of the best run it reports; NaN with a single size). Approach 2 is biased by both
(arXiv 2603.22339): a parabola fitted to an asymmetric L(ln N) puts its vertex off the true
minimum by an amount that grows with the grid's width and with how off-centre the grid is
around the optimum, and an off-centre grid weighs one side of the curve more.
isoflop.estimator_choice warns from these two figures.

The other estimator beside the chosen one (`alternative=True`, what find_minima does): the
minimum also carries, in `alt`, the BudgetMinimum the other method gives on the same runs
(spline beside a parabola, parabola beside a spline), with its own edge and usability flags;
`alt_method` names that method, `alt_params_opt` / `alt_loss_opt` read its figures (NaN when
it cannot be computed: the spline needs SPLINE_MIN_SIZES sizes, so beside a parabola minimum
of a 3-4 size budget there is none). The chosen method is the one asked for (`spline`) unless
the budget has too few sizes for the spline, when the parabola is chosen and the spline is
the (missing) other. Bootstrap refits (isoflop.bootstrap_isoflop, budget_spread) do not
compute it.

`compute_at_optimum`: a budget's compute under another FLOP convention at its optimum,
ln C_alt interpolated against ln N within the budget at ln N_opt (as params_unique_opt is);
isoflop.refit_under_convention fits the laws against it.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import numpy as np
from scipy.interpolate import make_smoothing_spline

BUDGET_TOLERANCE_DEX = 0.02
SPLINE_MIN_SIZES = 5
SPLINE_GRID = 2001
WEIGHT_RESAMPLES = 200  # budget_spread's resamples of one budget


class Edge(enum.Enum):
    """The end of a budget's size grid that its minimum is on (module docstring)."""

    SMALLEST = "smallest"
    LARGEST = "largest"


@dataclasses.dataclass(frozen=True)
class BudgetMinimum:
    budget: float
    n_runs: int
    n_sizes: int
    method: str  # "parabola" or "spline"
    params_opt: float  # NaN when the budget has no minimum
    tokens_opt: float
    loss_opt: float
    params_unique_opt: float  # NaN without a params_unique column
    edge: Edge | None  # which end of the size grid the minimum is on; None: not on an edge
    used: bool  # enters the power laws
    reason: str | None  # why not used
    # Standard deviations of ln N_opt, ln D_opt, ln L_opt over resamples of this budget's runs
    # (NaN unless the fit is weighted).
    sd_log_params: float = math.nan
    sd_log_tokens: float = math.nan
    sd_log_loss: float = math.nan
    # Where the minimum sits in the sampled grid (see the module docstring).
    centring: float = math.nan  # (ln N_opt - ln N_min) / (ln N_max - ln N_min); 0.5: centred
    grid_dex: float = math.nan  # log10(N_max / N_min) of the budget's sizes
    # The other estimator on the same runs (find_minimum(alternative=True), find_minima):
    alt_method: str | None = None  # "spline" or "parabola"; None when not computed
    alt: BudgetMinimum | None = None  # its minimum; None when it cannot be computed

    @property
    def on_edge(self) -> bool:
        return self.edge is not None

    @property
    def alt_params_opt(self) -> float:
        """N_opt under the other estimator (NaN when there is none)."""
        return math.nan if self.alt is None else self.alt.params_opt

    @property
    def alt_loss_opt(self) -> float:
        """L_opt under the other estimator (NaN when there is none)."""
        return math.nan if self.alt is None else self.alt.loss_opt

    @property
    def alt_used(self) -> bool:
        """Whether the other estimator's minimum is usable (it enters IsoFlopFit.alt_laws)."""
        return self.alt is not None and self.alt.used


def assign_budgets(flops: np.ndarray, tolerance: float = BUDGET_TOLERANCE_DEX) -> np.ndarray:
    """The budget of each run (see the module docstring), in the runs' order."""
    logc = np.log10(np.asarray(flops, dtype=float))
    order = np.argsort(logc, kind="stable")
    group = np.empty(logc.size, dtype=int)
    anchor, current = -np.inf, -1
    for i in order:
        if logc[i] - anchor > tolerance:
            anchor, current = logc[i], current + 1
        group[i] = current
    budgets = np.empty(logc.size)
    for g in range(current + 1):
        members = group == g
        budgets[members] = 10.0 ** logc[members].mean()
    return budgets


def find_minimum(budget: float, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                 unique: np.ndarray | None = None, spline: bool = False,
                 bracket: tuple[float, float] | None = None,
                 alternative: bool = False) -> BudgetMinimum:
    """The loss-optimal size of one budget's runs, with its edge and usability flags.

    `bracket` (bootstrap refits): the ln N range of the full budget. A resample need not
    contain the grid's end sizes, so there the minimum is on the edge only when it falls
    outside the full grid; judged on the resample's own ends, about a third of resamples of a
    7-size budget would lose an end size and wrongly flag a well-bracketed minimum. `centring`
    is then measured on the bracket too.
    `alternative`: also find the other estimator's minimum (`alt`, see the module docstring).
    """
    m = _find_minimum(budget, params, tokens, loss, unique, spline, bracket)
    if not alternative:
        return m
    chosen = "spline" if spline and m.n_sizes >= SPLINE_MIN_SIZES else "parabola"
    other = "parabola" if chosen == "spline" else "spline"
    alt = None
    if other == "parabola" or m.n_sizes >= SPLINE_MIN_SIZES:
        alt = _find_minimum(budget, params, tokens, loss, unique, other == "spline", bracket)
    return dataclasses.replace(m, alt_method=other, alt=alt)


def compute_at_optimum(params_opt: float, params: np.ndarray, flops: np.ndarray) -> float:
    """One budget's compute `flops` (per run, e.g. under another FLOP convention) at its
    optimum: ln flops averaged per size, interpolated against ln N at ln params_opt (held at
    the end sizes' values beyond them, as np.interp does)."""
    sizes, inverse = np.unique(np.log(params), return_inverse=True)
    log_c = np.bincount(inverse, weights=np.log(flops)) / np.bincount(inverse)
    return float(np.exp(np.interp(math.log(params_opt), sizes, log_c)))


def resampled_minimum(like: BudgetMinimum, rows: np.ndarray, budgets: np.ndarray,
                      params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                      unique: np.ndarray | None, spline: bool,
                      bracket: tuple[float, float]) -> BudgetMinimum:
    """A bootstrap refit of the full fit's minimum `like` on the resampled `rows` (indices
    into the arrays), judged on the full budget's size range `bracket` and keeping its
    weights. An unstratified draw (bootstrap.design) can miss the budget entirely: then the
    minimum is unusable in that resample."""
    sel = rows[budgets[rows] == like.budget]
    if sel.size == 0:
        return dataclasses.replace(like, used=False, reason="not in this resample")
    m = find_minimum(like.budget, params[sel], tokens[sel], loss[sel],
                     None if unique is None else unique[sel], spline, bracket)
    return dataclasses.replace(m, sd_log_params=like.sd_log_params,
                               sd_log_tokens=like.sd_log_tokens, sd_log_loss=like.sd_log_loss)


def _find_minimum(budget: float, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                  unique: np.ndarray | None, spline: bool,
                  bracket: tuple[float, float] | None) -> BudgetMinimum:
    x, loss = np.log(params), np.asarray(loss, dtype=float)
    sizes, inverse = np.unique(x, return_inverse=True)
    mean_loss = np.bincount(inverse, weights=loss) / np.bincount(inverse)
    common = {"budget": float(budget), "n_runs": int(x.size), "n_sizes": int(sizes.size)}
    m = _locate_minimum(common, x, sizes, inverse, mean_loss, tokens, loss, unique, spline,
                        bracket)
    low, high = (sizes[0], sizes[-1]) if bracket is None else bracket
    centring = math.nan
    if high > low:
        centring = float((math.log(m.params_opt) - low) / (high - low))
    return dataclasses.replace(m, centring=centring,
                               grid_dex=float((high - low) / math.log(10.0)))


def _locate_minimum(common: dict, x: np.ndarray, sizes: np.ndarray, inverse: np.ndarray,
                    mean_loss: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                    unique: np.ndarray | None, spline: bool,
                    bracket: tuple[float, float] | None) -> BudgetMinimum:
    if sizes.size < 3:
        return _no_minimum(common, x, loss, f"{sizes.size} model sizes (a minimum needs 3)")
    method = "spline" if spline and sizes.size >= SPLINE_MIN_SIZES else "parabola"
    if method == "spline":
        grid = np.linspace(sizes[0], sizes[-1], SPLINE_GRID)
        curve = make_smoothing_spline(sizes, mean_loss)(grid)
        k = int(np.argmin(curve))
        x_opt, loss_opt = grid[k], float(curve[k])
        # The spline cannot extrapolate: a minimum at its own end is unbracketed, in a
        # bootstrap resample too.
        clipped = k in (0, grid.size - 1)
    else:
        c2, c1, c0 = np.polyfit(x, loss, 2)
        if not c2 > 0:
            return _no_minimum(common, x, loss, "loss is not convex in ln(params)")
        x_opt = -c1 / (2.0 * c2)
        loss_opt = float(c0 - c1 * c1 / (4.0 * c2))
        clipped = False
    low, high = (sizes[0], sizes[-1]) if bracket is None else bracket
    lowest = int(np.argmin(mean_loss))
    if not loss_opt > 0:
        # A flat, poorly fitted parabola can dip below zero between the sizes: no minimum.
        return _no_minimum(common, x, loss, "fitted minimum loss is not positive")
    if clipped or not low < x_opt < high:
        edge = Edge.SMALLEST if x_opt <= 0.5 * (sizes[0] + sizes[-1]) else Edge.LARGEST
        why = f"fitted minimum at or beyond the {edge.value} size"
    elif bracket is None and lowest in (0, sizes.size - 1):
        edge = Edge.SMALLEST if lowest == 0 else Edge.LARGEST
        why = f"lowest loss at the {edge.value} size"
    else:
        edge = None
    log_nd = np.mean(x + np.log(tokens))
    unique_opt = math.nan
    if unique is not None:
        log_u = np.bincount(inverse, weights=np.log(unique)) / np.bincount(inverse)
        unique_opt = float(np.exp(np.interp(x_opt, sizes, log_u)))
    return BudgetMinimum(
        **common, method=method, params_opt=float(np.exp(x_opt)),
        tokens_opt=float(np.exp(log_nd - x_opt)), loss_opt=loss_opt,
        params_unique_opt=unique_opt, edge=edge, used=edge is None,
        reason=None if edge is None else f"minimum on the edge of the size grid ({why})")


def _no_minimum(common: dict, x: np.ndarray, loss: np.ndarray, reason: str) -> BudgetMinimum:
    # Report the best run observed, so the table still says where this budget stood.
    best = int(np.argmin(loss))
    return BudgetMinimum(**common, method="parabola", params_opt=float(np.exp(x[best])),
                         tokens_opt=math.nan, loss_opt=float(loss[best]),
                         params_unique_opt=math.nan, edge=None, used=False, reason=reason)


def find_minima(budgets: np.ndarray, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                unique: np.ndarray | None = None, spline: bool = False,
                alternative: bool = True) -> tuple[BudgetMinimum, ...]:
    """One BudgetMinimum per budget, in increasing budget, each with the other estimator's
    minimum beside it unless `alternative` is False."""
    out = []
    for budget in np.unique(budgets):
        m = budgets == budget
        out.append(find_minimum(budget, params[m], tokens[m], loss[m],
                                None if unique is None else unique[m], spline,
                                alternative=alternative))
    return tuple(out)


def budget_spread(budget: float, params: np.ndarray, tokens: np.ndarray, loss: np.ndarray,
                  rng: np.random.Generator, spline: bool = False,
                  n_resamples: int = WEIGHT_RESAMPLES) -> tuple[float, float, float]:
    """sd of (ln N_opt, ln D_opt, ln L_opt) over resamples of one budget's runs."""
    rows = []
    for _ in range(n_resamples):
        idx = rng.integers(0, params.size, size=params.size)
        m = find_minimum(budget, params[idx], tokens[idx], loss[idx], spline=spline)
        if m.used:
            rows.append((math.log(m.params_opt), math.log(m.tokens_opt), math.log(m.loss_opt)))
    if len(rows) < 2:
        return math.nan, math.nan, math.nan
    sd = np.std(np.array(rows), axis=0, ddof=1)
    return float(sd[0]), float(sd[1]), float(sd[2])
