"""Cooldown branches (warmup-stable-decay): one constant-LR trunk per model size, checkpointed
at every budget's branch point, and a short cooldown from each. A branch must train exactly
what a standalone run with the same WSD schedule trains."""

import json
import re

import pandas as pd
import pytest
import trainkit

from loopscale.rundir.status import ExitCode
from loopscale.train.trainer import train

# A sweep's runs see one CPU device, as on a user's machine (conftest.py).
pytestmark = pytest.mark.usefixtures("runs_on_one_device")

WSD = {"train.schedule": "wsd", "train.decay_frac": 0.2, "train.cooldown": "sqrt",
       "train.min_lr_frac": 0.05, "train.warmup_steps": 2, "train.eval_every": 0,
       "train.checkpoint_every": 0}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(root / "text")), str(root / "cache")


def _losses(workdir):
    return {r["step"]: r["loss"] for r in trainkit.metric_rows(workdir) if "loss" in r}


def _summary(workdir):
    return json.loads((workdir / "summary.json").read_text())


@pytest.mark.slow
def test_a_branch_trains_what_a_standalone_wsd_run_trains(corpus, tmp_path):
    # Budgets of 5 and 10 steps with a 20% cooldown branch at steps 4 and 8 of one trunk.
    trunk = tmp_path / "trunk"
    cfg = trainkit.config("base", *corpus, **{**WSD, "train.schedule": "constant",
                                              "train.steps": 8, "train.keep_steps": (4, 8),
                                              "train.checkpoint_every": 1,
                                              "train.keep_checkpoints": 2})
    assert train(cfg, str(trunk)) == ExitCode.OK
    for steps, point in [(10, 8), (5, 4)]:
        alone, branch = tmp_path / f"alone{steps}", tmp_path / f"branch{steps}"
        assert train(trainkit.config("base", *corpus, **{**WSD, "train.steps": steps}),
                     str(alone)) == ExitCode.OK
        assert train(trainkit.config("base", *corpus, **{
            **WSD, "train.steps": steps, "train.branch_from": "trunk",
            "train.branch_step": point}), str(branch)) == ExitCode.OK
        expected = _losses(alone)
        assert _losses(branch) == {k: v for k, v in expected.items() if k > point}  # bit for bit
        assert {k: v for k, v in _losses(trunk).items() if k <= point} == \
            {k: v for k, v in expected.items() if k <= point}
        a, b = _summary(alone), _summary(branch)
        assert b["final_eval_loss"] == a["final_eval_loss"]
        # The branch's point on the IsoFLOP grid spends the whole budget (trunk steps included).
        assert b["steps"] == a["steps"] == steps and b["flops"] == a["flops"]
        assert b["unigram_entropy"] == pytest.approx(a["unigram_entropy"], rel=1e-12)
    # The trunk checkpointed every step and kept the newest two, and the branch points.
    assert sorted(int(p.name) for p in (trunk / "checkpoints").iterdir()) == [4, 7, 8]


def test_a_branch_whose_trunk_lacks_the_checkpoint_is_refused_in_one_line(corpus, tmp_path):
    from loopscale.errors import UsageError

    (tmp_path / "trunk").mkdir()
    cfg = trainkit.config("base", *corpus, **{**WSD, "train.steps": 5, "train.branch_from": "trunk",
                                              "train.branch_step": 4})
    with pytest.raises(UsageError, match="has no checkpoint at train.branch_step=4"):
        train(cfg, str(tmp_path / "branch"))


SWEEP = '''
from loopscale.sweep import base_sweep


def get_config(arg=None):
    s = base_sweep()
    s.name = "branches"
    s.families = {"base": {"experiment": "experiments/base.py:tiny", "overrides": {}}}
    s.overrides = {"model": {"base_d_model": 32, "scan": False}, "train": {"eval_batches": 2}}
    s.budgets = (1e9, 2e9)
    s.shape = {"kind": "width", "widths": (2, 4), "head_dim": 0, "n_heads": 1, "ffn_ratio": 0.0,
               "shapes": (), "sizes": 2, "tokens_per_param": 50.0, "params": "params_active"}
    s.batch_size, s.seq_len = 16, 32
    s.lrs = (1.2e-2,)
    s.min_steps = 10
    s.warmup_frac = 0.05
    s.evals, s.checkpoints = 1, 1
    s.branches = True
    s.measure = "ppl"
    if arg == "pilot":  # what `loopscale demo` runs first: two seeds a width at one budget
        s.budgets, s.seeds, s.branches, s.measure = (1e9,), (0, 1), False, ""
    return s
'''


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "branches.py"
    path.write_text(SWEEP)
    return str(path)


def test_plan_marks_trunks_and_branches_and_counts_their_flops(sweep_file):
    from loopscale.sweep import load_sweep
    from loopscale.sweep.plan import plan

    branched = plan(load_sweep(sweep_file)).runs
    alone = plan(load_sweep(sweep_file, ["--sweep.branches=False"])).runs
    trunks = {r.run_id: r for r in branched if r.row["role"] == "trunk"}
    branches = [r for r in branched if r.row["role"] == "branch"]
    assert len(trunks) == 2 and len(branches) == len(alone) == 4
    assert [r.row["role"] for r in branched[:2]] == ["trunk"] * 2  # trunks launch first
    for b in branches:
        t, trunk = b.config.train, trunks[b.config.train.branch_from].config.train
        # The branch point is where the branch's WSD cooldown starts, and the trunk keeps it.
        assert t.branch_step == t.steps - round(t.decay_frac * t.steps)
        assert t.branch_step in trunk.keep_steps and trunk.steps == max(trunk.keep_steps)
        assert trunk.schedule.value == "constant" and t.schedule.value == "wsd"
        assert trunk.warmup_steps == t.warmup_steps and b.config.model == \
            trunks[t.branch_from].config.model
        assert b.row["flops_spent"] == pytest.approx(
            b.row["flops"] * (t.steps - t.branch_step) / t.steps)
    # The same (size, budget) points as the one-run-per-point plan, for less compute.
    key = lambda r: (r.budget, r.config.model.d_model)  # noqa: E731
    assert sorted(map(key, branches)) == sorted(map(key, alone))
    assert {key(b): b.row["flops"] for b in branches} == {key(a): a.row["flops"] for a in alone}
    assert branches[0].train_args("RUN")[-2:] == ["--workdir=RUN", "--eval=ppl"]  # every launcher
    spent = sum(r.row["flops_spent"] for r in branched)
    assert spent < 0.8 * sum(r.row["flops_spent"] for r in alone)


@pytest.mark.slow
def test_a_branched_sweep_runs_and_collects_one_row_per_point(sweep_file, tmp_path, capsys):
    from loopscale.cli import main
    from loopscale.sweep.collect import collect_dir

    workdir = tmp_path / "sweep"
    assert main(["sweep", f"--sweep={sweep_file}", f"--workdir={workdir}",
                 "--concurrency=2"]) == 0
    rows = collect_dir(str(workdir))
    assert {r["status"] for r in rows} == {"completed"}
    points = [r for r in rows if r["role"] == "branch"]
    assert len(points) == 4 and all(r["loss"] is not None for r in points)
    assert all(r["loss"] is None for r in rows if r["role"] == "trunk")
    for r in points:  # each point's run spent its whole budget, trunk steps included
        assert float(r["flops"]) == pytest.approx(float(r["budget"]), rel=0.05)
        # `measure`: each run measured as it completed (eval/ppl.json), collected as columns.
        assert r["ppl_loss"] == pytest.approx(r["final_eval_loss"], rel=1e-5)
    # `loopscale demo` on the finished sweep. Its pilot (the file's ARG `pilot`) trains first
    # and publishes its seed noise; behind a gate no pilot passes, the demo stops there.
    capsys.readouterr()
    pilot_dir = workdir / "pilot"
    pilot_steps = [f"$ loopscale sweep --sweep={sweep_file}:pilot --workdir={pilot_dir} "
                   "--concurrency=2", f"$ loopscale collect {pilot_dir} --out="
                   f"{pilot_dir / 'results.csv'}"]
    assert main(["demo", f"--sweep={sweep_file}", f"--workdir={workdir}",
                 "--noise-limit=1e-9"]) == 0
    out, _ = capsys.readouterr()
    assert [line for line in out.splitlines() if line.startswith("$ loopscale")] == pilot_steps
    assert "4/4 runs done" in out and "not resolved at this scale" in out
    assert "predicted 95% interval" not in out
    record = json.loads((workdir / "pilot.json").read_text())
    assert record["resolved"] is False and record["dof"] == 2 and record["sigma_L"] > 0
    assert len(record["shapes"]) == 2 and not (workdir / "results.csv").exists()
    # Behind a gate it passes: the pilot's runs and the sweep's are found done and nothing
    # trains, collect writes results.csv as `loopscale collect` does, and the report refuses
    # in one line a table it cannot fit (two sizes a budget), writing no report.
    before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
    assert main(["demo", f"--sweep={sweep_file}", f"--workdir={workdir}",
                 "--noise-limit=10"]) == 2
    out, err = capsys.readouterr()
    assert [line for line in out.splitlines() if line.startswith("$ loopscale")] == [
        *pilot_steps,
        f"$ loopscale sweep --sweep={sweep_file} --workdir={workdir} --concurrency=2",
        f"$ loopscale collect {workdir} --out={workdir / 'results.csv'}",
        f"$ loopscale report {workdir / 'results.csv'} --out={workdir / 'report'} "
        "--params-column=params_active --bootstrap=200 --grid=small --holdout=largest"]
    assert "predicted 95% interval on a" in out
    assert "6/6 runs done (0 diverged), 0 failed, 0 interrupted" in out
    assert err.strip().splitlines()[-1].startswith("loopscale demo: error: ")
    # (the held-out check the demo asks for is the first to find no usable minimum)
    assert "no budget has a usable minimum" in err.strip().splitlines()[-1]
    # checks.json, written before the report: the train steps' share of the runs' own time
    shares = json.loads((workdir / "checks.json").read_text())["train_step_share"]
    assert (shares["sweep"]["runs"], shares["pilot"]["runs"]) == (6, 4)
    for share in shares.values():
        assert 0 < share["step_s"] < share["runs_wall_s"]
        assert share["share_of_runs"] == pytest.approx(share["step_s"] / share["runs_wall_s"])
    # The pilot's runs compiled through the sweep's cache, which the sweep's runs read.
    pilot_run = next((pilot_dir / "runs").iterdir())
    cache = f"export JAX_COMPILATION_CACHE_DIR={workdir / 'jax_cache'}\n"
    assert cache in (pilot_run / "command.sh").read_text()
    assert not (pilot_dir / "jax_cache").exists() and any((workdir / "jax_cache").iterdir())
    table = pd.read_csv(workdir / "results.csv")
    assert sorted(table["run_id"]) == sorted(r["run_id"] for r in rows)
    assert not (workdir / "report").exists()
    assert all(p.stat().st_mtime_ns == t for p, t in before.items()  # nothing trained again
               # (the runner rewrites the first two, the demo the pilot's record and table)
               if p.name not in ("plan.csv", "sweep.lock", "pilot.json", "results.csv"))
    # A launch script starts the branches after the trunks: the Slurm script's first tasks are
    # the trunks, the branches a second array submitted to wait for them.
    capsys.readouterr()
    assert main(["sweep", f"--sweep={sweep_file}", f"--workdir={tmp_path / 'slurm'}",
                 "--launcher=slurm", "--dry-run"]) == 0
    text = capsys.readouterr().out
    tasks = re.findall(r"^  (\d+)\) RUN_ID=(\w+)", text, re.M)
    roles = {r["run_id"]: r["role"] for r in rows}
    order = [roles[run_id] for _, run_id in tasks]
    assert order == sorted(order, key=lambda role: role == "branch") and "branch" in order
    trunks = order.count("trunk") + order.count("run")
    assert f"#SBATCH --array=0-{trunks - 1}" in text
    assert f'--dependency="afterany:${{trunks%%;*}}" --array={trunks}-{len(order) - 1}' in text
