"""Runs that several evaluation test files train alike, trained once per test process.

A test file gets its own copy of the run directory (`copy_of`), so what one file's evaluations
write into eval/ is never seen by another's, and a file run alone trains the run itself.
"""

import shutil
from pathlib import Path

from loopscale.config import load_config, parse
from loopscale.train.trainer import train

# The permutation run of tests/test_eval.py's per-hop accuracy test and tests/test_eval_lens.py:
# the tiny looped (2 x 2) preset, 3 steps, hops 2..4 (so some hops are masked).
PERMUTATION_HOPS_2_4 = ("experiments/permutation.py:tiny", (
    "--config.train.steps=3", "--config.train.checkpoint_every=0",
    "--config.train.eval_every=0", "--config.data.hops_min=2", "--config.data.hops_max=4"))

_TRAINED: dict = {}  # (preset, overrides) -> the run directory trained in this process


def copy_of(run: tuple, tmp_path_factory, dest: Path):
    """(config, dest): the run `run` ((preset, overrides)), trained the first time a test in
    this process asks for it, copied to `dest` without any eval/."""
    preset, overrides = run
    cfg = parse(load_config(preset, list(overrides)))
    if run not in _TRAINED:
        rundir = tmp_path_factory.mktemp("evalkit") / "run"
        assert train(cfg, str(rundir)) == 0
        _TRAINED[run] = rundir
    shutil.copytree(_TRAINED[run], dest, ignore=shutil.ignore_patterns("eval"))
    return cfg, dest
