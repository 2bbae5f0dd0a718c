"""Packing a sweep's runs onto the chips of one TPU slice, and the wall time that takes.

A run gets the smallest power-of-two number of chips its compiled train step fits on
(sizing.py). A run that fits on one host's chips is *packed*: while the runs of one chip count
are trained, every host is cut into equal blocks of that many chips and each block is a *slot*
that trains one run at a time, as its own process with its own chips; the slots take runs from
one queue, longest first, so no host idles while runs are left. Chip counts are trained in
turn (1, 2, 4, ...: one phase each), then the runs that need more chips than a host holds, one
after another on the whole slice (`--worker=all`, jax.distributed over every host), since a
sub-slice spanning some hosts is not something a process can ask libtpu for.

The wall-time estimate simulates exactly that schedule (the launch script follows the same
phases and queue order): per phase, each run in queue order starts on the slot that frees up
first. Its alternative, one run at a time on the whole slice, is the sum of the runs' times on
all of the slice's chips. A run's time is a fixed start-up (process start, compile, restore)
plus steps x the compiled step's estimated time.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from loopscale.aot import topology

FIRST_PORT = 8476  # libtpu's default process port; slot k of a host uses FIRST_PORT + k


@dataclasses.dataclass(frozen=True)
class Slice:
    """A TPU slice as the launcher sees it: how many chips, and how many on each host."""

    name: str  # as given, e.g. v5p-128
    generation: topology.Generation
    chips: int
    chips_per_host: int

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    def topology_name(self, chips: int) -> str:
        """The cloud's name of a slice of `chips` chips of this generation (v5p: 2 cores each)."""
        return f"{self.generation.name}-{chips * self.generation.cores_per_chip}"


def parse_slice(name: str) -> Slice:
    topo = topology.parse(name)
    gen, chips = topo.generation, topo.chips
    # Cloud TPU VMs hold 4 chips (2x2), except the single-host 8-chip v5e and v6e slices
    # (2x4 on one VM); smaller slices are one VM.
    per_host = 8 if gen.dims == 2 and chips == 8 else min(4, chips)
    return Slice(name, gen, chips, per_host)


@dataclasses.dataclass(frozen=True)
class Block:
    """`size` chips of host `worker`: block `index` of the host's equal blocks of that size."""

    worker: int
    index: int
    size: int

    @property
    def chips(self) -> tuple[int, ...]:
        return tuple(range(self.index * self.size, (self.index + 1) * self.size))

    @property
    def bounds(self) -> str:
        """TPU_CHIPS_PER_PROCESS_BOUNDS of a process owning these chips: the block's extent
        along the host's chip axes, as JAX's multi-process tests give it (a host's chips are
        numbered so that 2 consecutive chips are 1x2 and 4 are 2x2)."""
        return {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}[self.size]

    @property
    def port(self) -> int:
        return FIRST_PORT + self.index


def slots(slc: Slice, size: int) -> list[Block]:
    """Every host cut into blocks of `size` chips."""
    per = slc.chips_per_host // size
    return [Block(w, k, size) for w in range(slc.hosts) for k in range(per)]


@dataclasses.dataclass(frozen=True)
class Need:
    """What one run needs: chips, and its training time on them and on the whole slice."""

    run_id: str
    chips: int | None  # the smallest power of two its step fits on; None: not even the slice
    seconds: float | None  # steps x the step time on `chips` chips (None: unknown)
    slice_seconds: float | None  # on all of the slice's chips (None: its batch cannot split)


def packed(slc: Slice, need: Need) -> bool:
    return need.chips is not None and need.chips <= slc.chips_per_host


@dataclasses.dataclass(frozen=True)
class Phase:
    size: int | None  # chips per run, or None: the whole slice, one run at a time
    run_ids: tuple[str, ...]  # in queue order


def phases(slc: Slice, needs: Sequence[Need]) -> list[Phase]:
    """The launch order: packed runs by chip count, each queue longest first (the order that
    leaves the shortest tail), then the rest on the whole slice in plan order."""
    out = []
    for size in sorted({n.chips for n in needs if packed(slc, n)}):
        queue = [n for n in needs if packed(slc, n) and n.chips == size]
        queue.sort(key=lambda n: -(n.seconds or 0.0))  # stable: ties keep plan order
        out.append(Phase(size, tuple(n.run_id for n in queue)))
    rest = tuple(n.run_id for n in needs if not packed(slc, n))
    if rest:
        out.append(Phase(None, rest))
    return out


@dataclasses.dataclass(frozen=True)
class WallTime:
    seconds: float | None  # None: the schedule cannot be estimated (`problem` says why)
    problem: str = ""


def packed_wall_time(slc: Slice, needs: Sequence[Need], startup_s: float) -> WallTime:
    """The packed schedule's wall time (module docstring)."""
    by_id = {n.run_id: n for n in needs}
    total = 0.0
    for phase in phases(slc, needs):
        runs = [by_id[i] for i in phase.run_ids]
        if phase.size is None:
            whole = _serial(runs, startup_s)
            if whole.seconds is None:
                return whole
            total += whole.seconds
            continue
        if any(n.seconds is None for n in runs):
            return WallTime(None, f"no step time for some runs on {phase.size} chip(s)")
        free = [0.0] * len(slots(slc, phase.size))  # when each slot is next free
        end = 0.0
        for n in runs:  # the first slot to free up takes the next run of the queue
            start = heapq.heappop(free)
            finish = start + startup_s + n.seconds
            heapq.heappush(free, finish)
            end = max(end, finish)
        total += end
    return WallTime(total)


def serial_wall_time(slc: Slice, needs: Sequence[Need], startup_s: float) -> WallTime:
    """Every run in turn on all of the slice's chips."""
    return _serial(needs, startup_s, slc.chips)


def _serial(needs: Sequence[Need], startup_s: float, chips: int | None = None) -> WallTime:
    missing = [n for n in needs if n.slice_seconds is None]
    if missing:
        what = "fit on" if any(n.chips is None for n in missing) else "split their batch over"
        where = f"all {chips} chips" if chips else "the whole slice"
        return WallTime(None, f"{len(missing)} run(s) cannot {what} {where}")
    return WallTime(sum(startup_s + n.slice_seconds for n in needs))



def deal(jobs: Sequence[tuple[str, float]], bins: int) -> list[list[str]]:
    """(name, time) jobs dealt into `bins` queues: longest first, each to the queue with the
    least time so far (the lowest index on a tie); each queue in the order it was dealt."""
    queues: list[list[str]] = [[] for _ in range(bins)]
    load = [(0.0, i) for i in range(bins)]
    for name, seconds in sorted(jobs, key=lambda job: -job[1]):  # stable: ties keep their order
        total, i = heapq.heappop(load)
        queues[i].append(name)
        heapq.heappush(load, (total + seconds, i))
    return queues
