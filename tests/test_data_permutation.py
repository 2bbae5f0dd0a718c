"""The permutation-traversal task: token format, labels, determinism, splits, shortcut."""

import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from loopscale.config import base_config, load_config, parse
from loopscale.data import make_dataset, permutation
from loopscale.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def configs(n_nodes=8, hops=(1, 4), batch_size=8, eval_batches=2, seq_len=None):
    cfg = parse(base_config())
    data = dataclasses.replace(
        cfg.data,
        source=cfg.data.source.PERMUTATION,
        n_nodes=n_nodes,
        hops_min=hops[0],
        hops_max=hops[1],
    )
    train = dataclasses.replace(
        cfg.train,
        batch_size=batch_size,
        eval_batches=eval_batches,
        seq_len=seq_len or permutation.seq_len(n_nodes),
    )
    return data, train


def take(ds, n):
    it = ds.iterator()
    return [next(it) for _ in range(n)]


def decode(inputs, targets, n):
    """Reads the permutation, start and hop count back from the tokens (independent parser)."""
    assert inputs[0] == permutation.bos_id(n)
    pairs = inputs[1 : 2 * n + 1].reshape(n, 2)
    perm = np.full(n, -1)
    perm[pairs[:, 0]] = pairs[:, 1]
    assert inputs[2 * n + 1] == permutation.query_id(n)
    start = int(inputs[2 * n + 2])
    hops = int(inputs[2 * n + 3]) - permutation.hop_id(n, 0)
    return perm, start, hops, int(targets[2 * n + 3])


def test_token_format_and_labels():
    n, hmax = 8, 4
    data, train = configs(n, (1, hmax))
    ds = make_dataset(data, train, seed=0, split="train")
    assert ds.vocab_size == permutation.vocab_size(n, hmax) == n + 3 + hmax
    for b in take(ds, 3):
        B, T = b["inputs"].shape
        assert (B, T) == (8, 2 * n + 4) and b["targets"].shape == (B, T)
        assert b["inputs"].dtype == np.int32 and b["targets"].dtype == np.int32
        assert b["hop_labels"].shape == (B, hmax) and b["hop_mask"].shape == (B, hmax)
        assert b["inputs"].max() < ds.vocab_size and b["inputs"].min() >= 0
        np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
        for i in range(B):
            perm, start, hops, answer = decode(b["inputs"][i], b["targets"][i], n)
            assert sorted(perm) == list(range(n))  # every node listed exactly once
            assert 1 <= hops <= hmax and hops == b["hops"][i] and start == b["start"][i]
            walk = [start]
            for _ in range(hops):
                walk.append(perm[walk[-1]])
            assert answer == walk[-1] == b["answer"][i]
            assert b["answer_pos"][i] == 2 * n + 3
            assert np.flatnonzero(b["mask"][i]).tolist() == [2 * n + 3]
            assert b["hop_mask"][i].tolist() == [j < hops for j in range(hmax)]
            assert b["hop_labels"][i, :hops].tolist() == walk[1:]
            assert (b["hop_labels"][i, hops:] == 0).all()


def test_pairs_are_listed_in_random_order():
    data, train = configs(16, (2, 2))
    b = take(make_dataset(data, train, seed=0, split="train"), 1)[0]
    sources = b["inputs"][:, 1:33:2]
    assert not all((row == np.arange(16)).all() for row in sources)


def test_hop_range_is_covered_and_fixed_hops_work():
    data, train = configs(8, (2, 5), batch_size=64)
    hops = np.concatenate([b["hops"] for b in take(make_dataset(data, train, 0, "train"), 4)])
    assert set(hops.tolist()) == {2, 3, 4, 5}
    data, train = configs(8, (3, 3))
    b = take(make_dataset(data, train, 0, "train"), 1)[0]
    assert (b["hops"] == 3).all() and b["hop_mask"].all()


def test_deterministic_by_seed():
    data, train = configs()
    a = take(make_dataset(data, train, 5, "train"), 3)
    b = take(make_dataset(data, train, 5, "train"), 3)
    c = take(make_dataset(data, train, 6, "train"), 3)
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert any(not np.array_equal(x["inputs"], z["inputs"]) for x, z in zip(a, c))


def test_train_and_eval_permutations_are_disjoint():
    n = 5  # 120 permutations: random draws for both splits would surely collide
    data, train = configs(n, (1, 2), batch_size=50, eval_batches=4)

    def perms(split, batches):
        ds = make_dataset(data, train, 0, split)
        out = set()
        for b in take(ds, batches):
            for row, tgt in zip(b["inputs"], b["targets"]):
                out.add(tuple(decode(row, tgt, n)[0]))
        return out

    train_perms, eval_perms = perms("train", 8), perms("eval", 4)
    assert train_perms and eval_perms and not train_perms & eval_perms
    assert len(train_perms) > 30  # the train split is not degenerate


def test_eval_is_finite_and_fixed():
    data, train = configs(eval_batches=3)
    ds = make_dataset(data, train, 0, "eval")
    first, second = list(ds.iterator()), list(ds.iterator())
    assert len(first) == 3 == ds.num_batches
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x["inputs"], y["inputs"])


def test_longer_seq_len_is_right_padded():
    n = 8
    data, train = configs(n, (2, 2), seq_len=2 * n + 10)
    b = take(make_dataset(data, train, 0, "train"), 1)[0]
    assert b["inputs"].shape[1] == 2 * n + 10
    # the answer token itself follows the answer position, then padding
    assert (b["inputs"][:, 2 * n + 4] == b["answer"]).all()
    assert (b["inputs"][:, 2 * n + 5 :] == permutation.pad_id(n)).all()
    assert (b["targets"][:, 2 * n + 4 :] == permutation.pad_id(n)).all()
    assert b["mask"].sum(axis=1).tolist() == [1] * 8
    assert (b["targets"][np.arange(8), b["answer_pos"]] == b["answer"]).all()


@pytest.mark.parametrize(
    "kw",
    [{"n_nodes": 3}, {"hops": (3, 2)}, {"hops": (0, 2)}, {"seq_len": 10}, {"batch_size": 7}],
)
def test_bad_settings_are_usage_errors(kw):
    kw = dict(kw)
    n = kw.pop("n_nodes", 8)
    data, train = configs(n, **kw)
    with pytest.raises(UsageError):
        make_dataset(data, train, 0, "train", process_index=0, process_count=2)


def test_shortcut_matches_cycle_theory():
    n, h = 8, 4
    assert permutation.shortcut_probability(n, h, h) == pytest.approx(3 / 8)
    assert permutation.shortcut_probability(8, 8, 8) == pytest.approx(0.5)
    assert permutation.shortcut_probability(8, 1, 2) == pytest.approx((1 / 8 + 2 / 8) / 2)
    data, train = configs(n, (h, h), batch_size=500)
    batches = take(make_dataset(data, train, 0, "train"), 4)
    measured = np.mean([permutation.shortcut_accuracy(b) for b in batches])
    assert abs(measured - 3 / 8) < 0.04  # 2000 samples: standard error about 0.011
    for b in batches[:1]:
        for row, tgt, s, a in zip(b["inputs"], b["targets"], b["start"], b["answer"]):
            perm = decode(row, tgt, n)[0]
            assert (s == a) == (h % permutation.cycle_length(perm, int(s)) == 0)


def test_loop_labels_convention():
    batch = {
        "hop_labels": np.array([[5, 6, 7, 0], [1, 2, 0, 0]], np.int32),
        "hops": np.array([3, 2], np.int32),
        "answer": np.array([7, 2], np.int32),
    }
    # n_loops == H_max: one hop per loop, then hold the answer
    assert permutation.loop_labels(batch, 4).tolist() == [[5, 6, 7, 7], [1, 2, 2, 2]]
    # more loops than hops: hold the answer
    assert permutation.loop_labels(batch, 6).tolist() == [[5, 6, 7, 7, 7, 7], [1, 2, 2, 2, 2, 2]]
    # fewer loops than hops: one hop per loop, the last loop answers
    assert permutation.loop_labels(batch, 2).tolist() == [[5, 7], [1, 2]]
    assert permutation.loop_labels(batch, 1).tolist() == [[7], [2]]


def test_experiment_uses_the_task_sizes():
    spec = importlib.util.spec_from_file_location("perm_exp", ROOT / "experiments/permutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for arg in ("tiny", "paper"):
        cfg = parse(module.get_config(arg))
        d = cfg.data
        assert cfg.model.vocab_size == permutation.vocab_size(d.n_nodes, d.hops_max)
        assert cfg.train.seq_len == permutation.seq_len(d.n_nodes)
    # overrides on the command line move the sizes with them
    cfg = parse(
        load_config(
            f"{ROOT}/experiments/permutation.py:tiny",
            ["--config.data.n_nodes=20", "--config.data.hops_max=9"],
        )
    )
    assert cfg.model.vocab_size == 20 + 3 + 9 and cfg.train.seq_len == 44
    ds = make_dataset(cfg.data, cfg.train, cfg.seed, "train")
    b = next(ds.iterator())
    assert ds.vocab_size == cfg.model.vocab_size and b["inputs"].shape == (16, 44)
