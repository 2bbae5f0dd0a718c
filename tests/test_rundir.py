"""The run directory (loopscale/rundir/): the config round trip, parameters-only loading on any
mesh, and run directories written by an older commit (tests/fixtures/rundirs_fb4f2b5, see its
README) that must still collect, report and resume."""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
import trainkit

from loopscale.cli import main
from loopscale.config import MeshConfig, load_config, parse
from loopscale.errors import UsageError
from loopscale.rundir.load import load_run
from loopscale.rundir.run import checkpoint_steps, config_changes, read_config
from loopscale.rundir.status import ExitCode, RunStatus
from loopscale.sweep.collect import collect_dir
from loopscale.parallel.mesh import make_mesh
from loopscale.train.trainer import train

FIXTURE = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5"
# The command line fixtures/rundirs_fb4f2b5/killed.py trained the killed run with.
KILLED_OVERRIDES = ["--config.train.steps=8", "--config.model.d_model=16",
                    "--config.model.n_heads=1", "--config.train.checkpoint_every=4",
                    "--config.train.eval_every=4", "--config.train.batch_size=8",
                    "--config.train.seq_len=32", "--config.train.eval_batches=2",
                    "--config.train.warmup_steps=2"]


def killed_config():
    return parse(load_config("experiments/base.py:tiny", KILLED_OVERRIDES))


@pytest.fixture
def old(tmp_path):
    """A writable copy of the fixture (tests must not change the repository's files)."""
    shutil.copytree(FIXTURE, tmp_path / "old")
    return tmp_path / "old"


def test_an_old_config_json_reads_back_as_the_config_that_wrote_it():
    assert config_changes(read_config(FIXTURE / "killed"), killed_config()) == []


def test_config_json_fields_added_later_take_defaults_and_unknown_ones_are_refused(tmp_path):
    saved = json.loads((FIXTURE / "killed" / "config.json").read_text())
    del saved["train"]["ce_chunk"]  # as if written before the field existed
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = read_config(tmp_path)
    assert config.train.ce_chunk == parse(load_config("experiments/base.py:tiny")).train.ce_chunk
    saved["train"]["no_such_field"] = 1
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(UsageError, match=r"config.json: unknown config field train.no_such_field"):
        read_config(tmp_path)


def test_an_old_sweep_still_collects_and_reports(old, tmp_path):
    rows = collect_dir(str(old / "sweep"))
    assert len(rows) == 6 and {r["status"] for r in rows} == {RunStatus.COMPLETED.value}
    for row in rows:
        summary = json.loads((Path(row["workdir"]) / "summary.json").read_text())
        assert row["loss"] == summary["final_eval_loss"] and row["attempts"] == 1
    results = tmp_path / "results.csv"
    assert main(["collect", str(old / "sweep"), f"--out={results}"]) == 0
    assert main(["report", str(results), f"--out={tmp_path / 'report'}", "--bootstrap=10",
                 "--grid=small"]) == 0
    fit = json.loads((tmp_path / "report" / "fit.json").read_text())
    assert fit["table"]["fitted"] == 6 and fit["families"]["base"]["runs"] == 6


def test_a_run_killed_under_the_old_code_resumes(old):
    workdir = old / "killed"
    before = trainkit.metric_rows(workdir)
    assert json.loads((workdir / "summary.json").read_text())["status"] == "running"
    assert train(killed_config(), str(workdir)) == ExitCode.OK
    rows = trainkit.metric_rows(workdir)
    assert rows[:len(before)] == before  # the steps before the kill, untouched
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))  # each step once
    assert [r["step"] for r in rows if "eval_loss" in r] == [4, 8]
    losses = [r["loss"] for r in rows if "loss" in r]
    # Continued from the step-4 checkpoint, not restarted: a fresh model starts near ln(256).
    assert losses[4] < losses[0] - 0.3
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 8


def test_load_run_restores_parameters_only_on_any_mesh():
    config, params = load_run(FIXTURE / "killed")
    assert config_changes(config, killed_config()) == []
    assert params["embedding"].shape == (256, 16)
    # The same parameters onto an 8-way fsdp mesh: split, and equal.
    fsdp = make_mesh(MeshConfig(data=1, fsdp=8, tensor=1, expert=1), jax.devices()[:8])
    _, sharded = load_run(FIXTURE / "killed", step=4, mesh=fsdp)
    assert not sharded["embedding"].sharding.is_fully_replicated
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 params, sharded)


def test_load_run_names_what_is_missing(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint at step 3 \\(there are: 4\\)"):
        load_run(FIXTURE / "killed", step=3)
    shutil.copy(FIXTURE / "killed" / "config.json", tmp_path / "config.json")
    with pytest.raises(UsageError, match="no checkpoint to load"):
        load_run(tmp_path)
    with pytest.raises(UsageError, match="missing or not a JSON object"):
        load_run(tmp_path / "nowhere")
    assert checkpoint_steps(FIXTURE / "killed" / "checkpoints") == [4]
