"""Two processes x 2 CPU devices on 127.0.0.1 (jax.distributed, gloo collectives) train exactly
like one process x 4 devices: each process feeds only its shard of every batch."""

import json
import os
import socket
import subprocess

import pytest
import trainkit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(devices: int) -> dict:
    return trainkit.cpu_env(devices)


def losses(workdir) -> dict:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(root / "text")), str(root / "cache")


def test_two_processes_match_one_process(corpus, tmp_path):
    args = ["train", "--config=experiments/looped.py:tiny",
            *trainkit.overrides(*corpus, **{"train.steps": 4, "train.eval_every": 0,
                                            "train.checkpoint_every": 2, "mesh.data": 2,
                                            "mesh.fsdp": 2})]
    # Pack the corpus once, so the two processes only read the cache.
    single = trainkit.run_cli(*args, f"--workdir={tmp_path / 'single'}", env=env(4))
    assert single.returncode == 0, single.stderr[-3000:]

    port = free_port()
    procs = [subprocess.Popen(
        trainkit.loopscale_cmd(*args, f"--workdir={tmp_path / 'multi'}",
                               f"--coordinator=127.0.0.1:{port}", "--num-processes=2",
                               f"--process-id={i}"),
        env=env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    a, b = losses(tmp_path / "single"), losses(tmp_path / "multi")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
    with open(tmp_path / "multi" / "summary.json") as f:
        assert json.load(f)["status"] == "completed"
