"""Weak scaling, as compiled for TPU v5p (libtpu's compiler on this CPU): every family needs
per chip on 8 chips at 8x the batch what it needs on 1 chip, under data and fsdp parallelism.
These compiles are what a CPU run cannot show: memory and FLOPs per chip."""

import pytest

from loopscale.aot import compile as aot
from loopscale.aot import topology
from loopscale.config import load_config, parse

topology.quiet_libtpu()

FAMILIES = ("base", "looped", "moe", "looped_moe")


@pytest.fixture(scope="module")
def v5p8():
    return topology.devices(topology.parse("v5p:2x2x2"))


@pytest.fixture(scope="module")
def v5p1():
    return topology.devices(topology.parse("v5p:1x1x1"))


def _config(family, *overrides):
    return parse(load_config(f"experiments/{family}.py:tiny", list(overrides)))


def _figures(config, devices):
    lowered, _ = aot.lower(config, devices)
    compiled = lowered.compile()
    return aot.memory(compiled), float(aot._cost(compiled)["flops"])


@pytest.mark.parametrize("family", FAMILIES)
def test_weak_scaling_on_eight_chips(family, v5p8, v5p1):
    """8 chips at global batch 8b need what 1 chip needs at batch b (per chip, within 1.2x),
    under data=8 and under fsdp=8; fsdp holds 1/8 of data parallel's parameters and optimiser
    state per chip. d_model 1024 so that an eighth of it still fills the TPU's 128-wide tiles
    (narrower shards are padded to 128 in memory, which tiny widths would measure instead);
    2 effective layers and 8k tokens a chip so that activations, the part that must scale,
    outweigh the gradient buffers of data parallelism's all-reduce, as they do at paper size."""
    b = 8
    loops = 2 if family.startswith("looped") else 1
    sizes = ("--config.model.d_model=1024", "--config.model.n_heads=8",
             "--config.model.head_dim=128", "--config.train.seq_len=1024",
             f"--config.model.n_unique={2 // loops}", f"--config.model.n_loops={loops}")
    one_mem, one_flops = _figures(_config(family, *sizes, f"--config.train.batch_size={b}"), v5p1)
    args = {}
    for mesh in ("data", "fsdp"):
        other = "fsdp" if mesh == "data" else "data"
        config = _config(family, *sizes, f"--config.train.batch_size={8 * b}",
                         f"--config.mesh.{mesh}=8", f"--config.mesh.{other}=1")
        mem, flops = _figures(config, v5p8)
        assert mem["temporaries"] <= 1.2 * one_mem["temporaries"], (mesh, mem, one_mem)
        assert flops <= 1.2 * one_flops, (mesh, flops, one_flops)
        args[mesh] = mem["arguments"]
    assert args["fsdp"] == pytest.approx(args["data"] / 8, rel=0.1)
