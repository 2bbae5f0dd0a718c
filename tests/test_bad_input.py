"""The catalogue of bad input: each row a command line that once gave a traceback (or a
misleading message), the exit status it must give now (2) and a phrase its one line on stderr
must hold. Every bug of this kind found later becomes one more row.

Rows run in-process through `loopscale.cli.main`, so they cost no interpreter start-up; each
must fail before any training or compile starts (a row that trained would be a bug, and slow).
"""

import os
import stat

import pytest

from loopscale.cli import main

BAD_FILES = {
    # A syntax error: the file and line, not a 52-line traceback.
    "syntax.py": "def get_config(arg=None):\n    x = (\n",
    # get_config raising: its own message is the point (it checks its ARG, say).
    "raises.py": "def get_config(arg=None):\n    raise ValueError('width must be even')\n",
    # No get_config at all: once reported as an unknown field.
    "no_get_config.py": "WIDTH = 64\n",
    # An import that fails while the file loads.
    "bad_import.py": "import no_such_module_loopscale\n\ndef get_config(arg=None):\n    pass\n",
    # get_config returning something that is no ConfigDict.
    "returns_dict.py": "def get_config(arg=None):\n    return {'model': {}}\n",
    # A sweep file starting from base_sweep() with a misspelt field: refused, not ignored.
    "sweep_typo.py": "from loopscale.sweep import base_sweep\n\ndef get_config(arg=None):\n"
                     "    s = base_sweep()\n    s.name = 'typo'\n    s.families = {'base': "
                     "{'experiment': 'experiments/base.py:tiny', 'overrides': {}}}\n"
                     "    s.shape.widht = (8,)\n    return s\n",
    # A results table that cannot be fitted (one budget, two sizes): once "2 runs fitted".
    "two_rows.csv": "run_id,family,budget,status,loss,params,tokens,flops\n"
                    "a,base,1e9,completed,2.95,2624,63488,1e9\n"
                    "b,base,1e9,completed,2.69,5376,31232,1e9\n",
    # The same run twice (a table collected twice): once fitted twice without a word.
    "dup_rows.csv": "run_id,family,budget,status,loss,params,tokens,flops\n"
                    + "".join(f"r{i % 6},base,{b},completed,{2 + i / 10},{n},{1e9 / 6 / n},1e9\n"
                              for i, (b, n) in enumerate([(1e9, 2624), (1e9, 5376), (1e9, 8256),
                                                         (2e9, 2624), (2e9, 5376), (2e9, 8256),
                                                         (1e9, 2624)])),
}


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    for name, text in BAD_FILES.items():
        (root / name).write_text(text)
    (root / "a_file").write_text("a regular file, not a directory\n")
    readonly = root / "readonly"
    readonly.mkdir()
    readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return root


def _workdir_rows():
    rows = [
        (["train", "--config=experiments/base.py:tiny", "--workdir={bad}/a_file/run"],
         "cannot write there (Not a directory)"),
        # /proc takes no new directories, even from root.
        (["train", "--config=experiments/base.py:tiny", "--workdir=/proc/loopscale-run"],
         "workdir /proc/loopscale-run: cannot write there"),
    ]
    # The same workdirs for a sweep, on the local runner, in a launch script and in the demo.
    pilot = "--sweep=sweeps/isoflop_cpu.py:pilot"
    rows += [
        (["sweep", pilot, "--workdir={bad}/a_file/sweep"], "cannot write there (Not a directory)"),
        (["sweep", pilot, "--workdir=/proc/loopscale-sweep"],
         "workdir /proc/loopscale-sweep: cannot write there"),
        (["sweep", pilot, "--sweep.branches=False", "--launcher=slurm",
          "--workdir={bad}/a_file/sweep"], "cannot write there (Not a directory)"),
        (["demo", "--workdir={bad}/a_file/demo"], "cannot write there (Not a directory)"),
        # Megablox takes each expert's matrices whole, and only dropless MoE has a grouped matmul.
        (["compile", "--config=experiments/moe.py:tiny", "--config.model.moe_matmul=megablox",
          "--config.mesh.tensor=2", "--config.mesh.data=1"], "it needs mesh.tensor=1 (got 2)"),
        (["compile", "--config=experiments/moe.py:tiny", "--config.model.moe_matmul=megablox",
          "--config.model.moe_dispatch=capacity"], "it needs model.moe_dispatch=dropless"),
        # Packing GPUs that do not split a node's, or across nodes, or on another launcher.
        (["sweep", pilot, "--launcher=slurm", "--workdir={bad}/gpus", "--gpus-per-node=8",
          "--gpus-per-run=3"], "it must divide --gpus-per-node (got 8)"),
        (["sweep", pilot, "--launcher=slurm", "--workdir={bad}/gpus", "--gpus-per-node=8",
          "--gpus-per-run=2", "--nodes=2"], "it needs --nodes=1, got 2"),
        (["sweep", pilot, "--launcher=tpu-pod", "--workdir={bad}/gpus", "--gpus-per-run=2"],
         "--gpus-per-run packs the runs of --launcher=slurm"),
    ]
    if os.geteuid() != 0:  # root writes into a read-only directory regardless
        rows.append((["train", "--config=experiments/base.py:tiny",
                      "--workdir={bad}/readonly/run"], "cannot write there (Permission denied)"))
        rows.append((["sweep", pilot, "--workdir={bad}/readonly/sweep"],
                     "cannot write there (Permission denied)"))
    # A gs:// workdir whose bucket does not exist, for train and for a sweep's launch script:
    # tests/test_object_store.py, beside the GCS emulator those rows need (here a gs:// path
    # would send gcsfs to the network).
    return rows


CATALOGUE = [
    # Config files that cannot be read, for each command that reads one.
    *[([command, "--config={bad}/syntax.py", *extra], "syntax.py: line 2: '(' was never closed")
      for command, extra in [("train", ["--workdir={tmp}/run"]), ("flops", []),
                             ("compile", ["--topology=v5p-8"])]],
    (["plan", "--sweep={bad}/syntax.py", "--out={tmp}/plan.csv"],
     "syntax.py: line 2: '(' was never closed"),
    (["flops", "--config={bad}/syntax.py:tiny"], "syntax.py: line 2"),
    (["flops", "--config={bad}/raises.py"], "raises.py: get_config raised ValueError: width must "
                                            "be even"),
    (["train", "--config={bad}/raises.py:x", "--workdir={tmp}/run"],
     "get_config raised ValueError: width must be even"),
    (["flops", "--config={bad}/no_get_config.py"], "no_get_config.py has no get_config(arg)"),
    (["plan", "--sweep={bad}/no_get_config.py", "--out={tmp}/plan.csv"],
     "no_get_config.py has no get_config(arg)"),
    (["plan", "--sweep={bad}/sweep_typo.py", "--out={tmp}/plan.csv"],
     "unknown sweep field shape.widht"),
    (["flops", "--config={bad}/bad_import.py"],
     "bad_import.py: loading it raised ModuleNotFoundError: No module named "
     "'no_such_module_loopscale'"),
    (["flops", "--config={bad}/returns_dict.py"], "returns_dict.py: get_config() returned dict"),
    (["flops", "--config={bad}/missing.py"], "no such file"),
    (["flops", "--config=experiments/base.py:tiny", "--config.model.nope=1"],
     "unknown config field in config.model.nope"),
    (["flops", "--config=experiments/looped.py:tiny", "--config.model.n_coda=-1"],
     "model.n_coda=-1 must be 0 or more"),
    (["eval", "--workdir={tmp}/run", "--what=loops", "--loops=1,0"],
     "--loops takes positive loop counts, got '0'"),
    (["eval", "--workdir={tmp}/run", "--what=ppl", "--loops=4"],
     "--loops gives the loop counts of --what=loops"),
    # Measurements that do not exist, wherever they are named.
    (["plan", "--sweep=sweeps/permutation.py", "--sweep.measure=ppl,nope",
      "--out={tmp}/plan.csv"], "sweep.measure=nope is not a measurement (built: ppl, loops, "),
    (["train", "--config=experiments/base.py:tiny", "--eval=ppl,nope", "--workdir={tmp}/run"],
     "--eval=nope is not a measurement"),
    # Results tables that cannot be fitted, for both commands that fit.
    *[([command, "{bad}/two_rows.csv", out], "two_rows.csv: nothing could be fitted (family "
       "base: no parametric fit: 2 runs")
      for command, out in [("fit", "--out={tmp}/fit.json"), ("report", "--out={tmp}/report")]],
    *[([command, "{bad}/dup_rows.csv", out], "run_id r0 appears 2 times (collected twice?)")
      for command, out in [("fit", "--out={tmp}/fit.json"), ("report", "--out={tmp}/report")]],
    # Bounds on E and held-out budgets that cannot be.
    (["fit", "{bad}/two_rows.csv", "--out={tmp}/fit.json", "--fit.E_min=2", "--fit.E_max=1"],
     "--fit.E_min 2.0 is above --fit.E_max 1.0"),
    (["report", "{bad}/two_rows.csv", "--out={tmp}/report", "--fit.E_min=-1"],
     "--fit.E_min must be > 0, got -1.0"),
    (["fit", "{bad}/two_rows.csv", "--out={tmp}/fit.json", "--holdout=soon"],
     "--holdout takes 'largest' or a budget in FLOPs, got 'soon'"),
    # Workdirs that cannot hold a run: refused before any work.
    *_workdir_rows(),
    # A sweep's status where there is no sweep.
    (["status", "--workdir={tmp}/none"], "holds no sweep (no plan.csv)"),
    # An accelerator-sized run where JAX sees only CPUs (a GPU node without the gpu extra).
    (["train", "--config=experiments/base.py:paper", "--workdir={tmp}/run"],
     "plans 7.7e+16 training FLOPs and JAX sees only CPUs"),
    (["train", "--config=experiments/flt.py:small", "--workdir={tmp}/run"],
     "or pass --allow-cpu to train here anyway"),
    # Asked to join a cluster where there is none to detect.
    (["train", "--config=experiments/base.py:tiny", "--workdir={tmp}/run", "--distributed"],
     "--distributed: no cluster found to join"),
]


@pytest.mark.parametrize("args,phrase", CATALOGUE,
                         ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(CATALOGUE)])
def test_bad_input_exits_2_with_one_line(bad, tmp_path, capsys, args, phrase):
    argv = [a.format(bad=bad, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"loopscale {args[0]}: error: ") and phrase in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


def test_allow_cpu_trains_an_accelerator_sized_run_here_all_the_same(tmp_path, monkeypatch):
    """--allow-cpu passes the CPU gate (and travels in a job's argv, as a sweep relaunches
    it); the training itself is replaced here, a paper run being days of CPU."""
    from loopscale.job import TrainJob
    from loopscale.train import trainer

    started = []
    monkeypatch.setattr(trainer, "train", lambda config, workdir: started.append(
        (config.name, workdir)) or 0)
    workdir = str(tmp_path / "run")
    assert main(["train", "--config=experiments/base.py:paper", f"--workdir={workdir}",
                 "--allow-cpu"]) == 0
    assert started == [("base", workdir)]
    assert "--allow-cpu" in TrainJob("experiments/base.py:paper", workdir,
                                     allow_cpu=True).argv()


def test_verbose_adds_the_traceback_of_the_cause(bad, capsys):
    assert main(["flops", f"--config={bad}/syntax.py", "--verbose"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "SyntaxError" in err  # what the one line summarises
    assert err.strip().splitlines()[-1].startswith("loopscale flops: error: ")
