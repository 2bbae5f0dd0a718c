"""One family's fitted runs as the arrays every fit reads (`FamilyRuns`), with the budget of
each run (the table's budget column, else isoflop's grouping of its compute) and its bootstrap
cluster (bootstrap.py). fit.py, holdout.py and plots.py all take a family's runs from here, so
they group budgets and clusters the same way."""

from __future__ import annotations

import dataclasses

import numpy as np

from loopscale.scaling import table as tbl
from loopscale.scaling.budget_minima import assign_budgets


@dataclasses.dataclass(frozen=True)
class FamilyRuns:
    name: str
    params: np.ndarray  # N, the table's chosen parameter count
    tokens: np.ndarray  # D
    loss: np.ndarray  # L
    flops: np.ndarray  # C as the fit takes it (the flops column, or 6 N D)
    unique: np.ndarray | None  # params_unique, when the table has it
    budgets: np.ndarray  # the IsoFLOP budget of each run
    clusters: np.ndarray  # the bootstrap cluster of each run
    flops_attn: np.ndarray | None  # the compute under 6n_attn, when the table has it

    @property
    def n_runs(self) -> int:
        return int(self.params.size)

    def where(self, keep: np.ndarray) -> FamilyRuns:
        """The runs selected by a boolean mask or index array."""
        def cut(v):
            return None if v is None else v[keep]

        return dataclasses.replace(
            self, params=self.params[keep], tokens=self.tokens[keep], loss=self.loss[keep],
            flops=self.flops[keep], unique=cut(self.unique), budgets=self.budgets[keep],
            clusters=self.clusters[keep], flops_attn=cut(self.flops_attn))


def family_runs(table: tbl.ResultsTable, name: str,
                budget_tolerance: float) -> FamilyRuns:
    runs = table.family(name)

    def column(c: str) -> np.ndarray:
        return runs[c].to_numpy(dtype=float)

    flops = column(tbl.FLOPS)
    budgets = (column(tbl.BUDGET) if table.has_budget
               else assign_budgets(flops, budget_tolerance))
    return FamilyRuns(
        name=name, params=column(tbl.PARAMS), tokens=column(tbl.TOKENS), loss=column(tbl.LOSS),
        flops=flops, unique=column(tbl.UNIQUE) if table.has_unique else None, budgets=budgets,
        clusters=runs[tbl.CLUSTER].to_numpy(),
        flops_attn=column(tbl.FLOPS_ATTN) if table.has_flops_attn else None)
