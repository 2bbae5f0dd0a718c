"""The figures of `loopscale report`, each rendered to PNG and SVG bytes (matplotlib, Agg).

They are drawn from the in-memory FitResult rather than fit.json because they need what
fit.json leaves out: every run's (N, D, L) for the IsoFLOP curves, and the bootstrap
resamples, from which the interval bands are taken (pointwise percentiles of the resampled
fits' curves). No pyplot: a bare `Figure` keeps the global backend and rcParams untouched.

Colours: one per family in every figure (Base, Looped, MoE and Looped-MoE fixed, other
names from the rest of the palette in table order); in the IsoFLOP panels, one per budget.
Markers: a filled star is a budget minimum used by the power laws; an open red circle is one
left out (on the edge of its size grid, or no convex minimum), and its curve is dashed.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re

import matplotlib
import numpy as np
from matplotlib.colors import ListedColormap, LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter, PercentFormatter
from scipy.interpolate import make_smoothing_spline

from loopscale.scaling import isoflop as iso
from loopscale.scaling.fit import FamilyFit, FitResult

# Keys are names lower-cased with non-alphanumerics dropped: "Looped-MoE" == "looped_moe".
KNOWN_COLORS = {"base": "#1f77b4", "looped": "#ff7f0e", "moe": "#2ca02c",
                "loopedmoe": "#d62728"}
PALETTE = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
STYLE = {"font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8, "axes.grid": True,
         "grid.alpha": 0.3, "grid.linewidth": 0.6, "svg.hashsalt": "loopscale"}
DPI = 150
CURVE_POINTS = 200


@dataclasses.dataclass(frozen=True)
class Rendered:
    stem: str  # file name without extension: STEM.png and STEM.svg
    title: str
    caption: str
    png: bytes
    svg: bytes


def family_colors(names) -> dict[str, str]:
    out, spare = {}, iter(PALETTE * (1 + len(names) // len(PALETTE)))
    for name in names:
        key = re.sub(r"[^a-z0-9]", "", name.lower())
        out[name] = KNOWN_COLORS.get(key) or next(spare)
    return out


@dataclasses.dataclass(frozen=True)
class _Family:
    fit: FamilyFit
    color: str
    params: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    flops: np.ndarray  # C as the fit took it (the flops column, or 6 N D)
    budgets: np.ndarray

    def ci(self, i: int, figure: str):
        boot = self.fit.isoflop_boot
        return None if boot is None else boot.interval(iso.minimum_figure(i, figure))

    def samples(self, *names: str):
        boot = self.fit.isoflop_boot
        return None if boot is None else [np.asarray(boot.samples[n]) for n in names]


def _families(result: FitResult) -> list[_Family]:
    colors = family_colors([f.name for f in result.families])
    # The runs and budgets fit.fit_family fitted (runs.py), so curves match the minima.
    return [_Family(fam, colors[fam.name], fam.runs.params, fam.runs.tokens, fam.runs.loss,
                    fam.runs.flops, fam.runs.budgets) for fam in result.families]


def render_all(result: FitResult) -> list[Rendered]:
    with matplotlib.rc_context(STYLE):
        return [_render(stem, title, caption, draw(result))
                for stem, title, caption, draw in figures_for(result)]


def _render(stem: str, title: str, caption: str, fig: Figure) -> Rendered:
    data = {}
    for fmt, meta in (("png", {"Software": None}), ("svg", {"Date": None})):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=meta)
        data[fmt] = buf.getvalue()
    return Rendered(stem, title, caption, data["png"], data["svg"])


# --- helpers ------------------------------------------------------------------------------

def _band(samples, x: np.ndarray, level: float, sign: float = 1.0):
    """Pointwise percentile band of coef * x^(sign * k) over the bootstrap resamples."""
    if samples is None:
        return None
    coef, k = (s[:, None] for s in samples)
    with np.errstate(all="ignore"):
        curves = _power(coef, sign * k, x[None, :])
    curves = curves[np.all(np.isfinite(curves), axis=1)]
    if len(curves) < 2:
        return None
    tail = 50.0 * (1.0 - level)
    return np.percentile(curves, [tail, 100.0 - tail], axis=0)


def _power(coef, k, x):
    return coef * np.power(x, k)


def _span(values, pad: float = 1.3) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return np.geomspace(values.min() / pad, values.max() * pad, CURVE_POINTS)


def _errbar(ax, x, y, ci, color, used: bool):
    """One minimum: filled with its interval when used by the laws, open when left out."""
    err = None
    if ci is not None:
        err = np.array([[max(y - ci[0], 0.0)], [max(ci[1] - y, 0.0)]])
    ax.errorbar([x], [y], yerr=err, fmt="o", ms=5, color=color, capsize=2, lw=1,
                mfc=color if used else "white", zorder=3)


def _legend(ax, loc: str):
    if ax.get_legend_handles_labels()[0]:  # matplotlib warns about an empty legend
        ax.legend(loc=loc)


def _loglog(ax, xlabel: str, ylabel: str, plain_y: bool = False):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if not np.isfinite(ax.dataLim.bounds).all():  # nothing plotted; log scale would fail
        ax.text(0.5, 0.5, "no budget minimum to show", ha="center", transform=ax.transAxes)
        return
    ax.set_xscale("log")
    ax.set_yscale("log")
    if plain_y:
        # Losses span well under a decade: label them 2.5, 3, 4 rather than 3x10^0.
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))


# --- (1) IsoFLOP curves -------------------------------------------------------------------

def _budget_curve(x: np.ndarray, loss: np.ndarray, m: iso.BudgetMinimum):
    """The curve isoflop.find_minimum minimised for this budget (it keeps only the minimum,
    so it is redrawn here with the same parabola or smoothing spline)."""
    sizes, inverse = np.unique(x, return_inverse=True)
    if sizes.size < 3:
        return None
    if m.method == "spline":
        mean = np.bincount(inverse, weights=loss) / np.bincount(inverse)
        grid = np.linspace(sizes[0], sizes[-1], CURVE_POINTS)
        return grid, make_smoothing_spline(sizes, mean)(grid)
    lo, hi = sizes[0], sizes[-1]
    if math.isfinite(m.tokens_opt):  # reach out to an edge vertex, but not arbitrarily far
        x_opt = math.log(m.params_opt)
        lo = min(lo, max(x_opt, lo - 0.3 * (hi - lo)))
        hi = max(hi, min(x_opt, hi + 0.3 * (hi - lo)))
    grid = np.linspace(lo, hi, CURVE_POINTS)
    return grid, np.polyval(np.polyfit(x, loss, 2), grid)


def isoflop_figure(result: FitResult) -> Figure:
    fams = _families(result)
    ncols = min(len(fams), 2 if len(fams) <= 4 else 3)
    nrows = math.ceil(len(fams) / ncols)
    budgets = np.unique(np.concatenate([f.budgets for f in fams]))
    fig = Figure(figsize=(max(5.2 * ncols, 7.0) + (budgets.size > 8), 3.8 * nrows + 0.6),
                 layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    norm = LogNorm(budgets.min() / 1.01, budgets.max() * 1.01)
    # viridis without its pale yellow end, which vanishes on white
    cmap = ListedColormap(matplotlib.colormaps["viridis"](np.linspace(0.0, 0.88, 256)))

    def color(b):
        return cmap(norm(b))

    for ax, fam in zip(axes.flat, fams):
        for m in fam.fit.isoflop.minima:
            sel = fam.budgets == m.budget
            c = color(m.budget)
            ax.scatter(fam.params[sel], fam.loss[sel], s=12, color=c, alpha=0.85, lw=0)
            curve = _budget_curve(np.log(fam.params[sel]), fam.loss[sel], m)
            if curve is not None:
                ax.plot(np.exp(curve[0]), curve[1], color=c, lw=1.1,
                        ls="-" if m.used else "--")
            if not math.isfinite(m.tokens_opt):
                continue  # no minimum (under 3 sizes, not convex): the points say enough
            if m.used:
                ax.scatter([m.params_opt], [m.loss_opt], marker="*", s=130, color=c,
                           edgecolors="black", linewidths=0.6, zorder=4)
            else:
                ax.scatter([m.params_opt], [m.loss_opt], marker="o", s=55, facecolors="none",
                           edgecolors="red", linewidths=1.4, zorder=4)
        ax.set_xscale("log")
        ax.set_title(f"{fam.fit.name} ({fam.fit.isoflop.method})", color=fam.color,
                     fontweight="bold")
        ax.set_xlabel(f"parameters N ({result.table.columns.params})")
        ax.set_ylabel("loss")
    for ax in axes.flat[len(fams):]:
        ax.set_visible(False)

    keys = [Line2D([], [], marker="*", ms=11, ls="", color="grey", mec="black",
                   label="minimum (used in the power laws)"),
            Line2D([], [], marker="o", ms=7, ls="--", color="grey", mfc="none", mec="red",
                   label="left out (edge / not convex)")]
    if budgets.size <= 8:
        keys += [Line2D([], [], color=color(b), marker="o", ms=4, label=f"C = {b:.2g}")
                 for b in budgets]
    else:  # a legend of dozens of budgets (e.g. the Chinchilla table) would drown the plot
        fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap),
                     ax=axes.ravel().tolist(), label="budget C (FLOPs)", shrink=0.8)
    fig.legend(handles=keys, loc="outside lower center", ncols=min(len(keys), 5))
    return fig


# --- (2) frontiers, (5) L_opt vs N_opt, (3) N_opt and D_opt -----------------------------

def _minima_and_law(ax, fam: _Family, x_of: str, y_of: str, coef: str, k: str, sign: float,
                    law: str, level: float) -> np.ndarray | None:
    """A family's budget minima (y_of against x_of, with y's interval) and the IsoFLOP law
    y = coef * x^(sign k) through them with its bootstrap band; the law's x grid, if any."""
    minima, laws = fam.fit.isoflop.minima, fam.fit.isoflop.laws
    for i, m in enumerate(minima):
        if math.isfinite(m.tokens_opt):
            _errbar(ax, getattr(m, x_of), getattr(m, y_of), fam.ci(i, y_of), fam.color, m.used)
    if laws is None:
        ax.plot([], [], "o", color=fam.color, label=f"{fam.fit.name}: no power law")
        return None
    x = _span([getattr(m, x_of) for m in minima if m.used])
    ci = None if fam.fit.isoflop_boot is None else fam.fit.isoflop_boot.interval(k)
    value = getattr(laws, k)
    ax.plot(x, _power(getattr(laws, coef), sign * value, x), color=fam.color, lw=1.6,
            label=f"{fam.fit.name}: {law} = {value:.3g}"
            + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]"))
    band = _band(fam.samples(coef, k), x, level, sign)
    if band is not None:
        ax.fill_between(x, band[0], band[1], color=fam.color, alpha=0.15, lw=0)
    return x


def _loss_law_figure(result: FitResult, x_of: str, coef: str, k: str, law: str,
                     xlabel: str, title: str) -> Figure:
    """L_opt against the minima's `x_of` (budget or params_opt), with L_opt = coef x^-k."""
    fig = Figure(figsize=(8.5, 5.5), layout="constrained")
    ax = fig.subplots()
    for fam in _families(result):
        x = _minima_and_law(ax, fam, x_of, "loss_opt", coef, k, -1.0, law,
                            result.options.level)
        laws = fam.fit.isoflop.laws
        if x is not None and x_of == "budget" and math.isfinite(laws.E):
            ax.plot(x, laws.E + laws.A_E * x ** -laws.alpha_E, color=fam.color, lw=1,
                    ls=":", label=f"{fam.fit.name}: E + A_E·C^-α_E, E = {laws.E:.3g}")
    _loglog(ax, xlabel, "loss at the IsoFLOP minimum  L_opt", plain_y=True)
    ax.set_title(title)
    _legend(ax, "upper right")
    return fig


def frontier_figure(result: FitResult) -> Figure:
    return _loss_law_figure(result, "budget", "A", "alpha", "L = A·C^-α, α",
                            "compute C (FLOPs)",
                            "Compute frontiers (bands: bootstrap interval of the pure power law)")


def loss_vs_params_figure(result: FitResult) -> Figure:
    return _loss_law_figure(
        result, "params_opt", "A_N", "alpha_N", "α_N",
        f"compute-optimal parameters N_opt ({result.table.columns.params})",
        "L_opt = A_N · N_opt^-α_N (the sparse-layers study's form)")


def allocation_figure(result: FitResult) -> Figure:
    fig = Figure(figsize=(10.5, 4.3), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (("params_opt", "a", "a_coef", "N_opt"), ("tokens_opt", "b", "b_coef", "D_opt"))
    for fam in _families(result):
        for side, (y_of, k, coef, _) in enumerate(panels):
            x = _minima_and_law(axes[side], fam, "budget", y_of, coef, k, 1.0, k,
                                result.options.level)
            if x is not None and fam.fit.parametric is not None:  # approach 3, to compare
                axes[side].plot(x, fam.fit.parametric.compute_optimal(x)[side],
                                color=fam.color, lw=1, ls=":")
    for ax, (_, k, _, label) in zip(axes, panels):
        _loglog(ax, "compute C (FLOPs)", label)
        ax.set_title(f"{label} = {k}_coef · C^{k}   (dotted: parametric fit)")
        _legend(ax, "upper left")
    return fig


# --- (4) residuals of the parametric fit ---------------------------------------------------

def residuals_figure(result: FitResult) -> Figure:
    fig = Figure(figsize=(10.5, 4.0), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    drawn = False
    for fam in _families(result):
        pfit = fam.fit.parametric
        if pfit is None:
            continue
        r = fam.loss / pfit.predict(fam.params, fam.tokens) - 1.0
        rms = float(np.sqrt(np.mean(r ** 2)))
        for ax, x in zip(axes, (fam.flops, fam.params)):
            ax.scatter(x, r, s=14, color=fam.color, alpha=0.75, lw=0,
                       label=f"{fam.fit.name} (rms {100 * rms:.2g}%)")
        drawn = True
    for ax, xlabel in zip(axes, ("compute C (FLOPs)",
                                 f"parameters N ({result.table.columns.params})")):
        ax.set_xlabel(xlabel)
        if not drawn:
            ax.text(0.5, 0.5, "no parametric fit", ha="center", transform=ax.transAxes)
            continue
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes[0].set_ylabel("observed / predicted − 1")
    axes[0].set_title("Residuals of L = E + A/N^α + B/D^β, against compute")
    axes[1].set_title("against parameters")
    if drawn:
        axes[0].legend(loc="best")
    return fig


# --- (6) the held-out prediction -----------------------------------------------------------

def holdout_figure(result: FitResult) -> Figure:
    """Per family: the training minima and the pure law fitted through them, extended to the
    held-out budget with its bootstrap band, and the held-out budget's own minimum."""
    fig = Figure(figsize=(8.5, 5.5), layout="constrained")
    ax = fig.subplots()
    level = result.options.level
    for fam, h in zip(_families(result), result.holdouts):
        if h is None:
            continue
        used = [m for m in h.train.minima if m.used]
        for m in used:
            ax.scatter([m.budget], [m.loss_opt], s=30, color=fam.color, zorder=3)
        laws = h.train.laws
        if laws is not None:
            x = np.geomspace(min(m.budget for m in used) / 1.3, h.budget * 1.3, CURVE_POINTS)
            ax.plot(x, _power(laws.A, -laws.alpha, x), color=fam.color, lw=1.5,
                    label=f"{fam.fit.name}: fitted on {len(used)} budgets")
            samples = None if h.boot is None else [h.boot.samples[k] for k in ("A", "alpha")]
            band = _band(samples, x, level, -1.0)
            if band is not None:
                ax.fill_between(x, band[0], band[1], color=fam.color, alpha=0.15, lw=0)
        if h.observed.used:
            ci = None if h.boot is None else h.boot.interval("observed_loss")
            ax.scatter([h.budget], [h.observed.loss_opt], marker="*", s=160, color=fam.color,
                       edgecolors="black", linewidths=0.7, zorder=4)
            if ci is not None:
                ax.errorbar([h.budget], [h.observed.loss_opt], color=fam.color, capsize=3,
                            yerr=[[max(h.observed.loss_opt - ci[0], 0)],
                                  [max(ci[1] - h.observed.loss_opt, 0)]], fmt="none")
    if result.holdout_budget is not None:
        ax.axvline(result.holdout_budget, color="grey", lw=0.8, ls="--")
    _loglog(ax, "compute C (FLOPs)", "loss at the IsoFLOP minimum  L_opt", plain_y=True)
    ax.set_title("Held-out budget: the law fitted below it, its prediction band, the observed "
                 "minimum (star)")
    _legend(ax, "upper right")
    return fig


def figures_for(result: FitResult) -> tuple:
    """FIGURES, with the held-out figure when the fit ran a held-out check."""
    return FIGURES + ((HOLDOUT_FIGURE,) if result.holdout_budget is not None else ())


# (stem, title, caption, function): the report shows them in this order.
FIGURES = (
    ("isoflop", "IsoFLOP curves",
     "Loss against parameters per budget, with the fitted curve; stars mark the minima used "
     "in the power laws, open red circles minima left out (edge of the size grid or not "
     "convex), whose curves are dashed.", isoflop_figure),
    ("frontiers", "Compute frontiers",
     "Loss at each budget's minimum against compute, per family, with the pure power law "
     "L = A·C^-α (band: bootstrap interval) and the saturating law (dotted). Open markers: "
     "minima left out of the fits.", frontier_figure),
    ("allocation", "Compute-optimal parameters and tokens",
     "N_opt and D_opt against compute with their IsoFLOP power laws and bootstrap bands; "
     "dotted lines are the parametric fit's allocation.", allocation_figure),
    ("residuals", "Residuals of the parametric fit",
     "Observed over predicted loss minus one for every fitted run.", residuals_figure),
    ("loss_vs_params", "L_opt against N_opt",
     "The sparse-layers study's law L_opt = A_N N_opt^-α_N through the budget minima, with "
     "bootstrap bands.", loss_vs_params_figure),
)
HOLDOUT_FIGURE = (
    "holdout", "Held-out prediction",
    "Minima of the budgets below the held-out one (dots) with the pure power law fitted through "
    "them, extended to the held-out budget (dashed line) with its bootstrap band; the star is "
    "the held-out budget's own minimum with its interval.", holdout_figure)
