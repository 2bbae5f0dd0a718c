"""The peak FLOP rate MFU is measured against, per chip: configured (`train.peak_flops`), else
the chip's from the table of accelerators (parallel/peaks.py, by JAX's device_kind and the
model's dtype), else (a CPU, or a chip the table lacks) measured once per process as the best
rate of a large float32 matmul."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from loopscale.config.schema import DType
from loopscale.parallel import peaks


def peak_flops(configured: float, dtype: DType, device=None) -> float:
    """The peak a run's MFU divides by (see the module docstring); `device`: jax.devices()[0]."""
    if configured:
        return configured
    device = jax.devices()[0] if device is None else device
    listed = peaks.peak_flops(device.device_kind, dtype)
    return listed if listed else device_peak_flops()


@functools.cache
def device_peak_flops(size: int = 1024, repeats: int = 5) -> float:
    """Best observed FLOP/s of a (size x size) @ (size x size) float32 matmul on device 0. On a
    CPU that one matmul already uses every core, so it is the machine's rate, however many
    virtual devices share those cores."""
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()  # compile
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best
