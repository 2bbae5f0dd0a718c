"""Where loopscale turns JAX's persistent compilation cache off.

The sweep runner shares one cache between the runs of a sweep (sweep/runner.py, `cache_env`),
so a shape compiled by one run loads in the next. On XLA:CPU an executable read back from the
cache deadlocks in collectives across devices: its devices reach different all-reduces, and
after 40 s the rendezvous aborts the process. Reproduced with a dropless Looped-MoE train step
on 8 virtual CPU devices: compiled fresh it trains, loaded from the cache in a second process
it aborts, every time (the test suite's first attempt at a shared cache died the same way).
So a process whose mesh spans several CPU devices compiles without the cache (parallel/mesh.py:
`make_mesh`, which every run, evaluation and compile builds its mesh with); one device, and
TPUs and GPUs, keep it.
"""

from __future__ import annotations

import sys

import jax
from jax.experimental.compilation_cache import compilation_cache


def off_for_cpu_collectives(mesh: jax.sharding.Mesh) -> bool:
    """Turns the persistent cache off for this process if it is on and `mesh` spans more than
    one CPU device (module docstring); says so in one line and returns True when it did."""
    devices = mesh.devices.flat
    if mesh.devices.size < 2 or devices[0].platform != "cpu":
        return False
    if not (jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir):
        return False
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # it may have been opened by an earlier compile
    sys.stderr.write(f"loopscale: persistent compilation cache off for this process: a mesh of "
                     f"{mesh.devices.size} CPU devices (XLA:CPU executables read back from it "
                     "deadlock in cross-device collectives)\n")
    return True
