"""Every test sees 8 virtual CPU devices (set before JAX initialises its backend); processes the
tests start inherit them, and `trainkit.cpu_env(n)` gives a process n devices instead.

Tests marked `gpu` need an NVIDIA GPU. They are deselected (not skipped: they are not part of
this suite's verdict) unless LOOPSCALE_TEST_GPU=1, which runs only them, on JAX's default
backend (benchmarks/gpu_check.sh sets it).

XLA:CPU compiles at its default optimisation level except in the files of COMPILE_BOUND, which
run with jax's `jax_disable_most_optimizations` (LLVM at -O0 without its expensive passes; XLA's
HLO passes unchanged). Measured file by file (2026-12-07, two whole `-n 2` runs, `--durations=0`,
one at each setting): a file whose time is compiling many small programs gets faster (test_flops
147 -> 85 s, test_model 83 -> 52, test_train_units 87 -> 54), a file whose programs run many
steps far slower (test_coordcheck 217 -> 589 s), and libtpu's compiles slower too
(test_weak_scaling 253 -> 404 s). So the setting is per file: the files listed are those that
were at least 7% and 3 s faster without the optimisations (336 s of the suite's 2,789 s). Their
results are the same to the tests' tolerances (the whole suite passed at either setting).

Where the time goes (2026-12-06, every compile of a whole `-n 2` run logged by a plugin around
jax's compile_or_get_cached: 26.6 minutes that day, 3,100 s summed over the tests): 3,805
compiles take 1,852 s, XLA:CPU on one device 1,053 s, on 8 virtual devices 361 s, libtpu's AOT
compiles 439 s; 281 compiles over 2 s each make 1,449 s of it (79 train steps, 688 s). Only
157 s recompiled a program compiled earlier in the run, which is all a persistent cache shared
between the workers could save in-process; and three in-process training files (eval,
patching, analysis) took 248 s on one device against 267 s on 8, run side by side. The time is
distinct programs, not repeats.

Tried and not adopted (2026-12-07): XLA:CPU's older fusion emitter
(`--xla_cpu_use_fusion_emitters=false`). It compiles a tiny train step faster (Base 4.6 -> 3.0 s,
Looped-MoE 10.7 -> 8.9 s; with the optimisations off 2.6 -> 1.4 s and 5.8 -> 2.5 s) but runs it
slower (Base 23.9 -> 28.2 ms a step), so file by file it is a wash (paired: test_flops 109 ->
91 s, test_model_parts 120 -> 134 s), and the whole suite under it failed two tests whose
subject is XLA:CPU's own output: an HLO-structure check of the MoE dispatch (no scatter left)
and two compiled programs equal to rtol 1e-6.
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
# file, 2026-12-07, with COMPILE_BOUND's optimisations off): `make test` runs files on two
# workers (pytest-xdist, --dist loadfile), handing out files in collection order, so this is
# longest-processing-time-first scheduling and the last files to start are the short ones. The
# Makefile passes --no-loadscope-reorder: by default xdist re-sorts files by their number of
# tests, which put the 2-test, 3-minute test_weak_scaling.py last, run by one worker while the
# other idled.
LONGEST_FIRST = ("test_coordcheck.py", "test_weak_scaling.py", "test_train.py",
                 "test_grad_reduction.py", "test_model_parts.py", "test_bench.py",
                 "test_compile.py", "test_flops.py", "test_sweep_plan.py", "test_analysis.py",
                 "test_eval_patching.py", "test_gpu.py", "test_eval.py", "test_object_store.py",
                 "test_sweep_runner.py", "test_attention_core.py", "test_moe.py", "test_model.py",
                 "test_branches.py", "test_train_units.py", "test_eval_lens.py",
                 "test_loop_schedule.py", "test_xla_flags.py", "test_multiprocess.py",
                 "test_scaling_holdout.py", "test_loop_modulation.py", "test_init.py",
                 "test_mup.py", "test_zero1.py", "test_sweep_train.py", "test_loss.py",
                 "test_sweep_workers.py", "test_scaling_parametric.py", "test_sweep_collect.py",
                 "test_report.py", "test_eval_mc.py", "test_sweep_launchers.py", "test_faults.py")


# The files that run with XLA's optimisations off (see the module docstring): compiling, not
# running, is their time. Set for the module before its fixtures (a module-scoped autouse
# fixture), and in the environment, for the processes its tests start.
COMPILE_BOUND = ("test_flops.py", "test_bench.py", "test_gpu.py", "test_train_units.py",
                 "test_eval_patching.py", "test_model.py", "test_eval.py", "test_loop_schedule.py",
                 "test_moe.py", "test_scaling_holdout.py", "test_mup.py", "test_loop_modulation.py",
                 "test_sweep_train.py", "test_scaling_parametric.py", "test_loss.py",
                 "test_eval_mc.py", "test_sweep_collect.py", "test_report.py", "test_flt_recipe.py",
                 "test_optimizer_mup.py", "test_rundir.py", "test_eval_olmes.py")


@pytest.fixture(scope="module", autouse=True)
def xla_optimisations(request):
    """Off for a COMPILE_BOUND file, on for every other: jax reads the flag at each compile."""
    off = request.path.name in COMPILE_BOUND
    jax.config.update("jax_disable_most_optimizations", off)
    with pytest.MonkeyPatch.context() as mp:
        if off:
            mp.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
        else:
            mp.delenv("JAX_DISABLE_MOST_OPTIMIZATIONS", raising=False)
        yield off
    jax.config.update("jax_disable_most_optimizations", False)


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
