"""The sweep planner: budgets met, sizes around the optimum, stable run ids that the launched
command reproduces, every shipped sweep file plans, and bad sweeps fail in one line."""

import csv
import glob
import os
import subprocess
import sys

import pytest

from loopscale.config import load_config, parse
from loopscale.errors import UsageError
from loopscale.sweep import load_sweep
from loopscale.sweep.plan import PLAN_COLUMNS, config_hash, plan

ISOFLOP = ["sweeps/isoflop_paper.py", "sweeps/isoflop_cpu.py"]


@pytest.fixture(scope="module")
def plans():
    return {spec: plan(load_sweep(spec)) for spec in ISOFLOP}


@pytest.mark.parametrize("spec", ISOFLOP)
def test_every_run_spends_its_budget(plans, spec):
    result = plans[spec]
    assert result.runs
    for run in result.runs:
        row = run.row
        assert abs(row["flops"] / run.budget - 1) <= 0.05, (row["run_id"], row["flops_over_budget"])
        # flops is what the run will spend: steps x tokens per step x FLOPs per token.
        assert row["flops"] == pytest.approx(row["steps"] * row["batch_size"] * row["seq_len"]
                                             * row["flops_per_token"])
        assert row["tokens"] == row["steps"] * row["batch_size"] * row["seq_len"]
        assert row["est_device_hours"] > 0


@pytest.mark.parametrize("spec", ISOFLOP)
def test_each_budget_has_its_sizes_around_the_optimum(plans, spec):
    result = plans[spec]
    sweep = result.sweep
    assert sweep.shape.sizes >= 4  # enough for a parabola and a check of its curvature
    for budget in sweep.budgets:
        for family in sweep.families:
            rows = [r.row for r in result.runs if r.budget == budget and r.family == family.name]
            widths = sorted(r["d_model"] for r in rows)
            assert len(set(widths)) == sweep.shape.sizes, (budget, family.name, widths)
            # The expected optimum (tokens per parameter) lies inside the chosen sizes.
            ratios = [r["tokens"] / r["params"] for r in rows]
            target = sweep.shape.tokens_per_param
            assert min(ratios) < target * 2 and max(ratios) > target / 2
    # Four families, the same muP LR at every width.
    assert len({r.family for r in result.runs}) == 4
    assert len({r.row["lr"] for r in result.runs}) == 1


def test_run_ids_are_stable_and_reproduced_by_the_command(plans):
    again = plan(load_sweep("sweeps/isoflop_cpu.py"))
    first = plans["sweeps/isoflop_cpu.py"]
    assert [r.run_id for r in again.runs] == [r.run_id for r in first.runs]
    ids = [r.run_id for r in first.runs]
    assert len(set(ids)) == len(ids)
    # What the runner launches, `loopscale train --config=... --config.x=y`, resolves to the
    # planned config, hence to the same id.
    run = first.runs[7]
    args = run.config_args()
    config = parse(load_config(args[0].split("=", 1)[1], args[1:]))
    assert config == run.config and config_hash(config) == run.run_id
    # Any field that changes the run changes the id.
    other = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.seeds=(1,)"]))
    assert not {r.run_id for r in other.runs} & set(ids)


def test_ids_do_not_depend_on_the_process(tmp_path):
    code = ("from loopscale.sweep import load_sweep; from loopscale.sweep.plan import plan; "
            "print(' '.join(r.run_id for r in plan(load_sweep('sweeps/isoflop_cpu.py')).runs[:3]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    here = [r.run_id for r in plan(load_sweep("sweeps/isoflop_cpu.py")).runs[:3]]
    assert out.stdout.split() == here


@pytest.mark.parametrize("path", sorted(glob.glob("sweeps/*.py")))
def test_every_sweep_file_plans_and_documents_its_command(path):
    with open(path) as f:
        text = f.read()
    assert text.startswith('"""') and "loopscale " in text.split('"""')[1]
    result = plan(load_sweep(path))
    assert result.runs
    if path.endswith("flt_stability.py"):
        injections = {r.config.model.injection.value for r in result.runs}
        assert injections == {"none", "input", "attn_first", "fla", "flt"}
        assert {r.config.model.n_loops for r in result.runs} == {6, 9, 12}
    if path.endswith("permutation.py"):
        shapes = {(r.config.model.n_unique, r.config.model.n_loops) for r in result.runs}
        assert len(shapes) == 2
        assert {r.config.train.intermediate_supervision for r in result.runs} == {False, True}


def test_permutation_paper_is_looped_4x8_against_32_unshared():
    result = plan(load_sweep("sweeps/permutation.py:paper"))
    shapes = {(r.config.model.n_unique, r.config.model.n_loops) for r in result.runs}
    assert shapes == {(4, 8), (32, 1)}
    assert len(result.runs) == 2 * 3 * 3 * 2  # families x seeds x lrs x supervision


def test_a_budget_no_shape_meets_is_an_error():
    with pytest.raises(UsageError, match=r"budget 1e\+06 cannot be met by any shape of family"):
        plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.budgets=(1e6,)"]))


@pytest.mark.parametrize("overrides, message", [
    ("--sweep.shape.n_heads=3", "not a multiple of shape.n_heads=3"),
    ("--sweep.shape.n_heads=0 --sweep.shape.head_dim=4", "not a multiple of the head size 4"),
    ("--sweep.shape.head_dim=4", "head_dim and shape.n_heads are exclusive"),
    ("--sweep.select=base,nope", "no family 'nope'"),
    ("--sweep.shape.kind=ladder", "shape.kind='ladder' is not one of"),
    ("--sweep.budget_tolerance=1.5", "budget_tolerance"),
    ("--sweep.flop_convention=7n", "flop_convention='7n' is not one of"),
    ("--sweep.shape.params=params_x", "shape.params"),
    ("--sweep.seeds=()", "at least one seed"),
])
def test_bad_sweeps_fail_with_one_line(overrides, message):
    with pytest.raises(UsageError, match=message):
        plan(load_sweep("sweeps/isoflop_cpu.py", overrides.split()))


def test_flop_convention_of_the_sweep_moves_the_plan():
    emb = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"]))
    attn = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base",
                                                     "--sweep.flop_convention=6n_attn"]))
    assert {r.config.flop_convention.value for r in attn.runs} == {"6n_attn"}
    first = lambda p: next(r.row for r in p.runs if r.row["d_model"] == 8)  # noqa: E731
    assert first(attn)["flops_per_token"] > first(emb)["flops_per_token"]
    assert first(attn)["steps"] < first(emb)["steps"]


def test_plan_command_writes_the_table(tmp_path):
    out = tmp_path / "plan.csv"
    r = subprocess.run([sys.executable, "-m", "loopscale.cli", "plan",
                        "--sweep=sweeps/isoflop_cpu.py", "--sweep.select=base,looped_moe",
                        f"--out={out}", "--peak-flops=1e12", "--mfu=0.5"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:3] == ["run_id", "family", "budget"]
    assert set(PLAN_COLUMNS) <= set(rows[0])
    assert {row["family"] for row in rows} == {"base", "looped_moe"}
    sweep = load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base,looped_moe"])
    assert len(rows) == len(plan(sweep).runs) and f"{len(rows)} runs" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "loopscale.cli", "plan",
                          "--sweep=sweeps/isoflop_cpu.py", "--sweep.budgets=(1e6,)",
                          f"--out={tmp_path / 'bad.csv'}"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "cannot be met" in bad.stderr and not (tmp_path / "bad.csv").exists()


def test_config_overrides_reach_every_run_but_not_planned_fields():
    from loopscale.sweep.plan import parse_config_overrides

    sweep = load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])
    extra = parse_config_overrides(["--config.data.val_fraction=0.05", "--config.train.steps=7"])
    result = plan(sweep, config_overrides=extra)
    assert {r.config.data.val_fraction for r in result.runs} == {0.05}
    assert 7 not in {r.config.train.steps for r in result.runs}  # the budget sets the steps
    assert not {r.run_id for r in result.runs} & {r.run_id for r in plan(sweep).runs}
    with pytest.raises(UsageError, match="--config.a.b=value"):
        parse_config_overrides(["--config.data.val_fraction"])
