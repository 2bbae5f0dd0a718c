"""train.grad_reduction: the data-parallel gradient summed across devices once a step
(train/step.py `local_gradients`) rather than once per use of each shared weight. On 8 CPU
devices: the compiled step's all-reduce bytes do not grow with the loop count or the
micro-batches (they do under XLA's own partitioning), and it trains as XLA's step does."""

import jax
import numpy as np
import pytest

from loopscale import flops
from loopscale.aot import compile as aot
from loopscale.aot import topology
from loopscale.bench import steps
from loopscale.config import GradReduction
from loopscale.model import LoopedLM
from loopscale.parallel import mesh as mesh_lib
from loopscale.train import step as step_lib

DATA8 = ["--config.mesh.data=8", "--config.train.batch_size=16"]


def _all_reduce_bytes(reduction: str, loops: int, accum: int = 1, dtype: str = "float32",
                      devices=None) -> float:
    """All-reduce bytes of the looped tiny step, unrolled (so the HLO text holds every use:
    a scanned step's loop body appears once whatever its trip count), on 8 devices (this
    CPU's, unless `devices`)."""
    config = steps.load("looped.py:tiny", [
        *DATA8, f"--config.train.grad_reduction={reduction}", "--config.model.n_unique=2",
        f"--config.model.n_loops={loops}", "--config.model.scan=false",
        f"--config.train.grad_accum={accum}", f"--config.model.dtype={dtype}"])
    lowered, _ = aot.lower(config, devices or jax.devices()[:8])
    return aot.collectives(lowered.compile().as_text())["all-reduce"]["bytes"]


def test_one_all_reduce_a_step_whatever_the_loops_and_micro_batches():
    once = {k: _all_reduce_bytes("once", *k) for k in ((1, 1), (3, 2))}
    per_use = {k: _all_reduce_bytes("per_use", k) for k in (1, 3)}
    # The gradient (the unique parameters, float32) and a few scalars, once.
    assert once[3, 2] == pytest.approx(once[1, 1], rel=0.001), once
    assert once[1, 1] == pytest.approx(per_use[1], rel=0.01), (once, per_use)
    # XLA's own partitioning reduces each loop's share of the block's gradient as it is made.
    assert per_use[3] > 1.5 * per_use[1], per_use


def test_compiled_for_a_tpu_the_gradient_is_reduced_once_in_bfloat16():
    """On a v5p slice (libtpu on this CPU), computing in bfloat16: the one reduction is of
    the gradient in bfloat16, 2 bytes a parameter, and the loss (XLA:CPU would widen it)."""
    devices = topology.devices(topology.parse("v5p:2x2x2"))
    counts = flops.param_counts(steps.load("looped.py:tiny", ["--config.model.n_unique=2"]).model)
    params = counts["params_embedding"] + counts["params_unique"]
    got = _all_reduce_bytes("once", 3, 2, "bfloat16", devices)
    assert 2 * params <= got <= 2 * params + 64, (got, params)


def _two_steps(reduction: str):
    config = steps.load("looped.py:tiny", [*DATA8, f"--config.train.grad_reduction={reduction}",
                                           "--config.train.grad_accum=2"])
    step = steps.TrainStep(config, jax.devices()[:8])
    state, metrics = step.state, []
    for _ in range(2):
        state, m = step.compiled(state, step.batch, step.lr_factor)
        metrics.append(jax.device_get(m))
    return state, metrics


def test_reduced_once_trains_as_xlas_partitioning_does():
    (once, once_m), (xla, xla_m) = _two_steps("once"), _two_steps("per_use")
    for a, b in zip(once_m, xla_m):
        for key in ("loss", "ce", "grad_norm", "update_norm", "residual_norm"):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, err_msg=key)
    for a, b in zip(jax.tree.leaves(once.params), jax.tree.leaves(xla.params)):
        # Adam's first steps move each entry by about the LR whatever the gradient's size, so
        # an entry whose gradient is near zero is sensitive to the order of the sums
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family, overrides, axes", [
    ("looped.py:tiny", DATA8, ("data",)),
    ("base.py:tiny", DATA8, ("data",)),
    ("looped.py:tiny", [*DATA8, "--config.train.grad_reduction=per_use"], ()),
    ("looped.py:tiny", ["--config.mesh.data=1", "--config.mesh.fsdp=8",
                        "--config.train.batch_size=16"], ()),
    ("looped_moe.py:tiny", DATA8, ()),  # its load-balancing loss needs the whole batch
    ("looped.py:tiny", ["--config.mesh.data=4", "--config.mesh.fsdp=2",
                        "--config.train.batch_size=16"], ("data",)),
    ("looped.py:tiny", ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2",
                        "--config.model.n_heads=2", "--config.model.head_dim=32",
                        "--config.train.batch_size=16"], ()),  # XLA aborts on it (step.py)
])
def test_where_the_gradient_is_reduced_once(family, overrides, axes):
    config = steps.load(family, overrides)
    mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:8])
    with mesh_lib.activate(mesh):
        assert step_lib.once_axes(LoopedLM(config.model), config.train) == axes
    assert config.train.grad_reduction is GradReduction(
        "per_use" if "--config.train.grad_reduction=per_use" in overrides else "once")
