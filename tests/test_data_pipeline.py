"""Order, epochs, per-process sharding and checkpointable iterator state of the grain pipelines."""

import dataclasses
import json
import threading

import grain
import numpy as np
import orbax.checkpoint as ocp
import pytest

from loopscale.config import base_config, parse
from loopscale.data import make_dataset, permutation
from loopscale.data.pipeline import Examples, assemble, stack
from loopscale.errors import UsageError


def perm_configs(batch_size=8, eval_batches=2, worker_count=0):
    cfg = parse(base_config())
    data = dataclasses.replace(
        cfg.data,
        source=cfg.data.source.PERMUTATION,
        n_nodes=8,
        hops_min=1,
        hops_max=4,
        worker_count=worker_count,
    )
    train = dataclasses.replace(
        cfg.train, batch_size=batch_size, eval_batches=eval_batches, seq_len=permutation.seq_len(8)
    )
    return data, train


def text_configs(tmp_path, batch_size=4):
    folder = tmp_path / "corpus"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(6):
        words = rng.choice(["loop", "scale", "grain", "orbax", "token", "depth"], size=400)
        (folder / f"d{i}.txt").write_text(f"doc {i}: " + " ".join(words))
    cfg = parse(base_config())
    data = dataclasses.replace(
        cfg.data,
        source=cfg.data.source.TEXT,
        paths=str(folder / "*.txt"),
        cache_dir=str(tmp_path / "cache"),
        val_fraction=0.2,
    )
    train = dataclasses.replace(cfg.train, batch_size=batch_size, seq_len=32, eval_batches=2)
    return data, train


class CountingSource:
    """A random-access source of integers that records which indices were read."""

    def __init__(self, n):
        self.n, self.read, self._lock = n, [], threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self._lock:
            self.read.append(int(i))
        return np.int64(i)


def stream(
    source, *, split="train", seed=0, batch_size=4, process_index=0, process_count=1, eval_batches=2
):
    return assemble(
        Examples(len(source), lambda indices: stack([source[int(i)] for i in indices])),
        vocab_size=1,
        split=split,
        seed=seed,
        batch_size=batch_size,
        eval_batches=eval_batches,
        process_index=process_index,
        process_count=process_count,
        worker_count=0,
    )


def take(it, n):
    return [next(it) for _ in range(n)]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
        else:
            np.testing.assert_array_equal(x, y)


def test_endless_train_stream_reshuffles_every_epoch():
    it = stream(CountingSource(12), batch_size=4).iterator()
    seen = np.concatenate(take(it, 9))  # three epochs of 12
    epochs = seen.reshape(3, 12)
    for e in epochs:
        assert sorted(e.tolist()) == list(range(12))  # each epoch is a permutation of the data
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    assert not np.array_equal(epochs[0], np.arange(12))
    other = np.concatenate(take(stream(CountingSource(12), seed=1).iterator(), 3))
    assert not np.array_equal(other, epochs[0])
    assert_same(
        take(stream(CountingSource(12)).iterator(), 9),
        take(stream(CountingSource(12)).iterator(), 9),
    )


@pytest.mark.parametrize("process_count", [2, 4])
def test_processes_read_only_their_shard_of_each_global_batch(process_count):
    # 1000 records: the 10 batches taken and whatever grain prefetches stay in the first epoch
    global_batches = take(stream(CountingSource(1000), batch_size=8).iterator(), 10)
    sources = [CountingSource(1000) for _ in range(process_count)]
    local = [
        take(stream(src, batch_size=8, process_index=p, process_count=process_count).iterator(), 10)
        for p, src in enumerate(sources)
    ]
    for g in range(10):
        together = np.concatenate([local[p][g] for p in range(process_count)])
        np.testing.assert_array_equal(together, global_batches[g])
    # each process read only the records of its own slices (the shuffle is a bijection, so
    # different processes' records never overlap within an epoch)
    read = [set(s.read) for s in sources]
    mine = [set(np.concatenate(local[p]).tolist()) for p in range(process_count)]
    for p in range(process_count):
        assert mine[p] <= read[p] and len(read[p]) < 1000 // process_count
    for p in range(process_count):
        for q in range(process_count):
            if p != q:
                assert not (read[p] & mine[q])


def test_eval_is_finite_and_sharded():
    whole = list(stream(CountingSource(40), split="eval", batch_size=8, eval_batches=3).iterator())
    assert len(whole) == 3
    np.testing.assert_array_equal(np.concatenate(whole), np.arange(24))  # in order, no shuffle
    halves = [
        list(
            stream(
                CountingSource(40),
                split="eval",
                batch_size=8,
                eval_batches=3,
                process_index=p,
                process_count=2,
            ).iterator()
        )
        for p in range(2)
    ]
    assert [len(h) for h in halves] == [3, 3]
    for g in range(3):
        np.testing.assert_array_equal(np.concatenate([halves[0][g], halves[1][g]]), whole[g])
    with pytest.raises(UsageError, match="eval split"):
        stream(CountingSource(10), split="eval", batch_size=8, eval_batches=2)


def test_batch_size_must_split_over_processes():
    with pytest.raises(UsageError, match="divisible"):
        stream(CountingSource(10), batch_size=6, process_index=0, process_count=4)
    with pytest.raises(UsageError, match="process_index"):
        stream(CountingSource(10), batch_size=8, process_index=2, process_count=2)


def test_permutation_shards_union_to_the_global_batch():
    data, train = perm_configs(batch_size=8)
    whole = take(make_dataset(data, train, 0, "train").iterator(), 3)
    parts = [take(make_dataset(data, train, 0, "train", p, 2).iterator(), 3) for p in range(2)]
    for g in range(3):
        assert parts[0][g]["inputs"].shape == (4, train.seq_len)
        for k in whole[g]:
            np.testing.assert_array_equal(
                np.concatenate([parts[0][g][k], parts[1][g][k]]), whole[g][k]
            )


def _resume_matches(ds, n=3, m=4):
    it = ds.iterator()
    take(it, n)
    state = it.get_state()
    expected = take(it, m)
    fresh = ds.iterator()
    fresh.set_state(state)
    assert_same(take(fresh, m), expected)
    return expected


def test_state_restores_the_stream_permutation():
    data, train = perm_configs()
    _resume_matches(make_dataset(data, train, 0, "train"))


def test_state_restores_the_stream_text_across_epochs(tmp_path):
    data, train = text_configs(tmp_path)
    ds = make_dataset(data, train, 0, "train")
    meta = json.loads(next((tmp_path / "cache").glob("packed-*/meta.json")).read_text())
    per_epoch = meta["sequences"]["train"] // 4
    assert per_epoch >= 3
    # save just before an epoch ends, resume into the next (reshuffled) epoch
    _resume_matches(ds, n=per_epoch - 1, m=4)


def test_orbax_checkpoint_manager_saves_the_iterator(tmp_path):
    data, train = perm_configs()
    ds = make_dataset(data, train, 0, "train")
    it = ds.iterator()
    take(it, 5)
    mngr = ocp.CheckpointManager(tmp_path / "ckpt")
    mngr.save(
        5,
        args=ocp.args.Composite(
            data=grain.checkpoint.CheckpointSave(it),
            state=ocp.args.StandardSave({"step": np.array(5)}),
        ),
    )
    expected = take(it, 3)  # advancing right after save must not change what was saved
    mngr.wait_until_finished()
    mngr.close()

    mngr = ocp.CheckpointManager(tmp_path / "ckpt")
    fresh = ds.iterator()
    restored = mngr.restore(
        mngr.latest_step(),
        args=ocp.args.Composite(
            data=grain.checkpoint.CheckpointRestore(fresh),
            state=ocp.args.StandardRestore({"step": np.array(0)}),
        ),
    )
    assert restored["data"] is fresh and int(restored["state"]["step"]) == 5
    assert_same(take(fresh, 3), expected)
    mngr.close()


def test_worker_processes_give_the_same_batches_and_state():
    data, train = perm_configs()
    inline = take(make_dataset(data, train, 0, "train").iterator(), 4)
    data_mp = dataclasses.replace(data, worker_count=2)
    ds = make_dataset(data_mp, train, 0, "train")
    it = ds.iterator()
    try:
        got = take(it, 2)
        state = it.get_state()
        got += take(it, 2)
    finally:
        it.close()
    assert_same(got, inline)
    fresh = ds.iterator()
    try:
        fresh.set_state(state)
        assert_same(take(fresh, 2), inline[2:])
    finally:
        fresh.close()
