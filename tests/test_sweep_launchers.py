"""Cluster launch scripts: they parse (`bash -n`), carry exactly the planned per-run commands
with a gs:// workdir, set up jax.distributed per host or node, and --dry-run writes nothing.
The packed tpu-pod script is run with stand-in `gcloud` and `loopscale` commands: every run
launched once, on its own chips, and nothing again once all are done."""

import collections
import os
import re
import shlex
import subprocess
import sys

import pytest

from loopscale.sweep import load_sweep
from loopscale.sweep.launch_common import ClusterOptions, train_args, trunks_first
from loopscale.sweep.launchers import script
from loopscale.sweep.packing import Need, deal, parse_slice
from loopscale.sweep.plan import plan
from loopscale.sweep.sizing import Sized

WORKDIR = "gs://bucket/isoflop cpu"  # a space, to check the quoting


@pytest.fixture(scope="module")
def runs():
    return plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base,looped_moe"])).runs


def bash_n(text, tmp_path):
    path = tmp_path / "script.sh"
    path.write_text(text)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def run_args_cases(text):
    """{run_id: its `loopscale train` arguments} from the script's run_args function."""
    cases = re.findall(r"^    (\w+)\) ARGS=\((.*)\) ;;$", text, re.M)
    return {run_id: shlex.split(args) for run_id, args in cases}


def test_tpu_pod_script(runs, tmp_path):
    """No sizes: every run on the whole slice, in plan order but the cooldown branches after
    every trunk (a phase of their own), as `loopscale train --distributed` on every host."""
    name, text = script("tpu-pod", "isoflop_cpu", runs, WORKDIR,
                        ClusterOptions(tpu_name="v4-32", zone="us-central2-b"))
    assert name == "tpu-pod.sh"
    bash_n(text, tmp_path)
    cases = run_args_cases(text)
    assert list(cases) == [run.run_id for run in runs]
    for run in runs:
        assert cases[run.run_id] == train_args(run, WORKDIR)
        assert cases[run.run_id][-1] == f"--workdir={WORKDIR}/runs/{run.run_id}"
    phases = [line for line in text.splitlines() if line.startswith(("whole_slice ", "slot "))]
    first, branches = trunks_first(runs)
    assert branches and all(run.config.train.branch_from for run in branches)
    assert phases == ["whole_slice " + " ".join(run.run_id for run in group)
                      for group in (first, branches)]
    assert 'ssh_run "$id" all "" --distributed' in text and "--worker=\"$worker\"" in text
    assert 'TPU_NAME="${TPU_NAME:-v4-32}"' in text


CHIPS = (1, 2, 1, 4, 8, 1, 2)  # cycled over the runs; 8 is more than a v5p host's 4


def sized_runs(runs, topology="v5p-16"):  # 2 hosts of 4 chips
    """The runs with made-up chip counts and times (no compile): run i trains 10 * i s."""
    needs = tuple(Need(r.run_id, CHIPS[i % len(CHIPS)], 10.0 * i, 1.0 * i)
                  for i, r in enumerate(runs))
    # The launcher reads the slice and the needs only (plan=None: no plan table is written).
    return Sized(None, parse_slice(topology), needs, shapes=len(needs))


STANDIN_GCLOUD = r"""#!/usr/bin/env bash
# Records its arguments; `compute tpus tpu-vm ssh NAME ... --worker=W --command=CMD` runs CMD
# here as host W would (W exported as STANDIN_WORKER for the stand-in loopscale).
line=$(printf '%s\t' "$@"); echo "$line" >> "$RECORD/gcloud"
worker="" command=""
for a in "$@"; do
  case "$a" in --worker=*) worker="${a#--worker=}" ;; --command=*) command="${a#--command=}" ;; esac
done
[ "$1 $2 $3 $4" = "compute tpus tpu-vm ssh" ] || exit 9
STANDIN_WORKER="$worker" exec bash -c "$command"
"""

# Records host, libtpu's variables and arguments; holds a lock on each of its chips while it
# "trains" (a chip already locked by another run of the same host is a CONFLICT); then writes
# the summary `loopscale train` would.
STANDIN_LOOPSCALE = r"""#!/usr/bin/env bash
line=$(printf '%s\t' "$STANDIN_WORKER" "${TPU_VISIBLE_CHIPS:-}" \
  "${TPU_CHIPS_PER_PROCESS_BOUNDS:-}" "${TPU_PROCESS_BOUNDS:-}" "${TPU_PROCESS_PORT:-}" \
  "${TPU_PROCESS_ADDRESSES:-}" "${CLOUD_TPU_TASK_ID:-}" "${ALLOW_MULTIPLE_LIBTPU_LOAD:-}" "$@")
echo "$line" >> "$RECORD/calls"
held=()
for chip in ${TPU_VISIBLE_CHIPS//,/ }; do
  if mkdir "$RECORD/locks/$STANDIN_WORKER-$chip" 2>/dev/null; then held+=("$chip")
  else echo "CONFLICT $STANDIN_WORKER $chip" >> "$RECORD/conflicts"; fi
done
sleep 0.05
for chip in "${held[@]}"; do rmdir "$RECORD/locks/$STANDIN_WORKER-$chip"; done
for a in "$@"; do
  case "$a" in --workdir=*) dir="${a#--workdir=}" ;; esac
done
mkdir -p "$dir"
printf '{\n  "status": "completed"\n}\n' > "$dir/summary.json"
"""


def calls(record):
    """The stand-in loopscale's invocations: (host, env..., args) per line."""
    path = record / "calls"
    if not path.exists():
        return []
    return [line.rstrip("\t").split("\t") for line in path.read_text().splitlines()]


def test_packed_script_runs_every_run_once_on_its_own_chips(tmp_path):
    runs = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])).runs
    sized = sized_runs(runs)
    workdir = tmp_path / "sweep"
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    (record / "locks").mkdir(parents=True)
    (bin_dir / "gcloud").write_text(STANDIN_GCLOUD)
    (bin_dir / "loopscale").write_text(STANDIN_LOOPSCALE)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    _, text = script("tpu-pod", "isoflop_cpu", runs, str(workdir),
                     ClusterOptions(repo=str(tmp_path), loopscale=str(bin_dir / "loopscale"),
                                    tpu_name="slice-a"), sized)
    path = tmp_path / "tpu-pod.sh"
    path.write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record),
           "LOGS": str(tmp_path / "logs")}

    def launch(**extra):
        r = subprocess.run(["bash", str(path)], env={**env, **extra}, capture_output=True,
                           text=True, cwd=tmp_path)
        return r, calls(record)

    r, first = launch()
    assert r.returncode == 0, r.stderr + r.stdout
    assert not (record / "conflicts").exists(), (record / "conflicts").read_text()
    # Every run exactly once, with its own arguments.
    launched = collections.Counter(c[-1] for c in first)
    assert launched == collections.Counter(f"--workdir={workdir}/runs/{r.run_id}" for r in runs)
    # Every cooldown branch after its trunk (the trunks' phases end before a branch starts).
    order = [c[-1].rsplit("/", 1)[-1] for c in first]
    branches = trunks_first(runs)[1]
    assert branches and all(order.index(b.config.train.branch_from) < order.index(b.run_id)
                            for b in branches)
    need = {n.run_id: n for n in sized.needs}
    slots = collections.defaultdict(set)
    for host, chips, bounds, pbounds, port, addresses, task, allow, command, *args in first:
        run = next(r for r in runs if args[-1].endswith(r.run_id))
        assert command == "train"
        assert args in (train_args(run, str(workdir)),
                        ["--distributed", *train_args(run, str(workdir))])
        n = need[run.run_id].chips
        if n > 4:  # more than a host: every host, jax.distributed, no chip selection
            assert (host, chips, args[0]) == ("all", "", "--distributed")
            continue
        # Packed: one process of its own on n chips of one host, its own port.
        assert host in ("0", "1") and args[0] != "--distributed"
        ids = [int(c) for c in chips.split(",")]
        assert len(ids) == n and ids == list(range(ids[0], ids[0] + n)) and ids[0] % n == 0
        assert bounds == {1: "1,1,1", 2: "1,2,1", 4: "2,2,1"}[n]
        assert (pbounds, task, allow) == ("1,1,1", "0", "1")
        assert addresses == f"localhost:{port}"
        slots[host, n].add((chips, port))
    for (_, n), used in slots.items():
        # The blocks of one host for one chip count are disjoint, and so are their ports.
        chip_sets = [set(c.split(",")) for c, _ in used]
        assert len(set().union(*chip_sets)) == n * len(chip_sets)
        assert len({p for _, p in used}) == len(used)
    gcloud = [line.split("\t") for line in (record / "gcloud").read_text().splitlines()]
    assert all(g[4] == "slice-a" and "--zone=us-central2-b" in g for g in gcloud)

    # Everything done: running it again launches nothing (one ssh session checks the hosts).
    sessions = (record / "gcloud").read_text()
    r, again = launch()
    assert r.returncode == 0, r.stderr
    assert again == first
    new = (record / "gcloud").read_text()[len(sessions):].splitlines()
    assert len(new) == 1 and "--worker=all\t--command=true" in new[0]

    # One run interrupted (its summary says running): only that one is launched, and resumes.
    victim = runs[3]
    (workdir / "runs" / victim.run_id / "summary.json").write_text('{"status": "running"}\n')
    r, third = launch()
    assert r.returncode == 0, r.stderr
    assert [c[-1] for c in third[len(first):]] == [f"--workdir={workdir}/runs/{victim.run_id}"]


def test_a_failed_run_fails_the_script_and_is_retried(tmp_path):
    runs = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])).runs[:3]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(STANDIN_GCLOUD)
    # Exits 1 (a crash) for the second run without writing a summary.
    (bin_dir / "loopscale").write_text(
        '#!/usr/bin/env bash\necho "$*" >> "$RECORD/calls"\n'
        f'case "$*" in *{runs[1].run_id}*) exit 1 ;; esac\n'
        'for a in "$@"; do case "$a" in --workdir=*) d="${a#--workdir=}" ;; esac; done\n'
        'mkdir -p "$d"; echo \'{"status": "completed"}\' > "$d/summary.json"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    needs = tuple(Need(r.run_id, 1, 1.0, 1.0) for r in runs)
    sized = Sized(None, parse_slice("v5p-8"), needs, 1)  # one host of 4 chips
    _, text = script("tpu-pod", "x", runs, str(tmp_path / "sweep"),
                     ClusterOptions(repo=str(tmp_path), loopscale=str(bin_dir / "loopscale")),
                     sized)
    (tmp_path / "s.sh").write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(tmp_path),
           "LOGS": str(tmp_path / "logs")}
    for _ in (1, 2):  # the failed run again: still failing
        r = subprocess.run(["bash", str(tmp_path / "s.sh")], env=env, capture_output=True,
                           text=True)
        assert r.returncode == 1 and "1 run(s) failed" in r.stderr
        assert f"run {runs[1].run_id} failed (exit 1" in r.stderr
    lines = (tmp_path / "calls").read_text().splitlines()
    assert len(lines) == 3 + 1  # the failed run again, the finished ones not


def test_slurm_script(runs, tmp_path):
    name, text = script("slurm", "isoflop_cpu", runs, WORKDIR,
                        ClusterOptions(nodes=2, gpus_per_node=8, parallel=4,
                                       sbatch_args=("--account=lab",)))
    assert name == "slurm.sh"
    bash_n(text, tmp_path)
    first, branches = trunks_first(runs)
    assert f"#SBATCH --array=0-{len(first) - 1}%4" in text  # the trunks; then the branches
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --account=lab" in text
    cases = re.findall(r"^  (\d+)\) RUN_ID=(\w+).*\n     ARGS=\((.*)\) ;;$", text, re.M)
    assert len(cases) == len(runs)
    for (index, run_id, args), run in zip(cases, first + branches):
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
    first, branches = trunks_first(runs)
    assert out[2:] == ["train", *train_args((first + branches)[1], str(tmp_path / "sweep"))]


def test_slurm_script_submits_the_branches_after_the_trunks(runs, tmp_path):
    """Run with bash outside an array task, a branched plan's script submits itself twice: the
    trunks' tasks (its #SBATCH array), then the branches' with a dependency on that job; every
    branch's trunk is among the first tasks."""
    _, text = script("slurm", "isoflop_cpu", runs, str(tmp_path / "sweep"),
                     ClusterOptions(parallel=3))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/usr/bin/env bash\necho "$*" >> "$RECORD"\n'
                                    'echo "4242;cluster"\n')
    (bin_dir / "sbatch").chmod(0o755)
    path = tmp_path / "slurm.sh"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                       env={**env, "PATH": f"{bin_dir}:{env['PATH']}",
                            "RECORD": str(tmp_path / "calls")})
    assert r.returncode == 0, r.stderr
    first, branches = trunks_first(runs)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"--parsable {path}",
                     f"--dependency=afterany:4242 --array={len(first)}-{len(runs) - 1}%3 {path}"]
    assert f"#SBATCH --array=0-{len(first) - 1}%3" in text
    assert {run.config.train.branch_from for run in branches} <= {run.run_id for run in first}


# Records its GPUs and arguments; holds a lock on each GPU while it "trains" (a GPU already
# locked is a CONFLICT); a run named in $FAIL exits 1, one in $DIVERGE exits 3 (diverged).
STANDIN_GPU_LOOPSCALE = r"""#!/usr/bin/env bash
line=$(printf '%s\t' "$CUDA_VISIBLE_DEVICES" "$@"); echo "${line%$'\t'}" >> "$RECORD/calls"
held=()
for gpu in ${CUDA_VISIBLE_DEVICES//,/ }; do
  if mkdir "$RECORD/locks/$gpu" 2>/dev/null; then held+=("$gpu")
  else echo "CONFLICT $gpu" >> "$RECORD/conflicts"; fi
done
sleep 0.2
for gpu in "${held[@]}"; do rmdir "$RECORD/locks/$gpu"; done
case "$*" in *"$FAIL"*) exit 1 ;; *"$DIVERGE"*) exit 3 ;; esac
"""


def test_packed_slurm_script_gives_each_run_its_own_gpus(tmp_path):
    """--gpus-per-run=2 on nodes of 4 GPUs: every array task is one node whose two slots train
    its queue's runs, each once, each on two GPUs of the job's own list that no other run holds
    meanwhile; the tasks' queues share the runs out, trunks before branches; a failed run fails
    its task (a diverged one does not), and a task that sees too few GPUs stops in one line."""
    runs = plan(load_sweep("sweeps/isoflop_cpu.py", ["--sweep.select=base"])).runs
    first, branches = trunks_first(runs)
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    (record / "locks").mkdir(parents=True)
    (bin_dir / "loopscale").write_text(STANDIN_GPU_LOOPSCALE)
    (bin_dir / "loopscale").chmod(0o755)
    workdir = str(tmp_path / "sweep")
    _, text = script("slurm", "isoflop_cpu", runs, workdir,
                     ClusterOptions(repo=str(tmp_path), loopscale=str(bin_dir / "loopscale"),
                                    gpus_per_node=4, gpus_per_run=2, parallel=2))
    bash_n(text, tmp_path)
    queues = {int(i): q.split() for i, q in re.findall(r"^  (\d+)\) QUEUE=\((.*)\) ;;$", text,
                                                       re.M)}
    trunk_tasks = int(re.search(r"^#SBATCH --array=0-(\d+)%2$", text, re.M)[1]) + 1
    assert f"--array={trunk_tasks}-{len(queues) - 1}%2 " in text  # the branches' tasks
    assert "#SBATCH --nodes=1" in text and "#SBATCH --gpus-per-node=4" in text
    # Every run in exactly one queue; trunks in the first tasks, branches in the rest; as many
    # tasks as fill each slot once, at most --parallel.
    assert sorted(sum(queues.values(), [])) == sorted(r.run_id for r in runs)
    assert set(sum((queues[i] for i in range(trunk_tasks)), [])) == {r.run_id for r in first}
    assert (trunk_tasks, len(queues) - trunk_tasks) == (2, 2) and len(first) > 4
    args = {r.run_id: train_args(r, workdir) for r in runs}
    path = tmp_path / "slurm.sh"
    path.write_text(text)

    def task(i, gpus="4,5,6,7", **extra):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record),
               "SLURM_ARRAY_TASK_ID": str(i), "CUDA_VISIBLE_DEVICES": gpus,
               "LOGS": str(tmp_path / "logs"), "FAIL": "none", "DIVERGE": "none", **extra}
        (record / "calls").unlink(missing_ok=True)
        r = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
        lines = (record / "calls").read_text().splitlines() if (record / "calls").exists() else []
        return r, [line.split("\t") for line in lines if line]

    queue = queues[0]
    assert len(queue) >= 3
    r, ran = task(0, DIVERGE=queue[1])
    assert r.returncode == 0, r.stderr
    assert not (record / "conflicts").exists(), (record / "conflicts").read_text()
    assert sorted(c[1:] for c in ran) == sorted(["train", *args[i]] for i in queue)
    assert {c[0] for c in ran} == {"4,5", "6,7"}  # both slots, each its share of the job's GPUs
    assert "0 run(s) failed" in r.stderr

    r, ran = task(1, FAIL=queues[1][0])
    assert r.returncode == 1 and f"run {queues[1][0]} failed (exit 1" in r.stderr
    assert len(ran) == len(queues[1])  # the others still trained

    r, ran = task(0, gpus="0")
    assert r.returncode == 2 and ran == []
    assert "this task sees 1 GPU(s) (CUDA_VISIBLE_DEVICES), the script packs 4" in r.stderr


def test_deal_gives_the_longest_job_to_the_least_loaded_queue():
    assert deal([("a", 5.0), ("b", 4.0), ("c", 3.0), ("d", 3.0)], 2) == [["a", "d"], ["b", "c"]]
    assert deal([("a", 1.0)], 3) == [["a"], [], []]


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
    planned = plan(load_sweep("sweeps/isoflop_cpu.py", base[5:])).runs
    assert len(list((workdir / "runs").iterdir())) == len(planned)  # run.json each, for collect
    local = subprocess.run([*base, "--workdir=gs://b/x"], capture_output=True, text=True)
    assert local.returncode == 2 and "--launcher" in local.stderr
    packed = subprocess.run([*base, f"--workdir={workdir}", "--topology=v5p-8"],
                            capture_output=True, text=True)
    assert packed.returncode == 2 and "--topology packs the runs of --launcher=tpu-pod" in \
        packed.stderr
