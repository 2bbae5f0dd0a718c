"""The results table `loopscale fit` reads: one row per run, validated once into `ResultsTable`.

Columns (names are part of the command-line contract):
  params   parameter count to fit against (another column with `--params-column`, e.g.
           params_active, params_unique, params_effective)
  tokens   training tokens D (optional when flops is given: then D = C / (6 N), stated)
  loss     final loss L
  flops    training compute C (optional; else C = 6 * params * tokens, stated in fit.json)
  family   model family (optional; a table without it is one family named `all`)
  status   run status (optional; only `completed` rows are fitted, the rest are listed in
           fit.json `excluded` with their status)
  budget   nominal FLOP budget of the run's IsoFLOP curve (optional; else budgets are found by
           grouping flops, see isoflop.assign_budgets)
  params_unique  stored parameters (optional; used for the unique-parameter comparison)
  run_id   a name for the run (optional; `run`, `name` or `workdir` also serve), naming excluded
           rows and, with branch_of, the bootstrap's clusters
  branch_of  a cooldown branch's trunk run id (optional, empty for other runs): a trunk and its
           branches are one cluster of the bootstrap (bootstrap.py), any other run its own
  flops_6n_attn  (optional, from `collect`) the run's compute under the 6n_attn convention
           (6N plus the T x T attention matmuls), beside `flops` under the sweep's convention;
           the report refits the headline exponents against it
  params_once, params_rec, n_loops  (optional, from `collect`) the parameters used once, those
           inside the looped block, and the loop count: the recurrence law's inputs
           (recurrence.py); rows without them are fitted by everything else
  flop_convention  (optional, from `collect`) what `flops` counts (flops.py), written beside
           every exponent in fit.json
  params_rec_active, ffn  (optional, from `collect`) the looped block's parameters active per
           token and the FFN kind: the recurrence law fits dense and MoE backbones apart

A missing required column is a UsageError naming it (exit 2 on the command line); a row whose
numbers are missing, non-finite or not positive is excluded with the reason, not fitted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from etils import epath

from loopscale.errors import UsageError
from loopscale.scaling.bootstrap import cluster_labels

# Canonical column names of ResultsTable.runs.
RUN, FAMILY, PARAMS, TOKENS, FLOPS, LOSS, BUDGET, UNIQUE = (
    "run", "family", "params", "tokens", "flops", "loss", "budget", "params_unique")
CLUSTER = "cluster"  # the bootstrap's unit: branch_of when set, else the run (else the row)
PARAMS_ONCE, PARAMS_REC, N_LOOPS = "params_once", "params_rec", "n_loops"
PARAMS_REC_ACTIVE, FFN = "params_rec_active", "ffn"  # optional: tell MoE backbones from dense
FLOP_CONVENTION = "flop_convention"  # optional: the convention `flops` was counted under
RECURRENCE_COLUMNS = (PARAMS_ONCE, PARAMS_REC, N_LOOPS)
FLOPS_ATTN = "flops_6n_attn"  # the compute of the 6n_attn convention, when collect wrote it
ALL_FAMILY = "all"
_RUN_COLUMNS = ("run_id", "run", "name", "workdir")


@dataclasses.dataclass(frozen=True)
class Columns:
    """Which input column plays which role (the command's --*-column flags)."""

    params: str = "params"
    tokens: str = "tokens"
    loss: str = "loss"
    flops: str = "flops"
    family: str = "family"
    status: str = "status"
    budget: str = "budget"
    unique: str = "params_unique"
    branch_of: str = "branch_of"


@dataclasses.dataclass(frozen=True)
class Excluded:
    """A row that is not fitted, and why."""

    row: int  # 0-based data row of the input table
    run: str | None
    family: str | None
    status: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ResultsTable:
    """The fitted rows in canonical columns (see the module constants), indexed by input row."""

    runs: pd.DataFrame
    excluded: tuple[Excluded, ...]
    source: str
    n_rows: int
    columns: Columns
    flops_source: str  # how C was obtained, written to fit.json
    has_budget: bool
    has_unique: bool
    has_clusters: bool = False  # some run is a branch of a trunk (see CLUSTER)
    has_recurrence: bool = False  # params_once, params_rec and n_loops are columns
    has_flops_attn: bool = False  # FLOPS_ATTN is a column (a 6n_attn refit is possible)
    flop_conventions: tuple[str, ...] = ()  # the flop_convention column's values, if any

    @property
    def families(self) -> tuple[str, ...]:
        """Family names in order of first appearance (the order fit.json and tables use)."""
        return tuple(pd.unique(self.runs[FAMILY]))

    def family(self, name: str) -> pd.DataFrame:
        return self.runs[self.runs[FAMILY] == name]


def read_table(path: str, columns: Columns = Columns()) -> ResultsTable:
    """Reads a CSV or Parquet results table (local or gs://: pandas reads through fsspec) and
    validates it (UsageError if unusable)."""
    if not epath.Path(path).is_file():
        raise UsageError(f"no such table: {path}")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext in (".parquet", ".pq"):
            frame = pd.read_parquet(path)
        elif ext in (".csv", ".txt", ""):
            frame = pd.read_csv(path)
        elif ext == ".tsv":
            frame = pd.read_csv(path, sep="\t")
        else:
            raise UsageError(f"{path}: unknown table format {ext!r} (use .csv or .parquet)")
    except UsageError:
        raise
    except Exception as e:  # a parser error from pandas/pyarrow: one line, naming the file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{path}: cannot read table: {first}") from e
    return prepare_table(frame, columns, source=os.path.basename(path))


def prepare_table(frame: pd.DataFrame, columns: Columns = Columns(),
                  source: str = "table") -> ResultsTable:
    """Validates an in-memory table the same way read_table does."""
    _require(frame, columns.params, source, param_hint=True)
    # Tables that give compute but not tokens (e.g. Chinchilla's) imply D = C / (6 N).
    tokens_from_flops = columns.tokens not in frame.columns and columns.flops in frame.columns
    if not tokens_from_flops:
        _require(frame, columns.tokens, source)
    _require(frame, columns.loss, source)

    out = pd.DataFrame(index=pd.RangeIndex(len(frame)))
    run_col = next((c for c in _RUN_COLUMNS if c in frame.columns), None)
    out[RUN] = frame[run_col].astype(str).to_numpy() if run_col else None
    if run_col in ("run_id", "workdir"):  # identities: a repeat is one run counted twice
        counts = out[RUN].value_counts()
        if counts.iloc[0] > 1:
            raise UsageError(f"{source}: {run_col} {counts.index[0]} appears {counts.iloc[0]} "
                             "times (collected twice?); each run must be one row")
    if columns.family in frame.columns:
        fam = frame[columns.family]
        out[FAMILY] = np.where(fam.isna(), None, fam.astype(str)).tolist()
    else:
        out[FAMILY] = ALL_FAMILY
    out[PARAMS] = _numeric(frame[columns.params])
    out[LOSS] = _numeric(frame[columns.loss])
    has_flops = columns.flops in frame.columns
    if tokens_from_flops:
        out[FLOPS] = _numeric(frame[columns.flops])
        out[TOKENS] = out[FLOPS] / (6.0 * out[PARAMS])
        flops_source = f"column {columns.flops}; tokens = {columns.flops} / (6 * {columns.params})"
    elif has_flops:
        out[TOKENS] = _numeric(frame[columns.tokens])
        out[FLOPS] = _numeric(frame[columns.flops])
        flops_source = f"column {columns.flops}"
    else:
        out[TOKENS] = _numeric(frame[columns.tokens])
        out[FLOPS] = 6.0 * out[PARAMS] * out[TOKENS]
        flops_source = f"6*{columns.params}*{columns.tokens}"
    has_budget = columns.budget in frame.columns
    out[BUDGET] = _numeric(frame[columns.budget]) if has_budget else np.nan
    has_unique = columns.unique in frame.columns
    out[UNIQUE] = _numeric(frame[columns.unique]) if has_unique else np.nan
    out[CLUSTER], has_clusters = _clusters(frame, out[RUN], columns.branch_of)
    has_recurrence = all(c in frame.columns for c in RECURRENCE_COLUMNS)
    for c in RECURRENCE_COLUMNS:
        out[c] = _numeric(frame[c]) if has_recurrence else np.nan
    if PARAMS_REC_ACTIVE in frame.columns:
        out[PARAMS_REC_ACTIVE] = _numeric(frame[PARAMS_REC_ACTIVE])
    if FFN in frame.columns:
        out[FFN] = frame[FFN].astype(str).to_numpy()
    has_flops_attn = FLOPS_ATTN in frame.columns
    out[FLOPS_ATTN] = _numeric(frame[FLOPS_ATTN]) if has_flops_attn else np.nan
    status = frame[columns.status] if columns.status in frame.columns else None

    excluded, keep = [], []
    for i in range(len(out)):
        row = out.iloc[i]
        st = None if status is None or pd.isna(status.iloc[i]) else str(status.iloc[i]).strip()
        reason = _why_excluded(row, st, status is not None, has_budget, has_unique, columns)
        if reason is None:
            keep.append(i)
        else:
            excluded.append(Excluded(row=i, run=row[RUN], family=row[FAMILY], status=st,
                                     reason=reason))
    runs = out.iloc[keep].copy()
    conventions = ()
    if FLOP_CONVENTION in frame.columns:
        conventions = tuple(str(v) for v in pd.unique(frame[FLOP_CONVENTION].iloc[keep].dropna()))
    if runs.empty:
        raise UsageError(f"{source}: no row to fit ({len(excluded)} of {len(out)} rows excluded: "
                         f"{excluded[0].reason if excluded else 'the table is empty'})")
    return ResultsTable(runs=runs, excluded=tuple(excluded), source=source, n_rows=len(out),
                        columns=columns, flops_source=flops_source, has_budget=has_budget,
                        has_unique=has_unique, has_clusters=has_clusters,
                        has_recurrence=has_recurrence, has_flops_attn=has_flops_attn,
                        flop_conventions=conventions)


def _clusters(frame: pd.DataFrame, runs: pd.Series, branch_of: str) -> tuple[list, bool]:
    """Each row's bootstrap cluster (CLUSTER) and whether any run is a branch."""
    names = [f"row {i}" if r is None else r for i, r in enumerate(runs.tolist())]
    if branch_of not in frame.columns:
        return names, False
    trunks = [None if pd.isna(v) else str(v) for v in frame[branch_of].tolist()]
    return list(cluster_labels(names, trunks)), any(t not in (None, "") for t in trunks)


def _require(frame: pd.DataFrame, name: str, source: str, param_hint: bool = False) -> None:
    if name in frame.columns:
        return
    hint = ""
    if param_hint:
        # Tables from `collect` may carry several parameter counts and no plain `params`.
        options = [c for c in frame.columns if str(c).startswith("params")]
        if options:
            hint = f" (choose one with --params-column: {', '.join(map(str, options))})"
    raise UsageError(f"{source}: missing column '{name}'{hint}")


def _numeric(col: pd.Series) -> np.ndarray:
    # Unparseable entries become NaN and exclude their row, rather than failing the whole fit.
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)


def _why_excluded(row: Mapping[str, Any], status: str | None, has_status: bool,
                  has_budget: bool, has_unique: bool, columns: Columns) -> str | None:
    if has_status and status is None:
        return "status missing"
    if has_status and status.lower() != "completed":
        return f"status {status}"
    if row[FAMILY] is None:
        return "family missing"
    for key, name in ((PARAMS, columns.params), (TOKENS, columns.tokens), (LOSS, columns.loss),
                      (FLOPS, columns.flops)):
        value = row[key]
        if not (np.isfinite(value) and value > 0):
            return f"{name} is not a positive number ({value})"
    if has_budget and not (np.isfinite(row[BUDGET]) and row[BUDGET] > 0):
        return f"{columns.budget} is not a positive number ({row[BUDGET]})"
    if has_unique and not (np.isfinite(row[UNIQUE]) and row[UNIQUE] > 0):
        return f"{columns.unique} is not a positive number ({row[UNIQUE]})"
    return None
