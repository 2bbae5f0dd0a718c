"""Side-by-side timing: the variants of a figure run interleaved in one process.

Each variant is a callable that does one unit of work and returns only when it is done (it
blocks on its results). After `warmup` rounds, `reps` rounds run every variant once in a fixed
order (A, B, A, B, ...), so slow drift of the machine (another process, thermal state) falls on
all variants alike; each variant's figure is the median of its samples, which ignores the odd
interrupted sample. The garbage collector is held off while a round runs.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Mapping


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds per unit of work, one sample per round."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def to_json(self) -> dict:
        return {"median_s": self.median, "min_s": min(self.samples),
                "max_s": max(self.samples), "samples": len(self.samples)}


def interleaved_samples(variants: Mapping[str, Callable[[], float]], reps: int,
                        warmup: int = 1) -> dict[str, Timing]:
    """Like `interleaved`, for variants that time themselves: each call returns its seconds
    (a compile that excludes its set-up, a batch of data divided by its size)."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(reps):
            for name, fn in variants.items():
                samples[name].append(float(fn()))
    finally:
        if enabled:
            gc.enable()
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def stopwatch(fn: Callable[[], object]) -> Callable[[], float]:
    def timed() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return timed


def interleaved(variants: Mapping[str, Callable[[], object]], reps: int,
                warmup: int = 1) -> dict[str, Timing]:
    """Median seconds of each variant over `reps` interleaved rounds, after `warmup` rounds."""
    return interleaved_samples({name: stopwatch(fn) for name, fn in variants.items()},
                               reps, warmup)


def ratio(timings: Mapping[str, Timing], num: str, den: str) -> float:
    return timings[num].median / timings[den].median
