"""Cluster launch scripts: they parse (`bash -n`), carry exactly the planned per-run commands
with a gs:// workdir, set up jax.distributed per host or node, and --dry-run writes nothing."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from loopscale.sweep import load_sweep
from loopscale.sweep.launchers import ClusterOptions, script, train_args
from loopscale.sweep.plan import plan

WORKDIR = "gs://bucket/isoflop cpu"  # a space, to check the quoting


@pytest.fixture(scope="module")
def runs():
    return plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base,looped_moe"])).runs


def bash_n(text, tmp_path):
    path = tmp_path / "script.sh"
    path.write_text(text)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_tpu_pod_script(runs, tmp_path):
    name, text = script("tpu-pod", "isoflop_cpu", runs, WORKDIR,
                        ClusterOptions(tpu_name="v4-32", zone="us-central2-b"))
    assert name == "tpu-pod.sh"
    bash_n(text, tmp_path)
    lines = [shlex.split(line) for line in text.splitlines() if line.startswith("run ")]
    assert len(lines) == len(runs)
    for words, run in zip(lines, runs):
        assert words[1] == run.run_id
        assert words[2:] == train_args(run, WORKDIR)
        assert words[-1] == f"--workdir={WORKDIR}/runs/{run.run_id}"
    # Every host of the slice, and jax.distributed from the TPU metadata.
    assert "--worker=all" in text and "train --distributed" in text
    assert 'TPU_NAME="${TPU_NAME:-v4-32}"' in text


def test_slurm_script(runs, tmp_path):
    name, text = script("slurm", "isoflop_cpu", runs, WORKDIR,
                        ClusterOptions(nodes=2, gpus_per_node=8, parallel=4,
                                       sbatch_args=("--account=lab",)))
    assert name == "slurm.sh"
    bash_n(text, tmp_path)
    assert f"#SBATCH --array=0-{len(runs) - 1}%4" in text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --account=lab" in text
    cases = re.findall(r"^  (\d+)\) RUN_ID=(\w+).*\n     ARGS=\((.*)\) ;;$", text, re.M)
    assert len(cases) == len(runs)
    for (index, run_id, args), run in zip(cases, runs):
        assert run_id == run.run_id
        assert shlex.split(args) == train_args(run, WORKDIR)
    for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID=$SLURM_PROCID"):
        assert var in text


def test_slurm_task_runs_its_command(runs, tmp_path):
    """Run array task 1 with stand-ins for srun, scontrol and loopscale: it must start
    `loopscale train` with run 1's arguments and the jax.distributed variables set."""
    _, text = script("slurm", "isoflop_cpu", runs, str(tmp_path / "sweep"),
                     ClusterOptions(repo=str(tmp_path), loopscale=str(tmp_path / "bin/loopscale")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                  'SLURM_PROCID=0 exec "$@"\n')
    # A long host list: a reader that stops after the first line would SIGPIPE scontrol.
    (bin_dir / "scontrol").write_text("#!/usr/bin/env bash\necho node-a\n"
                                      "for i in $(seq 20000); do echo node-$i; done\n")
    (bin_dir / "loopscale").write_text(
        '#!/usr/bin/env bash\necho "$JAX_COORDINATOR_ADDRESS $JAX_NUM_PROCESSES $JAX_PROCESS_ID"\n'
        'printf "%s\\n" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    path = tmp_path / "slurm.sh"
    path.write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_ARRAY_TASK_ID": "1",
           "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2", "SLURM_JOB_ID": "777"}
    r = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[1] == "node-a:12777 2 0"
    assert out[2:] == ["train", *train_args(runs[1], str(tmp_path / "sweep"))]


def test_sweep_command_writes_or_prints_scripts(tmp_path):
    base = [sys.executable, "-m", "loopscale.cli", "sweep", "--sweep=sweeps/isoflop_cpu.py",
            "--sweep.select=base"]
    dry = subprocess.run([*base, "--workdir=gs://b/x", "--launcher=slurm", "--dry-run"],
                         capture_output=True, text=True, cwd=os.getcwd())
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("#!/usr/bin/env bash") and "gs://b/x/runs/" in dry.stdout
    assert not os.path.exists("launch")
    workdir = tmp_path / "sweep"
    r = subprocess.run([*base, f"--workdir={workdir}", "--launcher=tpu-pod"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    script_path = workdir / "launch" / "tpu-pod.sh"
    assert os.access(script_path, os.X_OK)
    assert (workdir / "plan.csv").exists()
    planned = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])).runs
    assert len(list((workdir / "runs").iterdir())) == len(planned)  # run.json each, for collect
    local = subprocess.run([*base, "--workdir=gs://b/x"], capture_output=True, text=True)
    assert local.returncode == 2 and "--launcher" in local.stderr
