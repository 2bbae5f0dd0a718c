"""Scaling-law fits for `loopscale fit`: one job per module.

  table.py          read and validate the results table (one row per run)
  runs.py           one family's runs as arrays, with their budgets and bootstrap clusters
  isoflop.py        Chinchilla approach 2: the whole fit and its bootstrap, from
  budget_minima.py    the budgets and each budget's loss-optimal size, and
  frontier_laws.py    the power laws through those minima
  parametric.py     Chinchilla approach 3: L(N, D) = E + A/N^alpha + B/D^beta, Huber in log space
  bootstrap.py      the cluster bootstrap (trunks with their branches), percentile intervals,
                    and when a figure is not identified
  compare.py        families side by side, compute multiplier, unique-parameter savings
  holdout.py        leave the largest budget out, predict it, score the prediction
  recurrence.py     the iso-depth law L = E + A (N_once + r^phi N_rec)^-alpha + B D^-beta
  jsonable.py       fit.json's numbers as plain JSON
  fit.py            runs all of it per family and writes fit.json (its schema is documented there)
  plots.py, report.py, publish.py   the report's figures, pages and folder

This file imports none of them, so `from loopscale.scaling import FitError` stays cheap.
"""


class FitError(ValueError):
    """The data cannot support a fit (too few runs, budgets or distinct sizes). It is not a
    usage error: fit.json records the fit as skipped, with this message as the reason."""
