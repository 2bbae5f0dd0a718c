"""MFU's denominators and numerators: the table of chip peaks (parallel/peaks.py), the peak a
run divides by (train/peak.py), and MaxText's count of model FLOPs (flops.py)."""

import dataclasses

import pytest

from loopscale import flops
from loopscale.aot import compile as aot
from loopscale.aot import topology
from loopscale.config import load_config, parse
from loopscale.config.schema import DType, FlopConvention
from loopscale.parallel import peaks
from loopscale.train import peak

# device_kind as JAX reports it on each chip (TPUs: libtpu's names; NVIDIA: the driver's).
KINDS = {
    "TPU v4": (275e12, 275e12),
    "TPU v5 lite": (197e12, 197e12),
    "TPU v5": (459e12, 459e12),
    "TPU v6 lite": (918e12, 918e12),
    "NVIDIA A100-SXM4-80GB": (312e12, 156e12),
    "NVIDIA H100 80GB HBM3": (989e12, 495e12),
    "NVIDIA H200": (989e12, 495e12),
    "NVIDIA B200": (2250e12, 1125e12),
}


@pytest.mark.parametrize("kind", KINDS)
def test_each_listed_chip_has_its_bf16_and_f32_peak(kind):
    bf16, f32 = KINDS[kind]
    assert peaks.peak_flops(kind, DType.BFLOAT16) == bf16
    assert peaks.peak_flops(kind, DType.FLOAT32) == f32


@pytest.mark.parametrize("kind", ["cpu", "TPU v3", "NVIDIA GeForce RTX 4090", "NVIDIA A10G",
                                  "NVIDIA H1000"])
def test_a_chip_not_listed_has_no_peak(kind):
    assert peaks.lookup(kind) is None and peaks.peak_flops(kind, DType.BFLOAT16) is None


@pytest.mark.parametrize("name", ["v5e:2x2", "v5p:2x2x1", "v6e:2x2"])
def test_the_compile_targets_peak_is_the_tables(name):
    """`loopscale compile --topology` divides by the peak the table gives for the chips libtpu
    makes for that topology, which name themselves."""
    target = aot.tpu_target(name)
    kind = topology.devices(topology.parse(name))[0].device_kind
    assert target.peak_flops == peaks.peak_flops(kind, DType.BFLOAT16) == KINDS[kind][0]


@dataclasses.dataclass
class FakeDevice:
    device_kind: str


def test_a_run_divides_by_the_configured_peak_then_the_tables_then_a_measured_one():
    h100 = FakeDevice("NVIDIA H100 80GB HBM3")
    assert peak.peak_flops(1e12, DType.BFLOAT16, h100) == 1e12  # configured wins
    assert peak.peak_flops(0.0, DType.BFLOAT16, h100) == 989e12
    assert peak.peak_flops(0.0, DType.FLOAT32, h100) == 495e12
    measured = peak.peak_flops(0.0, DType.FLOAT32, FakeDevice("cpu"))
    assert measured == peak.device_peak_flops() and 0 < measured < 1e14


@pytest.mark.parametrize("family", ["base", "looped_moe"])
def test_maxtext_count_drops_the_lookup_and_the_masked_half_of_attention(family):
    cfg = parse(load_config(f"experiments/{family}.py:paper")).model
    T = 2048
    p = flops.param_counts(cfg)
    # By hand: 6 x the matmul parameters a token meets (active, without the input embedding)
    # and, per layer use, the causal half of q.k and probs.v: 3 x (2 + 2) T H d_head / 2.
    hand = 6 * (p["params_active"] - cfg.vocab_size * cfg.d_model) \
        + cfg.effective_depth * 6 * T * cfg.n_heads * cfg.d_head
    assert flops.maxtext_flops_per_token(cfg, T) == pytest.approx(hand, rel=1e-12)
    full = flops.flops_per_token(cfg, T, FlopConvention.ATTENTION)
    assert flops.maxtext_flops_per_token(cfg, T) < full
