"""The sweep planner: budgets met, sizes around the optimum, stable run ids that the launched
command reproduces, every shipped sweep file plans, and bad sweeps fail in one line."""

import csv
import dataclasses
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from loopscale import flops
from loopscale.config import GradReduction, load_config, parse
from loopscale.errors import UsageError
from loopscale.files import to_json
from loopscale.sweep import base_sweep, load_sweep, parse_sweep
from loopscale.sweep.plan import HASH_NEUTRAL, config_hash, plan
from loopscale.sweep.plan_table import PLAN_COLUMNS
from loopscale.sweep.schema import ShapeKind

ISOFLOP = ["sweeps/isoflop_paper.py", "sweeps/isoflop_cpu.py", "sweeps/isoflop_cpu.py:full"]
FAMILIES = {"sweeps/isoflop_paper.py": 4, "sweeps/isoflop_cpu.py": 2,  # Base and Looped-MoE
            "sweeps/isoflop_cpu.py:full": 4}


@pytest.fixture(scope="module")
def plans():
    return {spec: plan(load_sweep(spec)) for spec in ISOFLOP}


@pytest.mark.parametrize("spec", ISOFLOP)
def test_every_run_spends_its_budget(plans, spec):
    result = plans[spec]
    assert result.runs
    for run in result.runs:
        row = run.row
        if row["role"] == "trunk":  # no budget of its own: its branches spend the budgets
            assert run.budget is None and row["flops_spent"] == row["flops"]
            continue
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
    # Its families, the same muP LR at every width.
    assert len({r.family for r in result.runs}) == FAMILIES[spec]
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
    job = run.job("runs/x")
    config = parse(load_config(job.experiment, job.overrides))
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
    if path.endswith("recurrence.py"):
        assert_recurrence_plan(result.runs, widths=(24, 32), budgets=(6e10, 2e11, 6e11))


def assert_recurrence_plan(runs, widths, budgets):
    """One backbone (prelude 1, core 2, coda 1) at r = 1, 2, 4, and the unique-layer baseline
    at r = 4's depth, at every budget, each at a fixed loop count with full backpropagation;
    the runs carry what the recurrence law fits (distinct (N_once, N_rec, r), several D)."""
    shapes = {(r.config.model.n_prelude, r.config.model.n_unique, r.config.model.n_coda,
               r.config.model.n_loops) for r in runs}
    assert shapes == {(1, 2, 1, 1), (1, 2, 1, 2), (1, 2, 1, 4), (1, 8, 1, 1)}
    assert {r.config.train.loop_dist.value for r in runs} == {"fixed"}
    assert {r.config.train.bptt_loops for r in runs} == {0}
    assert {r.config.model.d_model for r in runs} == set(widths)
    for budget in budgets:
        assert {r.family for r in runs if r.budget == budget} == {"r1", "r2", "r4", "unique"}
    points = {(flops.param_counts(r.config.model)["params_once"],
               flops.param_counts(r.config.model)["params_rec"], r.config.model.n_loops)
              for r in runs}
    assert len(points) == 4 * len(widths)


def test_recurrence_paper_sweep_is_the_same_design_at_scale():
    result = plan(load_sweep("sweeps/recurrence.py:paper"))
    assert_recurrence_plan(result.runs, widths=(1024,), budgets=(1e18, 3e18, 1e19))
    assert {r.config.model.vocab_size for r in result.runs} == {50257}
    assert {r.config.model.injection.value for r in result.runs} == {"concat"}


def test_permutation_paper_is_looped_4x8_against_32_unshared():
    result = plan(load_sweep("sweeps/permutation.py:paper"))
    shapes = {(r.config.model.n_unique, r.config.model.n_loops) for r in result.runs}
    assert shapes == {(4, 8), (32, 1)}
    assert len(result.runs) == 2 * 3 * 3 * 2  # families x seeds x lrs x supervision


def test_a_budget_no_shape_meets_is_an_error():
    with pytest.raises(UsageError, match=r"budget 1e\+06 cannot be met by any shape of family"):
        plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.budgets=(1e6,)"]))


@pytest.mark.parametrize("overrides, message", [
    ("--sweep.shape.head_dim=0 --sweep.shape.n_heads=3", "not a multiple of shape.n_heads=3"),
    ("--sweep.shape.head_dim=3", "not a multiple of the head size 3"),
    ("--sweep.shape.n_heads=2", "head_dim and shape.n_heads are exclusive"),
    ("--sweep.shape.ffn_ratio=-1", "shape.ffn_ratio must be >= 0"),
    ("--sweep.shape.kind=family", "shape.ffn_ratio applies to shape.kind=width only"),
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


def test_ffn_ratio_keeps_the_ffn_a_fixed_multiple_of_the_width(plans):
    # The family rule would round d_ff up to a multiple of 64 (64 for every d <= 24); the
    # ratio gives round(8/3 d) at every width, and MoE experts d_ff // top_k.
    runs = plans["sweeps/isoflop_cpu.py"].runs
    for r in runs:
        m = r.config.model
        assert m.d_ff == round(8 / 3 * m.d_model) and m.head_dim == 4
        assert m.n_heads == m.d_model // 4
        if r.family == "looped_moe":
            assert m.expert_width == m.d_ff // m.top_k
    assert {r.config.model.d_ff for r in runs if r.config.model.d_model <= 24} == {21, 32, 43, 53, 64}
    fixed = load_config("sweeps/isoflop_cpu.py", flag="sweep")
    fixed.families.looped_moe.overrides = {"model": {"expert_d_ff": 16}}
    with pytest.raises(UsageError, match="family looped_moe fixes model.expert_d_ff=16"):
        plan(parse_sweep(fixed, sweep_file="sweeps/isoflop_cpu.py"))


def test_flop_convention_of_the_sweep_moves_the_plan():
    emb = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"]))
    attn = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base",
                                                     "--sweep.flop_convention=6n_attn"]))
    assert {r.config.flop_convention.value for r in attn.runs} == {"6n_attn"}
    first = lambda p: next(r.row for r in p.runs if r.row["d_model"] == 20)  # noqa: E731
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
    assert {row["chips"] for row in rows} == {""}  # no --topology: nothing compiled
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


# --- base_sweep: every default in one place; sweep files set what they choose. ---

BASE_FAMILY = {"base": {"experiment": "experiments/base.py:tiny", "overrides": {}}}


def test_base_sweep_defaults_parse_once_named_and_given_a_family():
    with pytest.raises(UsageError, match="at least one family"):
        parse_sweep(base_sweep())  # name and families have no default
    s = base_sweep()
    s.name, s.families = "defaults", BASE_FAMILY
    sweep = parse_sweep(s)
    assert [f.name for f in sweep.families] == ["base"] and sweep.overrides == ()
    assert sweep.shape.kind is ShapeKind.FAMILY and sweep.shape.widths == ()
    assert sweep.flop_convention is None and sweep.budgets == () and sweep.lrs == ()
    assert sweep.seeds == (0,) and sweep.grid == ()
    assert (sweep.steps, sweep.batch_size, sweep.seq_len, sweep.evals) == (0, 0, 0, 0)
    assert sweep.warmup_frac < 0  # every run keeps its family's own settings
    runs = plan(sweep).runs
    assert len(runs) == 1 and runs[0].config == parse(load_config("experiments/base.py:tiny"))


def test_a_sweep_file_setting_a_few_fields(tmp_path):
    path = tmp_path / "few.py"
    path.write_text(
        "from loopscale.sweep import base_sweep\n\n"
        "def get_config(arg=None):\n"
        "    s = base_sweep()\n"
        "    s.name = 'few'\n"
        f"    s.families = {BASE_FAMILY!r}\n"
        "    s.seeds, s.steps = (0, 1), 7\n"
        "    return s\n")
    runs = plan(load_sweep(str(path))).runs
    assert [r.config.seed for r in runs] == [0, 1]
    assert {r.config.train.steps for r in runs} == {7}
    base = parse(load_config("experiments/base.py:tiny"))
    assert {r.config.model for r in runs} == {base.model}  # the rest is the family's


@pytest.mark.parametrize("typo, message", [
    ("s.seed = (1,)", "unknown sweep field seed"),
    ("s.shape.widht = (8,)", "unknown sweep field shape.widht"),
    ("s.families.base.overide = {}", "unknown sweep field families.base.overide"),
])
def test_a_typo_in_a_sweep_file_is_refused(tmp_path, typo, message):
    path = tmp_path / "typo.py"
    path.write_text(
        "from loopscale.sweep import base_sweep\n\n"
        "def get_config(arg=None):\n"
        "    s = base_sweep()\n"
        "    s.name = 'typo'\n"
        f"    s.families = {BASE_FAMILY!r}\n"
        f"    {typo}\n"
        "    return s\n")
    with pytest.raises(UsageError, match=message):
        load_sweep(str(path))


# --- Packing runs onto a TPU slice (packing.py, sizing.py, `plan --topology`). ---


def test_slices_and_their_hosts():
    from loopscale.sweep.packing import parse_slice, slots

    for name, chips, hosts, per_host in [("v5p-128", 64, 16, 4), ("v5p-8", 4, 1, 4),
                                         ("v5p-2", 1, 1, 1), ("v5litepod-8", 8, 1, 8),
                                         ("v6e-256", 256, 64, 4)]:
        slc = parse_slice(name)
        assert (slc.chips, slc.hosts, slc.chips_per_host) == (chips, hosts, per_host), name
    slc = parse_slice("v5p-128")
    assert slc.topology_name(1) == "v5p-2" and slc.topology_name(4) == "v5p-8"
    pairs = slots(slc, 2)
    assert len(pairs) == 32
    assert [(b.worker, b.chips, b.port, b.bounds) for b in pairs[:3]] == [
        (0, (0, 1), 8476, "1,2,1"), (0, (2, 3), 8477, "1,2,1"), (1, (0, 1), 8476, "1,2,1")]
    assert [b.chips for b in slots(slc, 4)[:2]] == [(0, 1, 2, 3), (0, 1, 2, 3)]
    assert {b.worker for b in slots(slc, 4)} == set(range(16))


def _needs():
    """On v5p-16 (2 hosts of 4 chips): nine 1-chip runs, six 2-chip runs, one 8-chip run;
    on the whole slice each would take its chip-seconds / 8."""
    from loopscale.sweep.packing import Need

    one = [30, 90, 10, 70, 50, 80, 20, 60, 40]
    two = [40, 100, 40, 30, 40, 40]
    return ([Need(f"a{i}", 1, s, s / 8) for i, s in enumerate(one)]
            + [Need(f"b{i}", 2, s, s * 2 / 8) for i, s in enumerate(two)]
            + [Need("c0", 8, 50.0, 50.0)])


def test_phases_pack_by_chip_count_longest_first():
    from loopscale.sweep.packing import parse_slice, phases

    got = phases(parse_slice("v5p-16"), _needs())
    assert [p.size for p in got] == [1, 2, None]
    assert got[0].run_ids == ("a1", "a5", "a3", "a7", "a4", "a8", "a0", "a6", "a2")
    assert got[1].run_ids == ("b1", "b0", "b2", "b4", "b5", "b3")  # ties keep plan order
    assert got[2].run_ids == ("c0",)


def test_wall_time_arithmetic():
    from loopscale.sweep.packing import Need, packed_wall_time, parse_slice, serial_wall_time

    slc, needs = parse_slice("v5p-16"), _needs()
    # No start-up. 1 chip: 8 slots take 90..20 at once, 10 s follows the 20 s: 90 s.
    # 2 chips: 4 slots take 100, 40, 40, 40; 40 and 30 follow at 40 s: 100 s. Then 50 s.
    assert packed_wall_time(slc, needs, 0).seconds == 90 + 100 + 50
    # 5 s start-up a run: 95 (the 10 s run starts at 25 and ends at 40); 105 (the last two
    # start at 45 and end at 90 and 80); 55.
    assert packed_wall_time(slc, needs, 5).seconds == 95 + 105 + 55
    # One at a time: the chip-seconds over 8 chips, plus 16 start-ups.
    assert serial_wall_time(slc, needs, 0).seconds == pytest.approx((450 + 2 * 290 + 400) / 8)
    assert serial_wall_time(slc, needs, 5).seconds == pytest.approx(178.75 + 16 * 5)
    # A batch that cannot split over all 8 chips: no one-at-a-time estimate, packing unaffected.
    odd = needs + [Need("d0", 1, 10.0, None)]
    assert serial_wall_time(slc, odd, 5).seconds is None
    assert "1 run(s) cannot split their batch over all 8 chips" in serial_wall_time(
        slc, odd, 5).problem
    assert packed_wall_time(slc, odd, 0).seconds == 90 + 100 + 50
    # A run that fits nowhere: neither schedule can finish the sweep.
    nowhere = needs + [Need("e0", None, None, None)]
    assert packed_wall_time(slc, nowhere, 0).seconds is None
    assert "cannot fit on" in serial_wall_time(slc, nowhere, 0).problem


def test_runs_differing_in_schedule_share_a_compiled_shape():
    from loopscale.sweep.sizing import shape_key

    runs = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base",
                                                     "--sweep.seeds=(0,1)"])).runs
    keys = {}
    for run in runs:  # the same width at several budgets and seeds: other steps, seed
        keys.setdefault(run.config.model.d_model, set()).add(shape_key(run.config))
    assert all(len(k) == 1 for k in keys.values())
    assert len(set.union(*keys.values())) == len(keys)


def test_plan_with_a_topology_compiles_each_shape_once(tmp_path):
    """Two seeds of one width on v5p-8: one compiled shape, chips and step time per run, and
    the wall-time estimates (each run's steps take milliseconds, so start-ups dominate)."""
    out = tmp_path / "plan.csv"
    r = subprocess.run([sys.executable, "-m", "loopscale.cli", "plan",
                        "--sweep=sweeps/isoflop_cpu.py", "--sweep.select=base",
                        "--sweep.budgets=(1e11,)", "--sweep.shape.sizes=1", "--sweep.seeds=(0,1)",
                        "--topology=v5p-8", f"--out={out}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "shape 1/1 (base d_model=" in r.stderr and "2 run(s)): 1 chip(s)" in r.stderr
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(PLAN_COLUMNS) and len(rows) == 2
    for row in rows:
        assert row["chips"] == "1"
        step = float(row["est_step_time_s"])
        assert 0 < step < 0.1
        assert float(row["est_device_hours"]) == pytest.approx(int(row["steps"]) * step / 3600)
    assert ("estimated wall time on v5p-8 (4 chips, 1 host(s) of 4; 2 on 1 chip(s)): "
            "packed 2 min, one run at a time on all chips 4 min") in r.stdout


def test_unusable_xla_step_times_fall_back_to_the_analytic_estimate():
    from loopscale.sweep.packing import parse_slice
    from loopscale.sweep.sizing import ShapeFit, _step_times

    run = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])).runs[0]
    slc = parse_slice("v5p-16")
    assert _step_times(run, ShapeFit(2, 0.5, 0.2), slc) == (0.5, 0.2)
    assert _step_times(run, ShapeFit(2, 0.5, None, slice_splits=False), slc) == (0.5, None)
    assert _step_times(run, ShapeFit(None, None, None, False, "too big"), slc) == (None, None)
    # A negative or missing XLA time: the plan's device time, spread over 2 or 8 chips.
    per_step = run.row["est_device_hours"] * 3600 / run.config.train.steps
    for bad in (ShapeFit(2, -62.9, 0.2), ShapeFit(2, 0.5, None), ShapeFit(2, None, None)):
        assert _step_times(run, bad, slc) == pytest.approx((per_step / 2, per_step / 8))


def test_a_changed_trunk_takes_its_branches_along():
    """sizing.with_overrides: a run given more overrides is resolved again under a new id, and
    each branch of a trunk that changed points at the trunk's new id (so changes too)."""
    from loopscale.sweep.sizing import with_overrides

    runs = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])).runs
    trunk = next(r for r in runs if r.row["role"] == "trunk")
    branches = [r for r in runs if r.row["branch_of"] == trunk.run_id]
    assert branches
    changed = {r.run_id: r for r in with_overrides(runs, {trunk.run_id: (
        ("train.grad_accum", 2),)})}
    new_trunk = next(r for r in changed.values() if r.row["role"] == "trunk"
                     and r.config.model.d_model == trunk.config.model.d_model)
    assert new_trunk.run_id != trunk.run_id and trunk.run_id not in changed
    assert new_trunk.config.train.grad_accum == 2 and new_trunk.run_id == config_hash(
        new_trunk.config)
    assert "--config.train.grad_accum=2" in new_trunk.row["overrides"]
    for branch in branches:
        assert branch.run_id not in changed
    moved = [r for r in changed.values() if r.row["branch_of"] == new_trunk.run_id]
    assert len(moved) == len(branches)
    assert all(r.config.train.grad_accum == 1 for r in moved)  # only what was asked
    untouched = [r for r in runs if r.run_id in changed]
    assert len(untouched) == len(runs) - 1 - len(branches)


@pytest.fixture
def least_effort():
    """libtpu's least optimisation effort: what the test compares (a step whole and in halves,
    against a capacity set from them) is the batch's, and these compile faster
    (tests/test_weak_scaling.py says more)."""
    import jax

    jax.config.update("jax_exec_time_optimization_effort", -1.0)
    try:
        yield
    finally:
        jax.config.update("jax_exec_time_optimization_effort", 0.0)


def test_a_step_too_big_for_one_host_is_planned_in_micro_batches(monkeypatch, least_effort):
    """Compiled for v5p on one chip, a chip whose HBM is set between what the step needs with
    its whole batch and with half of it (tiny shapes standing for a paper-size one; the memory
    figures are libtpu's own): sizing gives the runs 2 micro-batches a step (new run ids, the
    overrides say so, a note says why), times that step, and keeps the need without them (none
    here: the whole batch fits nowhere on this slice)."""
    from loopscale.aot import compile as aot
    from loopscale.commands.plan import wall_time_lines
    from loopscale.sweep import packing, sizing
    from loopscale.sweep.sizing import with_overrides
    from loopscale.sweep.plan_table import Plan

    sweep = load_sweep("sweeps/isoflop_cpu.py", [
        "--sweep.select=base", "--sweep.budgets=(1e11,)", "--sweep.shape.sizes=1",
        "--sweep.seeds=(0,1)"])
    planned = plan(sweep)
    bigger = (("train.batch_size", 32), ("train.seq_len", 128))
    runs = Plan(sweep, with_overrides(planned.runs, {r.run_id: bigger for r in planned.runs}),
                ())
    config = runs.runs[0].config
    target = aot.tpu_target("v5p-2")

    def total(accum):
        train = dataclasses.replace(config.train, grad_accum=accum)
        c = dataclasses.replace(config, train=train)
        return aot.report(c, target, "train", cost=False)["memory_per_chip"]["total"]

    whole, halves = total(1), total(2)
    assert halves < 0.7 * whole  # activations, which micro-batches shrink, dominate
    real = aot.tpu_target
    monkeypatch.setattr(aot, "tpu_target", lambda name: dataclasses.replace(
        real(name), hbm_bytes=(whole + halves) / 2))
    sized = sizing.size_plan(runs, packing.parse_slice("v5p-2"))
    assert len(sized.plan.runs) == 2
    for before, after in zip(runs.runs, sized.plan.runs):
        assert after.config.train.grad_accum == 2 and after.run_id != before.run_id
        assert "--config.train.grad_accum=2" in after.row["overrides"]
        assert after.row["chips"] == 1 and after.row["est_step_time_s"] > 0
    assert [n.chips for n in sized.needs] == [1, 1]
    # At their own accumulation they fit nowhere: the slice is one chip.
    assert [n.chips for n in sized.unpacked] == [None, None]
    assert any("in 2 micro-batches of 16 sequences" in note for note in sized.plan.notes)
    lines = wall_time_lines(sized, 0)
    assert len(lines) == 3 and lines[0].startswith("estimated wall time on v5p-2")
    assert lines[2].startswith("  (2 run(s) planned in micro-batches to fit one host; each at "
                               "its own train.grad_accum instead: packed n/a")


# --- From any directory: experiment paths and the demo's sweep are found in the checkout. ---

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plan_from_another_directory_plans_the_same_runs(plans, tmp_path, monkeypatch):
    from loopscale.cli import main
    from loopscale.sweep.plan_table import read_csv, write_csv

    write_csv(plans["sweeps/isoflop_cpu.py"].runs, str(tmp_path / "here.csv"))
    here = read_csv(str(tmp_path / "here.csv"))
    monkeypatch.chdir(tmp_path)
    assert main(["plan", f"--sweep={REPO}/sweeps/isoflop_cpu.py", "--out=there.csv"]) == 0
    # The same runs; the experiments, found in the checkout and not the cwd, are planned (and
    # launched) as absolute paths.
    assert read_csv("there.csv") == [
        {**row, "experiment": os.path.join(REPO, row["experiment"])} for row in here]
    # A path found relative to the cwd is taken as it is, before the checkout's.
    (tmp_path / "experiments").mkdir()
    shutil.copy(f"{REPO}/experiments/base.py", tmp_path / "experiments")
    sweep = load_sweep(f"{REPO}/sweeps/isoflop_cpu.py", ["--sweep.select=base,looped"])
    assert [f.experiment for f in sweep.families] == [
        "experiments/base.py:tiny", os.path.join(REPO, "experiments/looped.py:tiny")]


def test_demo_finds_its_sweep_from_any_directory(tmp_path, monkeypatch, capsys):
    import loopscale
    from loopscale.cli import main
    from loopscale.checkout import demo_sweep as default_sweep

    monkeypatch.chdir(tmp_path)
    assert default_sweep() == os.path.join(REPO, "sweeps", "isoflop_cpu.py")
    r = subprocess.run([sys.executable, "-m", "loopscale.cli", "demo", "--help"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "--sweep" in r.stdout, r.stderr
    # Installed without the checkout (no sweeps/ beside the package): one line, exit 2.
    monkeypatch.setattr(loopscale, "__file__", str(tmp_path / "site" / "loopscale" / "__init__.py"))
    assert main(["demo", "--workdir=demo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --sweep=" in err[0], err
    assert not (tmp_path / "demo").exists()


def test_a_field_added_later_keeps_the_run_ids_planned_before_it():
    """Fields added after sweeps were first planned (model.n_prelude, model.n_coda, the loop
    schedule's), at the values that leave a run as it was, are left out of the hash, so a
    sweep planned before they existed keeps its ids; set otherwise, they change it."""
    config = parse(load_config("experiments/looped.py:tiny", []))
    tree = to_json(config)
    for section, name in HASH_NEUTRAL:
        del tree[section][name]
    before = hashlib.sha256(json.dumps(tree, sort_keys=True, separators=(",", ":")).encode())
    assert config_hash(config) == before.hexdigest()[:12]
    for section, field, value in [("model", "n_prelude", 1), ("model", "n_coda", 1),
                                  ("train", "bptt_loops", 1), ("train", "loop_max", 8),
                                  ("train", "grad_reduction", GradReduction.PER_USE)]:
        part = dataclasses.replace(getattr(config, section), **{field: value})
        assert config_hash(dataclasses.replace(config, **{section: part})) != config_hash(config)
