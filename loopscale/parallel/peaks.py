"""Peak dense matmul FLOP/s of one accelerator chip, by the name JAX gives it (`device_kind`), for
MFU: what a step's model FLOPs per second are divided by.

The figures are the vendors' dense (no 2:4 sparsity) tensor-core or MXU peaks per chip:
- TPUs (Google Cloud's system-architecture pages): v4 275, v5e 197, v5p 459, v6e 918 TFLOP/s in
  bfloat16. A float32 matmul at JAX's default precision runs on the MXU as one bfloat16 pass,
  so it is measured against the same peak; `precision=HIGHEST` (six passes) would be a sixth.
- NVIDIA (the A100, H100, H200 and B200 datasheets, SXM parts): bfloat16 312, 989, 989, 2250
  TFLOP/s; float32 as JAX runs it by default on these GPUs, in TF32 on the tensor cores: 156,
  495, 495, 1125 TFLOP/s. PCIe and NVL parts of the same name clock lower; set
  `train.peak_flops` for them, as for any chip not listed.
A CPU has no entry: the trainer measures a matmul instead (train/peak.py).
"""

from __future__ import annotations

import dataclasses

from loopscale.config.schema import DType


@dataclasses.dataclass(frozen=True)
class Peak:
    chip: str  # the name a figure is reported under
    kinds: tuple[str, ...]  # lower-case device_kind strings JAX reports for it (exact match)
    bf16: float
    f32: float


PEAKS = (
    Peak("TPU v4", ("tpu v4",), 275e12, 275e12),
    Peak("TPU v5e", ("tpu v5 lite", "tpu v5e"), 197e12, 197e12),
    Peak("TPU v5p", ("tpu v5", "tpu v5p"), 459e12, 459e12),
    Peak("TPU v6e", ("tpu v6 lite", "tpu v6e"), 918e12, 918e12),
    Peak("NVIDIA A100", ("a100",), 312e12, 156e12),
    Peak("NVIDIA H100", ("h100",), 989e12, 495e12),
    Peak("NVIDIA H200", ("h200",), 989e12, 495e12),
    Peak("NVIDIA B200", ("b200",), 2250e12, 1125e12),
)


def lookup(device_kind: str) -> Peak | None:
    """The table's row for a device_kind ("TPU v5 lite", "NVIDIA H100 80GB HBM3", ...): TPUs by
    their exact name, NVIDIA parts by the model number in it; None when it is not listed."""
    kind = device_kind.strip().lower()
    for peak in PEAKS:
        if kind in peak.kinds:
            return peak
    if kind.startswith("nvidia"):
        words = kind.replace("-", " ").split()
        for peak in PEAKS:
            if any(k in words for k in peak.kinds):
                return peak
    return None


def peak_flops(device_kind: str, dtype: DType) -> float | None:
    """Per-chip peak FLOP/s for matmuls in `dtype` (the model's compute dtype), or None."""
    peak = lookup(device_kind)
    if peak is None:
        return None
    return peak.bf16 if dtype is DType.BFLOAT16 else peak.f32
