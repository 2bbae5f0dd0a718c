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


def test_the_writer_thread_keeps_order_and_passes_a_failure_back():
    """rundir/writer.py: writes run in the order given, off the caller's thread; a failed one
    raises at the caller's next submit (or wait), and close still stops the thread."""
    import threading

    from loopscale.rundir.writer import Background

    written, threads = [], set()

    def write(i):
        threads.add(threading.get_ident())
        written.append(i)

    writer = Background(limit=4)
    for i in range(50):  # more than the limit: submit waits for the oldest instead of queueing
        writer.submit(write, i)
    writer.wait()
    assert written == list(range(50)) and threads and threading.get_ident() not in threads

    def fail():
        raise OSError(28, "No space left on device")

    writer.submit(fail)
    writer._pending[0].exception()  # wait for it to run (and fail)
    with pytest.raises(OSError, match="No space left"):
        writer.submit(write, 50)
    writer.submit(fail)
    with pytest.raises(OSError, match="No space left"):
        writer.close()
    assert written == list(range(50))  # the submit that raised queued nothing
    assert not [t for t in threading.enumerate() if t.name.startswith("loopscale-writer")]
