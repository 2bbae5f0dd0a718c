"""TPU topologies by name, as devices XLA can compile for on a machine without TPUs.

Two spellings are accepted: libtpu's topology strings (`v5p:4x4x4`, `v5e:16x16`, `v6e:16x16`)
and the cloud's accelerator names (`v5p-128`, `v5litepod-256`, `v6e-256`). In the cloud's
names v5p counts TensorCores (two per chip), v5e and v6e count chips, so `v5p-128` is 64
chips laid out 4x4x4. A count of chips becomes the most cubic (v5p: 3-D torus) or square (v5e, v6e: 2-D) power-of-two layout, the shapes the cloud provisions.
Several slices (`slices=2`) are joined over the data-centre network (DCN).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from loopscale.errors import UsageError
from loopscale.parallel.xla_flags import tpu_attached


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str  # libtpu's prefix: v5e, v5p, v6e
    dims: int  # torus dimensions
    cores_per_chip: int  # in the cloud's accelerator names
    hbm_bytes: float  # per chip, what a program may use (its peak: parallel/peaks.py)
    aliases: tuple[str, ...] = ()


# HBM: what libtpu's compiler says a program may use on one chip (its out-of-memory error
# names it: 95.74G, 15.75G, 31.25G, in GiB), a little under the chips' 95/16/32 GiB.
GENERATIONS = {
    g.name: g for g in (
        Generation("v5e", 2, 1, 15.75 * 2**30, aliases=("v5litepod",)),
        Generation("v5p", 3, 2, 95.74 * 2**30),
        Generation("v6e", 2, 1, 31.25 * 2**30),
    )
}
_ALIASES = {a: g for g in GENERATIONS.values() for a in (g.name, *g.aliases)}


@dataclasses.dataclass(frozen=True)
class Topology:
    generation: Generation
    shape: tuple[int, ...]  # chips along each torus axis
    slices: int = 1

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.shape)

    @property
    def chips(self) -> int:
        return self.chips_per_slice * self.slices

    @property
    def name(self) -> str:
        return f"{self.generation.name}:{'x'.join(map(str, self.shape))}"


def _layout(name: str, chips: int, dims: int) -> tuple[int, ...]:
    """The most balanced power-of-two layout of `chips` over `dims` axes, as the cloud lays it
    out: smallest first, except that unused axes (1) come last (v5p-8 is 2x2x1)."""
    if chips < 1 or chips & (chips - 1):
        raise UsageError(f"--topology={name!r}: {chips} chips is not a power of two; give the "
                         "layout instead (e.g. v5p:4x4x8)")
    exps = [0] * dims
    for i in range(int(math.log2(chips))):
        exps[i % dims] += 1
    return tuple(sorted(2**e for e in exps if e)) + (1,) * exps.count(0)


def parse(name: str, slices: int = 1) -> Topology:
    """`v5p:4x4x4`, `v5p-128`, `v5litepod-256`, ... -> Topology (UsageError if unknown)."""
    if slices < 1:
        raise UsageError(f"--slices={slices} must be at least 1")
    m = re.fullmatch(r"(v\d+[a-z]*?(?:litepod)?)[:-](.+)", name.strip().lower())
    gen = _ALIASES.get(m.group(1)) if m else None
    if gen is None:
        known = ", ".join(sorted(_ALIASES))
        raise UsageError(f"--topology={name!r}: expected GEN:AxBxC or GEN-N with GEN one of {known}")
    rest = m.group(2)
    if re.fullmatch(r"\d+(x\d+)+", rest):  # libtpu's layout
        shape = tuple(int(x) for x in rest.split("x"))
        if len(shape) != gen.dims:
            raise UsageError(f"--topology={name!r}: {gen.name} layouts have {gen.dims} axes")
    elif rest.isdigit():  # the cloud's accelerator name
        n = int(rest)
        if n % gen.cores_per_chip:
            raise UsageError(f"--topology={name!r}: {gen.name} names count {gen.cores_per_chip} "
                             "cores per chip")
        shape = _layout(name, n // gen.cores_per_chip, gen.dims)
    else:
        raise UsageError(f"--topology={name!r}: expected a layout like {gen.name}:"
                         f"{'x'.join(['2'] * gen.dims)} or a size like {gen.name}-8")
    return Topology(gen, shape, slices)


def quiet_libtpu() -> None:
    """Keeps libtpu's start-up from printing warnings on a host without TPUs: with libtpu
    installed, JAX loads it at start-up (and the topology compiler loads it too), and it then
    complains that it cannot find the TPU metadata. Call before JAX initialises a backend."""
    if tpu_attached():
        return
    # Compiling only: several processes (test workers, sweep slots) may load libtpu at once,
    # which its lock file would otherwise refuse.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")  # any valid name; never used to run
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")


def devices(topo: Topology) -> list:
    """Abstract devices of `topo` for `jax.jit(...).lower(...).compile()`; needs libtpu."""
    try:
        from jax.experimental import topologies
    except ImportError as e:  # pragma: no cover - jax always ships it
        raise UsageError(f"this jax cannot compile for TPU topologies: {e}") from None
    kwargs = {}
    if topo.chips_per_slice < 4:  # a host holds 2x2(x1) chips unless told otherwise
        kwargs["chips_per_host_bounds"] = (*topo.shape, 1)[:3] if topo.generation.dims == 2 \
            else topo.shape
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topo.name,
                                            num_slices=topo.slices, **kwargs)
    except Exception as e:  # libtpu missing, or a layout it rejects
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"cannot compile for {topo.name} x {topo.slices} slice(s): {first} "
                         "(install the TPU compiler: pip install -e '.[tpu]')") from None
    return list(desc.devices)
