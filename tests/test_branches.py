"""Cooldown branches (warmup-stable-decay): one constant-LR trunk per model size, checkpointed
at every budget's branch point, and a short cooldown from each. A branch must train exactly
what a standalone run with the same WSD schedule trains."""

import json

import pytest
import trainkit

from loopscale.rundir.status import ExitCode
from loopscale.train.trainer import train

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
