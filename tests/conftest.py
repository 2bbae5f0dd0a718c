"""Every test sees 8 virtual CPU devices (set before JAX initialises its backend); processes the
tests start inherit them, and `trainkit.cpu_env(n)` gives a process n devices instead.

Tests marked `gpu` need an NVIDIA GPU. They are deselected (not skipped: they are not part of
this suite's verdict) unless LOOPSCALE_TEST_GPU=1, which runs only them, on JAX's default
backend (benchmarks/gpu_check.sh sets it).

XLA:CPU compiles at its default optimisation level. Tried and measured (2026-12-02): without
LLVM's optimisations (--xla_backend_optimization_level=0) the compile-bound files got faster
(tests/test_model.py 101 -> 64 s of CPU) but the run-bound ones far slower (the MoE coordinate
check 44 -> 316 s), the whole suite on a fresh clone took longer (28 against 20 minutes), and
the initialisation digests of tests/test_init.py moved, so the suite keeps the default.

Where the time goes (2026-12-06, every compile of a whole `-n 2` run logged by a plugin around
jax's compile_or_get_cached: 26.6 minutes that day, 3,100 s summed over the tests): 3,805
compiles take 1,852 s, XLA:CPU on one device 1,053 s, on 8 virtual devices 361 s, libtpu's AOT
compiles 439 s; 281 compiles over 2 s each make 1,449 s of it (79 train steps, 688 s). Only
157 s recompiled a program compiled earlier in the run, which is all a persistent cache shared
between the workers could save in-process; and three in-process training files (eval,
patching, analysis) took 248 s on one device against 267 s on 8, run side by side. The time is
distinct programs, not repeats.
"""

import os

import pytest

GPU_RUN = os.environ.get("LOOPSCALE_TEST_GPU") == "1"
# gcsfs reads this once, at import: its experimental client asks each bucket for its layout over
# gRPC, which the object-store tests' emulator (tests/gcs.py) does not serve.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]).strip()
if not GPU_RUN:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loopscale.aot.topology import quiet_libtpu  # noqa: E402

quiet_libtpu()  # libtpu is installed for the TPU compile tests; keep its start-up quiet

import jax  # noqa: E402

if not GPU_RUN:
    jax.config.update("jax_platforms", "cpu")

# The longest files first, in the order of their measured time (`--durations=0`, summed per
# file, 2026-12-05): `make test` runs files on two workers (pytest-xdist, --dist loadfile),
# handing out files in collection order, so this is longest-processing-time-first scheduling and
# the last files to start are the short ones. The Makefile passes --no-loadscope-reorder: by
# default xdist re-sorts files by their number of tests, which put the 2-test, 3-minute
# test_weak_scaling.py last, run by one worker while the other idled.
LONGEST_FIRST = ("test_coordcheck.py", "test_train.py", "test_weak_scaling.py",
                 "test_train_units.py", "test_bench.py", "test_flops.py", "test_eval.py",
                 "test_compile.py", "test_model.py", "test_branches.py", "test_analysis.py",
                 "test_multiprocess.py", "test_eval_patching.py", "test_eval_lens.py",
                 "test_model_parts.py", "test_loop_schedule.py", "test_loop_modulation.py",
                 "test_gpu.py", "test_attention_core.py", "test_object_store.py",
                 "test_xla_flags.py", "test_zero1.py", "test_grad_reduction.py",
                 "test_sweep_plan.py",
                 "test_scaling_holdout.py", "test_moe.py", "test_mup.py",
                 "test_init.py", "test_sweep_runner.py", "test_loss.py", "test_sweep_train.py",
                 "test_sweep_collect.py", "test_scaling_parametric.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's own order is kept
    on_gpu = [bool(i.get_closest_marker("gpu")) for i in items]
    config.hook.pytest_deselected(items=[i for i, g in zip(items, on_gpu) if g != GPU_RUN])
    items[:] = [i for i, g in zip(items, on_gpu) if g == GPU_RUN]


@pytest.fixture
def runs_on_one_device(monkeypatch):
    """The processes a test starts (a sweep's runs) see one CPU device, as on a user's CPU
    machine, where `loopscale sweep` shares one compilation cache between its runs; this
    process keeps its 8. (Inheriting the 8, each tiny run would shard over 8 virtual devices
    and compile without the cache: xla_cache.off_for_cpu_collectives.)"""
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
