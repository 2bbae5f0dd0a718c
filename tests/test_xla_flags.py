"""The suite compiles XLA:CPU programs without LLVM's optimisations (conftest.py). That must
change only how fast they run and the last bits of rounding, not what they compute: a Looped-MoE train step (loops, experts, the
optimiser), three steps from the same state, gives the same losses and parameters at the
default level as at the suite's, up to rounding. Measured when written (2026-12-02): the three
losses bit for bit; 0.05% of the 361,472 parameters differ by more than 1e-6, the largest by
4.5e-5, where Adam's division by a near-zero second moment magnifies a last-bit difference."""

import subprocess
import sys

import numpy as np
import trainkit

STEPS = """
import sys
import jax, numpy as np
from loopscale.bench.steps import TrainStep, load
step = TrainStep(load("looped_moe.py:tiny"))
losses = []
for _ in range(3):
    step.state, metrics = step.compiled(step.state, step.batch, step.lr_factor)
    losses.append(float(metrics["loss"]))
np.savez(sys.argv[1], losses=np.asarray(losses),
         params=np.concatenate([np.ravel(x) for x in jax.tree.leaves(step.state.params)]))
"""


def run(xla_flags: str, path) -> dict:
    env = {**trainkit.cpu_env(1), "XLA_FLAGS": xla_flags}
    out = subprocess.run([sys.executable, "-c", STEPS, str(path)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(np.load(path))


def test_the_suites_optimisation_level_computes_what_the_default_does(tmp_path):
    from conftest import TEST_XLA_FLAGS

    assert "--xla_backend_optimization_level=0" in TEST_XLA_FLAGS  # the flag this is about
    one = "--xla_force_host_platform_device_count=1"
    suite = run(f"{TEST_XLA_FLAGS} {one}", tmp_path / "suite.npz")
    default = run(one, tmp_path / "default.npz")
    np.testing.assert_allclose(suite["losses"], default["losses"], rtol=1e-6, atol=0)
    assert suite["params"].shape == default["params"].shape
    # Adam divides by the root of the squared gradients, so where a gradient is near zero a
    # last-bit difference in it moves the update: a few parameters differ, by far less than a step.
    diff = np.abs(suite["params"] - default["params"])
    assert np.mean(diff > 1e-6) < 1e-3 and diff.max() < 1e-4
    assert np.abs(suite["params"]).max() > 1e-2  # parameters that are not all zero
