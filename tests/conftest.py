"""Every test sees 8 virtual CPU devices (set before JAX initialises its backend), and XLA:CPU
compiles without LLVM's optimisations.

Why the optimisation level: the suite compiles hundreds of tiny programs and runs each a few
steps, so LLVM's optimisation of the generated code costs far more than it saves (measured:
tests/test_model.py 116 -> 67 s of CPU). It changes how fast the code runs, not what it
computes: XLA's HLO passes are the same; only the last bits of rounding move
(tests/test_xla_flags.py holds three train steps against the default level). libtpu's
compiles (the TPU tests) do not read it. Processes the tests start inherit the flags;
`trainkit.cpu_env(n)` gives n devices at the same level.
"""

import os

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), TEST_XLA_FLAGS, "--xla_force_host_platform_device_count=8"]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from loopscale.aot.topology import quiet_libtpu  # noqa: E402

quiet_libtpu()  # libtpu is installed for the TPU compile tests; keep its start-up quiet

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")

# The longest files first. `make test` runs files on two workers (pytest-xdist, --dist
# loadfile), handing out files in collection order; alphabetically the longest one
# (test_weak_scaling.py, minutes of TPU compiles) came last, and one worker then ran it alone
# while the other idled. Starting with the longest balances the two.
LONGEST_FIRST = ("test_weak_scaling.py", "test_compile.py", "test_coordcheck.py",
                 "test_train.py", "test_bench.py", "test_eval.py", "test_analysis.py",
                 "test_train_units.py", "test_eval_patching.py", "test_branches.py",
                 "test_sweep_train.py", "test_faults.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's own order is kept
