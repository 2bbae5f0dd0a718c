"""XLA's flags per platform: collectives overlapped with compute, as MaxText sets them.

By default XLA runs each collective (a gradient all-reduce, an FSDP all-gather) as one
blocking instruction. With these flags libtpu splits them into start/done pairs and schedules
compute between the two, so communication hides behind the layers' matmuls; on GPUs the
latency-hiding scheduler does the same with NCCL's collectives on a stream of their own.

They reach a run two ways, from this one table:
- as environment variables (`env`: LIBTPU_INIT_ARGS on TPU, XLA_FLAGS on GPU), which the
  launch scripts set for every run (sweep/launchers.py) and the local runner writes into
  each run's command.sh (sweep/processes.py), so a run's record shows what it compiled with;
- as compiler options (`compiler_options`), with which `loopscale compile` builds the step
  for a TPU topology, so its memory and cost figures are those of the launched run.
Tested on a small TPU compile (tests/test_xla_flags.py): with them the step's collectives are
start/done pairs with compute between; without them, none are.
"""

from __future__ import annotations

import glob
import os

# libtpu's names, each accepted by the libtpu of the pinned jax (the test compiles with all).
TPU = {
    "xla_tpu_enable_async_collective_fusion": True,
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": True,
    "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
    "xla_tpu_overlap_compute_collective_tc": True,
    "xla_enable_async_all_gather": True,
    "xla_enable_async_all_reduce": True,
    "xla_tpu_enable_data_parallel_all_reduce_opt": True,
    "xla_tpu_data_parallel_opt_different_sized_ops": True,
    "xla_tpu_enable_latency_hiding_scheduler": True,
}
# XLA:GPU's (parsed by every jaxlib, so a CPU-only install accepts it too). One flag only: an
# XLA_FLAGS name that a later jaxlib has dropped stops the process at start-up, and the GPU
# check must run on jax from 0.10.2 up; the latency-hiding scheduler is XLA:GPU's core one.
GPU = {
    "xla_gpu_enable_latency_hiding_scheduler": True,
}
_BY_PLATFORM = {"tpu": TPU, "gpu": GPU}
_VARIABLE = {"tpu": "LIBTPU_INIT_ARGS", "gpu": "XLA_FLAGS"}


def compiler_options(platform: str) -> dict[str, bool]:
    """The flags of `platform` ("tpu", "gpu", "cpu": none) as jax compiler options."""
    return dict(_BY_PLATFORM.get(platform, {}))


def as_args(flags: dict[str, bool]) -> str:
    return " ".join(f"--{name}={str(value).lower()}" for name, value in flags.items())


def env(platform: str) -> dict[str, str]:
    """The variable that carries `platform`'s flags to a process, appended to the value it has
    in this environment (a user's own flags come first and are kept)."""
    if platform not in _VARIABLE:
        return {}
    name = _VARIABLE[platform]
    own = os.environ.get(name, "")
    return {name: f"{own} {as_args(_BY_PLATFORM[platform])}".strip()}


def tpu_attached() -> bool:
    """Whether this host has TPU chips (the device files the TPU driver creates)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def local_platform() -> str:
    """This host's accelerator, read from its device files without starting JAX (a runner that
    initialised JAX's GPU backend would take the memory its runs need)."""
    if tpu_attached():
        return "tpu"
    if os.path.exists("/dev/nvidiactl"):
        return "gpu"
    return "cpu"
