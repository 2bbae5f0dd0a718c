"""What a fresh clone anywhere needs: no tracked file names a path of the machine the project is
developed on (the tests, the README's commands and the bench read the reference tables from the
checkout's data/reference/, relative to it), the tables are there as PROVENANCE.md lists
them, and the plans and launch scripts committed with a study's results are what today's commands
write."""

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The development machine's checkout, its shared folder and tool library, its home directory.
MACHINE_PATHS = re.compile(r"(?<![\w.~-])/(work|root)/|/tmp/studio")


def tracked_files() -> list[Path]:
    """The files git tracks, and those it would (untracked, not ignored), in the working tree."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def test_no_tracked_file_names_a_path_of_the_development_machine():
    files = tracked_files()
    assert len(files) > 100  # the listing worked
    found = []
    for path in files:
        if path == Path(__file__).resolve():  # names the paths on purpose, to test the pattern
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (checkpoints, images): no paths to read
            continue
        text = data.decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATHS.search(line) or str(ROOT) + "/" in line:
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert found == []


def test_the_pattern_finds_what_it_is_for():
    assert MACHINE_PATHS.search('CSV = "/work/shared/data/x.csv"')
    assert MACHINE_PATHS.search("exec /root/.venv/bin/python")
    assert not MACHINE_PATHS.search("data/reference/x.csv and runs/work/ and ~/work/x")


def test_the_reference_tables_are_shipped_as_their_provenance_lists_them():
    folder = ROOT / "data" / "reference"
    rows = [line.split("|") for line in (folder / "PROVENANCE.md").read_text().splitlines()
            if line.startswith("| ") and ".csv" in line.split("|")[1]]
    assert len(rows) == 3
    for cells in rows:
        name, digest = cells[1].strip(), cells[-2].strip()
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert {p.name for p in folder.glob("*.csv")} == {cells[1].strip() for cells in rows}


# Generated files committed beside a study's results, with the command that writes each: a
# test writes them again with today's planner and launchers and compares, so they stay true.
PERMUTATION = ROOT / "analysis" / "results" / "permutation"
SWEEP = ["--sweep=sweeps/permutation.py:paper"]
GENERATED = {
    "paper_plan.csv": ["plan", *SWEEP, "--out={out}"],
    "paper_slurm.sh": ["sweep", *SWEEP, "--workdir=gs://BUCKET/perm", "--launcher=slurm",
                       "--dry-run"],
    "paper_tpu_pod.sh": ["sweep", *SWEEP, "--workdir=gs://BUCKET/perm", "--launcher=tpu-pod",
                         "--tpu-name=perm-v5p-8", "--zone=us-east5-a", "--dry-run"],
}


@pytest.mark.parametrize("name", GENERATED)
def test_committed_plans_and_launch_scripts_are_what_the_commands_write_today(
        name, tmp_path, capsys, monkeypatch):
    from loopscale.cli import main

    monkeypatch.chdir(ROOT)  # the sweep file and experiments as the README's commands name them
    out = tmp_path / name
    assert main([a.format(out=out) for a in GENERATED[name]]) == 0
    written = out.read_text() if out.exists() else capsys.readouterr().out
    assert written == (PERMUTATION / name).read_text(), (
        f"{name} is stale: write it again with `loopscale {' '.join(GENERATED[name])}`")


def test_the_accelerator_extras_pin_the_jax_the_suite_runs():
    """`tpu` (libtpu for the compile tests) and `gpu` (`make install-gpu`) must bring the jax
    the package was tested with, or pip would swap it for another on a TPU or GPU machine."""
    import tomllib

    import jax

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["tpu"] == [f"jax[tpu]=={jax.__version__}"]
    assert extras["gpu"] == [f"jax[cuda12]=={jax.__version__}"]
    assert "install-gpu:" in (ROOT / "Makefile").read_text()
