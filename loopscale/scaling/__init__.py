"""Scaling-law fits for `loopscale fit`: one job per module.

  table.py          read and validate the results table (one row per run)
  isoflop.py        Chinchilla approach 2: the whole fit and its bootstrap, from
  budget_minima.py    the budgets and each budget's loss-optimal size, and
  frontier_laws.py    the power laws through those minima
  parametric.py     Chinchilla approach 3: L(N, D) = E + A/N^alpha + B/D^beta, Huber in log space
  bootstrap.py      resampling runs with replacement, percentile intervals
  compare.py        families side by side, compute multiplier, unique-parameter savings
  fit.py            runs all of it per family and writes fit.json (its schema is documented there)

This file imports none of them, so `from loopscale.scaling import FitError` stays cheap.
"""


class FitError(ValueError):
    """The data cannot support a fit (too few runs, budgets or distinct sizes). It is not a
    usage error: fit.json records the fit as skipped, with this message as the reason."""
