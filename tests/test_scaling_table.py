"""Reading and validating the results table of `loopscale fit`."""

import numpy as np
import pandas as pd
import pytest

from loopscale.cli import main
from loopscale.errors import UsageError
from loopscale.scaling.table import Columns, prepare_table, read_table


def _frame(**extra):
    base = {"params": [1e6, 2e6, 4e6, 8e6], "tokens": [1e8, 5e7, 2.5e7, 1.25e7],
            "loss": [3.2, 3.1, 3.15, 3.3]}
    base.update(extra)
    return pd.DataFrame(base)


def test_missing_column_is_a_one_line_usage_error_naming_it():
    with pytest.raises(UsageError) as err:
        prepare_table(_frame().drop(columns=["tokens"]), source="r.csv")
    assert "'tokens'" in str(err.value) and "\n" not in str(err.value)


def test_missing_params_suggests_the_params_columns_present():
    frame = _frame(params_active=[1e6] * 4, params_unique=[5e5] * 4).drop(columns=["params"])
    with pytest.raises(UsageError, match=r"'params'.*--params-column.*params_active"):
        prepare_table(frame)


def test_only_completed_rows_are_fitted_and_the_rest_listed_with_their_status():
    table = prepare_table(_frame(status=["completed", "diverged", "failed", "completed"],
                                 run_id=["r0", "r1", "r2", "r3"]))
    assert list(table.runs.index) == [0, 3]
    assert [(e.row, e.run, e.status) for e in table.excluded] == [
        (1, "r1", "diverged"), (2, "r2", "failed")]
    assert table.excluded[0].reason == "status diverged"


def test_flops_default_to_6nd_and_a_table_without_family_is_all():
    table = prepare_table(_frame())
    np.testing.assert_allclose(table.runs["flops"], 6 * table.runs["params"] * table.runs["tokens"])
    assert table.flops_source == "6*params*tokens"
    assert table.families == ("all",)


def test_tokens_follow_from_flops_when_the_table_has_no_tokens():
    frame = _frame()
    frame["flops"] = 6 * frame["params"] * frame["tokens"] * 2  # D is then twice the column
    table = prepare_table(frame.drop(columns=["tokens"]))
    np.testing.assert_allclose(table.runs["tokens"], 2 * frame["tokens"])
    assert "tokens = flops / (6 * params)" in table.flops_source


def test_rows_with_unusable_numbers_are_excluded_with_the_reason():
    table = prepare_table(_frame(loss=[3.2, np.nan, 3.15, "oops"], params=[1e6, 2e6, -4e6, 8e6]))
    assert len(table.runs) == 1
    reasons = {e.row: e.reason for e in table.excluded}
    assert reasons[1].startswith("loss") and reasons[2].startswith("params")
    assert reasons[3].startswith("loss")


def test_parquet_with_another_params_column(tmp_path):
    path = tmp_path / "results.parquet"
    _frame(params_active=[1e6, 2e6, 3e6, 4e6], family=["a", "a", "b", "b"]).to_parquet(path)
    table = read_table(str(path), Columns(params="params_active"))
    np.testing.assert_allclose(table.runs["params"], [1e6, 2e6, 3e6, 4e6])
    assert table.flops_source == "6*params_active*tokens"
    assert table.families == ("a", "b")


def test_cli_exits_2_with_one_line_naming_the_missing_column(tmp_path, capsys):
    path = tmp_path / "r.csv"
    _frame().drop(columns=["loss"]).to_csv(path, index=False)
    assert main(["fit", str(path), f"--out={tmp_path / 'fit.json'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'loss'" in err
    assert not (tmp_path / "fit.json").exists()
