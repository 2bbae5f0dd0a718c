"""The GPU check's measurements (benchmarks/gpu_check.sh runs this module on one NVIDIA GPU).

    python -m loopscale.bench.gpu --out=runs/gpu_check/gpu_check.json [--tests=JUNIT.xml]

Three pairs of the project's own train step, each pair timed side by side (bench/timing.py:
interleaved rounds, medians) at one GPU's batch (`--batch`, 16 sequences by default; the
presets' global batches need a pod):
- Base `:paper` with cuDNN's fused attention and with the einsums (`model.attention=xla`);
- Looped `:paper` the same;
- MoE `:paper` with dropless and with capacity dispatch (factor 1.25).
For each: the measured step time, tokens a second, MFU as MaxText counts it (flops.py:
`maxtext_flops_per_token`, over the chip's bfloat16 peak from parallel/peaks.py), the compiled
step's memory, and for the first of each pair XLA's own estimate of the step time
(`loopscale compile`'s, aot/compile.py) beside the measured one. `--tests` folds the outcome of
the suite's `gpu`-marked tests (a JUnit XML file) into the same JSON.

`--size=tiny` runs the same cases on the `:tiny` presets, on any backend: how the CPU test
suite checks this module up to the point where it needs a GPU (on a CPU the cuDNN case is
recorded as not run, with the reason). `--size=paper` on anything but a GPU exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp

from loopscale import flops
from loopscale.aot import compile as aot
from loopscale.bench import steps, timing
from loopscale.config import AttentionImpl
from loopscale.config.schema import DType
from loopscale.errors import UsageError
from loopscale.model import attention_core
from loopscale.parallel import peaks

# (pair, family, the two variants' overrides): what each pair compares.
PAIRS = (
    ("attention", "base", {"cudnn": ["--config.model.attention=cudnn"],
                           "xla": ["--config.model.attention=xla"]}),
    ("attention", "looped", {"cudnn": ["--config.model.attention=cudnn"],
                             "xla": ["--config.model.attention=xla"]}),
    ("dispatch", "moe", {"dropless": ["--config.model.moe_dispatch=dropless"],
                         "capacity": ["--config.model.moe_dispatch=capacity"]}),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    size: str  # "paper" (the GPU check) or "tiny" (the CPU test of this module)
    batch: int  # sequences a step on the one GPU
    steps: int  # timed rounds (each variant one step a round), after 2 warm-up rounds
    budget_s: float  # pairs not started by then are recorded as not run (the 8-minute bound)
    families: tuple[str, ...] = ("base", "looped", "moe")  # the pairs of these families


def _config(family: str, overrides: list[str], s: Settings):
    """The family's preset at one GPU's batch: no accumulation, data=1, bfloat16 at tiny size
    too (the cuDNN kernel takes 16-bit inputs)."""
    common = [f"--config.train.batch_size={s.batch}", "--config.train.grad_accum=1",
              "--config.mesh.data=1", "--config.model.dtype=bfloat16"]
    if s.size == "tiny":
        common.append("--config.train.seq_len=128")
    return steps.load(f"{family}.py:{s.size}", common + overrides)


def _not_runnable(config) -> str | None:
    """Why a variant cannot run on this backend (None when it can)."""
    if config.model.attention is AttentionImpl.CUDNN and jax.default_backend() != "gpu":
        return f"cuDNN attention needs a GPU (backend: {jax.default_backend()})"
    return None


def _measure(config, step: steps.TrainStep, seconds: float, peak: float | None) -> dict:
    t = config.train
    per_token = flops.maxtext_flops_per_token(config.model, t.seq_len)
    tokens = t.batch_size * t.seq_len
    return {
        "step_s": seconds,
        "tokens_per_s": tokens / seconds,
        "model_flops_per_step_maxtext": per_token * tokens,
        "mfu_maxtext": per_token * tokens / seconds / peak if peak else None,
        "compile_s": step.compile_s,
        "memory": aot.memory(step.compiled),
    }


def run_pair(kind: str, family: str, variants: dict, s: Settings, peak: float | None) -> dict:
    configs = {name: _config(family, o, s) for name, o in variants.items()}
    out = {"pair": kind, "family": family, "size": s.size, "batch": s.batch,
           "seq_len": next(iter(configs.values())).train.seq_len, "variants": {}}
    runnable = {}
    for name in variants:
        why = _not_runnable(configs[name])
        if why:
            out["variants"][name] = {"not_run": why}
        else:
            runnable[name] = steps.TrainStep(configs[name])
    timed = timing.interleaved(runnable, reps=s.steps, warmup=2)
    for name, st in runnable.items():
        out["variants"][name] = _measure(configs[name], st, timed[name].median, peak)
    first = next(iter(runnable), None)
    if first is not None:
        cost = aot.step_cost(configs[first], steps.one_device())
        est = cost["est_step_time_s"]
        out["variants"][first].update(
            est_step_time_s=est, cost_warning=cost["cost_warning"],
            measured_over_estimated=out["variants"][first]["step_s"] / est if est else None)
    if len(runnable) == 2:
        a, b = runnable
        out[f"{a}_over_{b}"] = out["variants"][a]["step_s"] / out["variants"][b]["step_s"]
    return out


def junit_summary(path: str) -> dict:
    """Passed, failed, errors and the failing tests' names from a pytest JUnit XML file."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in cases
              if c.find("failure") is not None or c.find("error") is not None]
    skipped = sum(c.find("skipped") is not None for c in cases)
    return {"tests": len(cases), "passed": len(cases) - len(failed) - skipped,
            "failed": failed, "skipped": skipped}


def run(s: Settings, tests: str | None = None) -> dict:
    if s.size == "paper" and jax.default_backend() != "gpu":
        raise UsageError(f"the GPU check needs an NVIDIA GPU; JAX's backend is "
                         f"{jax.default_backend()} (install the gpu extra: make install-gpu)")
    device = jax.devices()[0]
    peak = peaks.peak_flops(device.device_kind, DType.BFLOAT16)
    report = {"date": datetime.date.today().isoformat(), "device_kind": device.device_kind,
              "backend": jax.default_backend(), "jax": jax.__version__,
              "peak_flops_bf16": peak, "attention_auto": _auto_here(), "pairs": []}
    start = time.perf_counter()
    for kind, family, variants in PAIRS:
        if family not in s.families:
            continue
        if time.perf_counter() - start > s.budget_s:
            report["pairs"].append({"pair": kind, "family": family,
                                    "not_run": f"past the {s.budget_s:.0f} s budget"})
            continue
        report["pairs"].append(run_pair(kind, family, variants, s, peak))
    report["seconds"] = time.perf_counter() - start
    if tests:
        report["gpu_tests"] = junit_summary(tests)
    return report


def _auto_here() -> str:
    """What `model.attention=auto` takes here for the paper presets (bfloat16, T 1024)."""
    return attention_core.resolve(AttentionImpl.AUTO, jax.default_backend(), jnp.bfloat16,
                                  1024).value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loopscale.bench.gpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--tests", help="a JUnit XML file of the gpu-marked tests to fold in")
    p.add_argument("--size", choices=("paper", "tiny"), default="paper")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=330.0)
    p.add_argument("--families", default="base,looped,moe", help="the pairs of these families")
    a = p.parse_args(argv)
    try:
        families = tuple(a.families.split(","))
        report = run(Settings(a.size, a.batch, a.steps, a.budget_s, families), a.tests)
    except UsageError as e:
        print(f"loopscale.bench.gpu: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
