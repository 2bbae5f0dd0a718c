"""Two processes x 2 CPU devices on 127.0.0.1 (jax.distributed, gloo collectives) train exactly
like one process x 4 devices: each process feeds only its shard of every batch."""

import json
import os
import socket
import subprocess
import sys

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


# ---- --distributed: the cluster found from its environment, as on Slurm or a TPU pod ----

# Each task joins, then sums its process index over both processes' devices (a collective
# across the two: 0 + 1).
JOIN = ("from loopscale.job import Distributed; Distributed(detect=True).initialize(); "
        "import jax, jax.numpy as jnp, numpy as np; "
        "from jax.experimental import multihost_utils as mh; "
        "total = mh.process_allgather(np.array([jax.process_index()])).sum(); "
        "print(jax.process_index(), jax.process_count(), jax.device_count(), int(total))")


def slurm_env(job_id: int, task: int) -> dict:
    """What `srun -n 2` on one node sets for task `task` (the variables JAX reads)."""
    return {**env(1), "SLURM_JOB_ID": str(job_id), "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
            "SLURM_STEP_NODELIST": "localhost"}


def free_slurm_job_id() -> int:
    """A job id whose coordinator port (JAX: 61440 + id mod 4096) is free here."""
    for job_id in range(1000, 5096):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 61440 + job_id % 4096))
                return job_id
            except OSError:
                continue
    raise AssertionError("no free port in JAX's Slurm range")


def test_distributed_detects_slurm_and_two_tasks_join_on_loopback(monkeypatch):
    from loopscale.job import detected_cluster

    job_id = free_slurm_job_id()
    for task in (0, 1):
        for key, value in slurm_env(job_id, task).items():
            monkeypatch.setenv(key, value)
        port = 61440 + job_id % 4096
        assert detected_cluster() == ("SlurmCluster", f"localhost:{port}", 2, task)
    procs = [subprocess.Popen([sys.executable, "-c", JOIN], env=slurm_env(job_id, task),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for task in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    # (gloo announces itself on stdout first)
    assert sorted(out.splitlines()[-1].split() for out, _ in outs) == [
        ["0", "2", "2", "1"], ["1", "2", "2", "1"]]


def test_distributed_with_no_cluster_is_one_line(monkeypatch):
    from loopscale.errors import UsageError
    from loopscale.job import Distributed, detected_cluster

    for key in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(key, raising=False)
    assert detected_cluster() is None
    with pytest.raises(UsageError, match="no cluster found to join"):
        Distributed(detect=True).initialize()


def tpu_vm(monkeypatch, **env):
    """This process as a Cloud TPU VM host to JAX's detectors (what it reads from the machine
    at import), with `env` set and no other cluster's variables."""
    from jax._src.clusters import cloud_tpu_cluster

    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    for key in ("SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST",
                "MEGASCALE_COORDINATOR_ADDRESS", "TPU_PROCESS_ADDRESSES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_distributed_detects_a_tpu_pod_slice_on_gke(monkeypatch):
    """A TPU pod slice under GKE: the hosts from TPU_WORKER_HOSTNAMES, this one's id from
    TPU_WORKER_ID; process 0's host coordinates on JAX's TPU port."""
    from loopscale.job import detected_cluster

    # Everything from the environment, as GKE's JobSet sets it; a metadata query would go to
    # a closed loopback port and fail, never to the network.
    tpu_vm(monkeypatch, TPU_SKIP_MDS_QUERY="1", TPU_WORKER_HOSTNAMES="localhost,h1,h2,h3",
           TPU_WORKER_ID="2", MEGASCALE_NUM_SLICES="1", MEGASCALE_SLICE_ID="0",
           MEGASCALE_COORDINATOR_ADDRESS="localhost", GCE_METADATA_IP="127.0.0.1:9")
    assert detected_cluster() == ("GkeTpuCluster", "localhost:8482", 4, 2)


def test_distributed_detects_a_tpu_pod_slice_from_its_metadata_server(monkeypatch):
    """A TPU VM slice on GCE (as `gcloud ... tpu-vm ssh --worker=all` starts a run): JAX asks
    the VM's metadata server; here one on loopback answers as a 2-slice v5p pod's host 1 of
    slice 1 would (2 hosts a slice)."""
    import http.server
    import threading

    from loopscale.job import detected_cluster

    attributes = {"agent-worker-number": "1", "worker-network-endpoints": "localhost,h1",
                  "tpu-env": "MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '1'\n"
                             "MEGASCALE_COORDINATOR_ADDRESS: 'localhost'\n"}

    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            key = self.path.rsplit("/", 1)[-1]
            ok = self.headers.get("Metadata-Flavor") == "Google" and key in attributes
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(attributes.get(key, "").encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tpu_vm(monkeypatch, GCE_METADATA_IP=f"127.0.0.1:{server.server_address[1]}")
        for key in ("TPU_SKIP_MDS_QUERY", "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID"):
            monkeypatch.delenv(key, raising=False)
        assert detected_cluster() == ("GceTpuCluster", "localhost:8482", 4, 3)
    finally:
        server.shutdown()
