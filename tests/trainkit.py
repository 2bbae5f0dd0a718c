"""Shared pieces of the trainer tests: a small local text corpus and tiny run configs."""

import json
import os
import subprocess
import sys

from etils import epath

from loopscale.config import load_config, parse
from loopscale.data.text import kjv_documents


def write_corpus(directory) -> str:
    """Forty KJV chapters as forty files: real English, packed in well under a second."""
    os.makedirs(directory, exist_ok=True)
    for i, doc in enumerate(kjv_documents()[:40]):
        with open(os.path.join(directory, f"ch{i:03d}.txt"), "w") as f:
            f.write(doc)
    return os.path.join(directory, "*.txt")


def overrides(corpus_glob: str, cache_dir: str, **fields) -> list[str]:
    base = {
        "data.paths": corpus_glob, "data.cache_dir": cache_dir, "train.steps": 6,
        "train.batch_size": 8, "train.seq_len": 32, "train.eval_batches": 2, "train.eval_every": 3,
        "train.checkpoint_every": 3, "train.warmup_steps": 2, "train.lr": 3e-3,
    }
    base.update(fields)
    return [f"--config.{k}={v}" for k, v in base.items()]


def config(experiment: str, corpus_glob: str, cache_dir: str, **fields):
    return parse(load_config(f"experiments/{experiment}.py:tiny", overrides(corpus_glob, cache_dir, **fields)))


def cpu_env(devices: int) -> dict:
    """This environment with `devices` CPU devices for a process a test starts."""
    return {**os.environ, "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}


def loopscale_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "loopscale.cli", *args]


def run_cli(*args: str, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(loopscale_cmd(*args), capture_output=True, text=True, env=env, timeout=timeout)


def metric_rows(workdir, growing: bool = False) -> list[dict]:
    """The rows of a run's metrics.jsonl (local or gs://). `growing`: the file is being written
    as it is read, so a last line without its newline is a row caught half-written (a reader
    can see part of one write on Linux) and is left out; every other line must parse."""
    text = (epath.Path(workdir) / "metrics.jsonl").read_text()
    lines = text.split("\n")
    if growing:
        lines = lines[:-1]  # "" after a final newline, else the half-written row
    return [json.loads(line) for line in lines if line.strip()]


def tensorboard_steps(workdir, tag: str) -> list[int]:
    """The steps of `tag` as TensorBoard shows them: its events files read in name order (the
    order TensorBoard reads them), an event with a SessionLog START at step P discarding every
    earlier event at step P or later (TensorBoard's purge of a restarted run)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event, SessionLog

    steps = []
    for path in sorted((epath.Path(workdir) / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):  # TFRecord: length, its crc, the record, its crc
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                steps = [s for s in steps if s < event.step]
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return steps
