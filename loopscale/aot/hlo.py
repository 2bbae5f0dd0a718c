"""What a compiled program's HLO text says that its memory and cost analyses do not: the
collectives it runs (count and bytes), which of libtpu's asynchronous collectives have compute
scheduled while they move, and the hand-written kernels XLA's cost model cannot price (with the
FLOPs those kernels declare for themselves). Read from `compiled.as_text()` by aot/compile.py.
"""

from __future__ import annotations

import re

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
# One HLO instruction a line: `%name = TYPE op(operands), ...`, TYPE one array or a tuple of
# arrays; `-start` is the async form (its `-done` partner is not counted again).
_COLLECTIVE_RE = re.compile(
    r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(",
    re.MULTILINE)
_ARRAY_RE = re.compile(r"(\w+)\[([\d,]*)\]")
# Custom calls that run a hand-written kernel, which XLA's cost model prices at nothing: a
# Pallas kernel on TPU (a tpu_custom_call carrying Pallas's kernel_metadata; libtpu's own
# custom calls, such as ragged_dot's, carry none and are priced), cuDNN's fused attention, a
# Pallas GPU kernel through Triton.
_KERNEL_TARGETS = {"tpu_custom_call": "Pallas TPU kernel (splash attention, megablox)",
                   "__cudnn$fmha": "cuDNN fused attention",
                   "__gpu$xla.gpu.triton": "Pallas GPU kernel"}
_CUSTOM_CALL_RE = re.compile(r'custom_call_target="([^"]+)"')
# A Pallas TPU call's own cost estimate, in its backend config: "cost_estimate":{"flops":"N",..
_DECLARED_FLOPS_RE = re.compile(r'cost_estimate\\?":\{\\?"flops\\?":\\?"(\d+)')


def collectives(hlo_text: str) -> dict:
    """Count and bytes (of each op's result) of every collective in an HLO module's text."""
    out = {name: {"count": 0, "bytes": 0} for name in COLLECTIVES}
    for match in _COLLECTIVE_RE.finditer(hlo_text):
        result, op, started = match.groups()
        sizes = [_DTYPE_BYTES[dt] * _prod(dims) for dt, dims in _ARRAY_RE.findall(result)
                 if dt in _DTYPE_BYTES]
        if started:  # an async start returns (operands..., results...): count the results
            sizes = sizes[len(sizes) // 2:]
        out[op]["count"] += 1
        out[op]["bytes"] += sum(sizes)  # a combined collective returns a tuple: all of it moves
    return out


_ASYNC_START = re.compile(r"\s*(?:ROOT\s+)?%async-collective-start[\w.\-]* = ")
_ASYNC_DONE = re.compile(r"\s*(?:ROOT\s+)?%async-collective-done[\w.\-]* = ")
_COMPUTE = re.compile(
    r"\s*(?:ROOT\s+)?%(?!async-collective)[\w.\-]+ = .*\b(?:fusion|convolution)\(")


def async_collectives(hlo_text: str) -> dict:
    """libtpu's asynchronous collectives in a compiled module: how many start/done pairs, and
    how many have compute (a fusion or convolution) scheduled between the start and the next
    done of its computation, or after it to the computation's end (a start whose done is in
    the loop's next iteration)."""
    pairs = overlapped = 0
    for computation in re.split(r"\n\}\n", hlo_text):
        lines = computation.splitlines()
        for i, line in enumerate(lines):
            if not _ASYNC_START.match(line):
                continue
            pairs += 1
            for later in lines[i + 1:]:
                if _ASYNC_DONE.match(later):
                    break
                if _COMPUTE.match(later):
                    overlapped += 1
                    break
    return {"pairs": pairs, "with_compute_between": overlapped}


def unpriced_kernels(hlo_text: str) -> dict[str, int]:
    """How many calls of each hand-written kernel (_KERNEL_TARGETS) a compiled HLO module has."""
    found: dict[str, int] = {}
    for line in hlo_text.splitlines():
        for target in _CUSTOM_CALL_RE.findall(line):
            if target == "tpu_custom_call" and "kernel_metadata=" not in line:
                continue  # libtpu's own kernel, not Pallas's
            for prefix, name in _KERNEL_TARGETS.items():
                if target.startswith(prefix):
                    found[name] = found.get(name, 0) + 1
    return found


def declared_kernel_flops(hlo_text: str) -> float:
    """The FLOPs the Pallas TPU calls of a compiled HLO module declare for themselves."""
    return float(sum(int(n) for line in hlo_text.splitlines() if "kernel_metadata=" in line
                     for n in _DECLARED_FLOPS_RE.findall(line)))


def _prod(dims: str) -> int:
    n = 1
    for d in filter(None, dims.split(",")):
        n *= int(d)
    return n
