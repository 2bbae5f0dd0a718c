"""The trainer when the machine fails it: a damaged newest checkpoint, a full disk, a finished
run that lost its summary. Each case is one that crashed, hung or lied before; each asserts the
run's files afterwards, and that a resume continues with the losses of an undisturbed run."""

import errno
import json
import shutil
import signal

import pytest
import trainkit

from loopscale.rundir.status import ExitCode
from loopscale.train.trainer import train

rows = trainkit.metric_rows
STEPS = 6


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(root / "text")), str(root / "cache")


def _config(corpus):
    # Checkpoints at 2, 4 and 6 (three kept), evaluations at 3 and 6.
    return trainkit.config("base", *corpus, **{"train.steps": STEPS, "train.checkpoint_every": 2,
                                               "train.keep_checkpoints": 3})


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory):
    """One undisturbed run: each test works on a copy of it."""
    workdir = tmp_path_factory.mktemp("finished") / "run"
    assert train(_config(corpus), str(workdir)) == 0
    return workdir


def _copy(finished, tmp_path):
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def train_losses(workdir):
    return {r["step"]: r["loss"] for r in rows(workdir) if "loss" in r}


def summary(workdir):
    return json.loads((workdir / "summary.json").read_text())


def _as_if_killed(workdir):
    """What a kill after the last step's checkpoint but before the summary leaves."""
    s = summary(workdir)
    (workdir / "summary.json").write_text(json.dumps({**s, "status": "running"}))


def _stderr_lines(capsys):
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if line.startswith("loopscale")]


def _assert_every_step_once(workdir, finished):
    assert [r["step"] for r in rows(workdir) if "loss" in r] == list(range(1, STEPS + 1))
    assert [r["step"] for r in rows(workdir) if "eval_loss" in r] == [3, STEPS]
    assert train_losses(workdir) == train_losses(finished)  # bit for bit
    assert trainkit.tensorboard_steps(workdir, "loss") == list(range(1, STEPS + 1))
    s = summary(workdir)
    assert s["status"] == "completed" and s["steps"] == STEPS
    # The unigram entropy covers the whole run, not the steps since the resume.
    assert s["unigram_entropy"] == pytest.approx(summary(finished)["unigram_entropy"], rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "files_missing"])
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_previous_one_used(
        corpus, finished, tmp_path, capsys, damage):
    workdir = _copy(finished, tmp_path)
    _as_if_killed(workdir)
    newest = workdir / "checkpoints" / str(STEPS)
    files = sorted((p for p in (newest / "state").rglob("*") if p.is_file()),
                   key=lambda p: p.stat().st_size)
    if damage == "truncated":  # the largest file cut to half, as a kill mid-copy leaves it
        data = files[-1].read_bytes()
        files[-1].write_bytes(data[:len(data) // 2])
    else:
        for p in files[len(files) // 2:]:
            p.unlink()
    damaged = {p.relative_to(newest): p.read_bytes() for p in newest.rglob("*") if p.is_file()}
    capsys.readouterr()

    assert train(_config(corpus), str(workdir)) == 0
    lines = _stderr_lines(capsys)
    assert len(lines) == 1 and "warning" in lines[0] and f"checkpoint {STEPS} does not restore" \
        in lines[0], lines
    moved = [p for p in (workdir / "checkpoints").iterdir() if p.name.startswith(f"bad-{STEPS}-")]
    assert len(moved) == 1 and moved[0].name in lines[0]
    # Moved aside as it was, not deleted or changed.
    assert {p.relative_to(moved[0]): p.read_bytes() for p in moved[0].rglob("*")
            if p.is_file()} == damaged
    _assert_every_step_once(workdir, finished)
    # The second resume finds the run completed and nothing to do.
    capsys.readouterr()
    assert train(_config(corpus), str(workdir)) == 0


def test_two_bad_checkpoints_in_a_row_fail_in_one_line_and_the_second_stays(
        corpus, finished, tmp_path, capsys):
    """A second failing checkpoint is no damaged file but something systematic (a changed
    code, a lost filesystem): the run fails in one line instead of retreating further."""
    workdir = _copy(finished, tmp_path)
    _as_if_killed(workdir)
    for step in (STEPS, STEPS - 2):
        shutil.rmtree(workdir / "checkpoints" / str(step) / "state")
    capsys.readouterr()
    assert train(_config(corpus), str(workdir)) == ExitCode.FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "warning" in lines[0] and "run failed" in lines[1], lines
    assert f"checkpoint {STEPS - 2} does not restore either" in lines[1]
    names = sorted(p.name for p in (workdir / "checkpoints").iterdir())
    assert names[:2] == ["2", "4"] and names[2].startswith(f"bad-{STEPS}-") and len(names) == 3
    assert summary(workdir)["status"] == "failed"


def test_a_finished_run_without_its_summary_rewrites_it_and_adds_no_rows(corpus, finished,
                                                                          tmp_path):
    workdir = _copy(finished, tmp_path)
    (workdir / "summary.json").unlink()
    before = (workdir / "metrics.jsonl").read_text()
    assert train(_config(corpus), str(workdir)) == 0
    assert (workdir / "metrics.jsonl").read_text() == before
    s, f = summary(workdir), summary(finished)
    for key in ["status", "steps", "tokens", "flops", "final_train_loss", "final_eval_loss",
                "best_eval_loss", "unigram_entropy", "collapsed"]:
        assert s[key] == f[key], key
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4", "6"]


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fails_in_one_line(workdir, capsys, rc):
    assert rc == ExitCode.FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "run failed" in lines[0] and "No space left" in lines[0], lines
    s = summary(workdir)
    assert s["status"] == "failed" and "No space left" in s["failed_reason"]


class _Deadline:
    """Fails the test instead of letting a hang (a writer thread waiting forever) stall it."""

    def __enter__(self):
        signal.signal(signal.SIGALRM, self._expired)
        signal.alarm(240)

    def __exit__(self, *exc):
        signal.alarm(0)

    @staticmethod
    def _expired(signum, frame):
        raise AssertionError("the run hung")


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_fails_in_one_line_then_resumes(
        corpus, finished, tmp_path, capsys, monkeypatch):
    """The disk fills while orbax writes checkpoint 4 in its background thread (grain's
    iterator file is written there): the run stops with status failed, leaving the partial
    write; once space is back, the same command resumes from checkpoint 2."""
    import grain._src.python.checkpoint.handler as grain_handler

    workdir = tmp_path / "run"
    real_save = grain_handler.CheckpointHandler.save

    def save(self, directory, *args, **kwargs):
        if directory.name.startswith("data") and "/4." in str(directory):
            _enospc()
        return real_save(self, directory, *args, **kwargs)

    monkeypatch.setattr(grain_handler.CheckpointHandler, "save", save)
    capsys.readouterr()
    with _Deadline():
        _fails_in_one_line(workdir, capsys, train(_config(corpus), str(workdir)))
    monkeypatch.undo()  # space freed
    assert train(_config(corpus), str(workdir)) == 0
    _assert_every_step_once(workdir, finished)


@pytest.mark.slow
def test_a_full_disk_while_logging_fails_in_one_line_and_cannot_hang(
        corpus, finished, tmp_path, capsys, monkeypatch):
    """The disk fills under the TensorBoard events file, then under summary.json too: one
    line, status failed where it still fits, no thread left waiting on a dead writer."""
    from tensorboardX import record_writer

    from loopscale.rundir import run as rundir

    workdir = tmp_path / "run"
    real_write = record_writer.RecordWriter.write
    writes = []

    def write(self, data):
        writes.append(data)
        if len(writes) > 3:  # the file header and the first rows fit (one record a row)
            _enospc()
        return real_write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    capsys.readouterr()
    with _Deadline():
        _fails_in_one_line(workdir, capsys, train(_config(corpus), str(workdir)))

    real_summary = rundir.RunDirectory.write_summary
    fails = {"summary": False}

    def write_summary(self, data):
        if fails["summary"]:
            _enospc()
        return real_summary(self, data)

    monkeypatch.setattr(rundir.RunDirectory, "write_summary", write_summary)
    fails["summary"] = True  # summary.json cannot be written either: the line still says why
    capsys.readouterr()
    with _Deadline():
        assert train(_config(corpus), str(workdir)) == ExitCode.FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "No space left" in lines[0], lines
    monkeypatch.undo()
    assert train(_config(corpus), str(workdir)) == 0
    _assert_every_step_once(workdir, finished)
