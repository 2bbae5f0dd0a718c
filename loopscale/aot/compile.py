"""Compile the real train (or eval) step for a set of devices and read back what it needs.

The step is the trainer's own (`trainer.jit_train_step` / `evaluate.lm.jit_eval_step`, or with
`eval:NAME` the device step of a `loopscale eval` measurement over LM data: `jsd`, `early_exit`,
`routing`, bound as `loopscale eval` binds it), with
the trainer's mesh, shardings and donation, lowered on abstract inputs (nothing is allocated)
inside the mesh context, then compiled by XLA for the target devices: TPU chips of a topology
this host does not have (libtpu's compiler), or the local devices.

What comes back, per chip:
- memory: XLA's buffer assignment of the compiled program (arguments, outputs, the part of
  the outputs aliased to donated arguments, temporaries, generated code);
- flops and the estimated step time: XLA's cost analysis. It counts the body of a `while`
  loop once whatever its trip count, so the scanned program (loops x layers) would be
  under-counted. The estimate is therefore read from four shallow unrolled compiles of the same
  step (1 or 2 loops of 1 or 2 layers) and extrapolated, since the cost is linear in both:
  cost(K, L) = X + L a0 + (K - 1)(L a1 + b1), where X is everything outside the layers
  (embedding, readout, loss, optimiser of the vocabulary matrices), a0 a layer on loop 1,
  a1 a layer on a later loop (injection adds work there) and b1 a later loop's own work.
  A train step in A micro-batches (`train.grad_accum`) is compiled at each point with one
  micro-batch (c1) and with two, unrolled (c2): what the second added is a micro-batch's
  work, the rest (the optimiser's update, a gradient reduced or parameters gathered once a
  step) is done once, so the step costs c1 + (A - 1)(c2 - c1);
- collectives: all-gather, reduce-scatter, all-reduce, all-to-all and collective-permute
  read from the compiled HLO (aot/hlo.py), count and bytes per step (extrapolated the same
  way).
Compiled for TPU, the step gets the launched runs' flags (parallel/xla_flags.py: collectives
overlapped with compute), and `async_collectives` counts the collectives split into start/done
pairs and how many of those have compute scheduled between the two.
XLA's cost model does not price a custom kernel (splash attention's and megablox's Pallas
calls, cuDNN's fused attention): its FLOPs and time are missing from the estimate, and
`cost_warning` says so, naming the kernels found in the compiled program. A Pallas kernel may
declare its own cost (megablox does: 2 m k n a grouped matmul; splash declares none); those
declared FLOPs are summed from the compiled program into `kernel_flops_per_chip`, beside XLA's.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from loopscale import flops as flops_lib
from loopscale.aot import kept, topology
from loopscale.aot.hlo import (COLLECTIVES, async_collectives, collectives,
                                declared_kernel_flops, unpriced_kernels)
from loopscale.aot.steps import MEASURE_STEPS
from loopscale.config import Config
from loopscale.config.schema import DType, FFNKind, FlopConvention
from loopscale.errors import UsageError
from loopscale.train import eval_loss
from loopscale.train import step as step_lib
from loopscale.parallel import mesh as mesh_lib
from loopscale.parallel import peaks, xla_flags
from loopscale.train import trainer

def _measure_step(config: Config, step: str):
    from loopscale.evaluate import divergence, early_exit, routing

    if step == "eval:routing" and config.model.ffn is not FFNKind.MOE:
        raise UsageError(f"--step=eval:routing needs an MoE model; {config.name} has "
                         f"model.ffn={config.model.ffn.value}")
    return {"eval:jsd": divergence.jsd_step,
            "eval:early_exit": functools.partial(  # thresholds are data: any values will do
                early_exit.exit_step, taus=np.zeros(early_exit.N_TAU, np.float32)),
            "eval:routing": routing.routing_step}[step]


def abstract_batch(config: Config, sharding) -> dict:
    """The global batch the trainer feeds the step, as shapes with the batch sharding."""
    t = config.train
    B, T = t.batch_size, t.seq_len

    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    batch = {"inputs": spec((B, T), jnp.int32), "targets": spec((B, T), jnp.int32),
             "mask": spec((B, T), jnp.bool_)}
    if t.intermediate_supervision:  # the looped model's per-loop labels (data/permutation.py)
        batch.update(loop_labels=spec((B, config.model.n_loops), jnp.int32),
                     answer_pos=spec((B,), jnp.int32))
    return batch


def lower(config: Config, devices, step: str = "train"):
    """The trainer's step for `config` on `devices`, lowered on abstract inputs."""
    s = trainer.setup(config, devices)
    state = trainer.abstract_state(s)
    batch = abstract_batch(config, s.batch_sharding)
    with mesh_lib.activate(s.mesh):
        if step == "train":
            lr = jax.ShapeDtypeStruct((), jnp.float32, sharding=mesh_lib.replicated(s.mesh))
            return trainer.jit_train_step(s, config.model.n_loops).lower(state, batch, lr), s
        if step in MEASURE_STEPS:
            eval_fn = jax.jit(functools.partial(_measure_step(config, step), model=s.model,
                                                train=config.train, n_loops=config.model.n_loops),
                              in_shardings=(s.state_shardings.params, s.batch_sharding))
        else:
            eval_fn = eval_loss.jit_eval_step(s.model, config.train, config.model.n_loops,
                                       param_shardings=s.state_shardings.params,
                                       batch_sharding=s.batch_sharding)
        return eval_fn.lower(state.params, batch), s


def _options(devices) -> dict:
    return xla_flags.compiler_options(next(iter(devices)).platform)


def compile_lowered(lowered, devices):
    """The lowered step compiled with the flags of its devices' platform, as a launched run
    compiles it (none on a CPU)."""
    return lowered.compile(compiler_options=_options(devices))


def memory(compiled) -> dict:
    m = compiled.memory_analysis()
    out = {
        "arguments": int(m.argument_size_in_bytes),
        "outputs": int(m.output_size_in_bytes),
        "aliased": int(m.alias_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
        "code": int(m.generated_code_size_in_bytes),
    }
    # Donated arguments alias outputs: those bytes are held once.
    out["total"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"] \
        + out["code"]
    return out


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    return dict(cost or {})


def _shallow(config: Config, loops: int, layers: int, accum: int = 1) -> Config:
    """`config` at `loops` x `layers`, unrolled, with `accum` of its micro-batches a step."""
    model = dataclasses.replace(config.model, n_loops=loops, n_unique=layers, scan=False)
    t = config.train
    train = dataclasses.replace(t, batch_size=t.batch_size // t.grad_accum * accum,
                                grad_accum=accum)
    return dataclasses.replace(config, model=model, train=train)


def _extrapolate(c: dict, loops: int, layers: int) -> float:
    """cost(K, L) = X + L a0 + (K - 1)(L a1 + b1) from c[(k, l)] at k, l in {1, 2}."""
    a0 = c[1, 2] - c[1, 1]
    if loops == 1:
        return c[1, 1] + (layers - 1) * a0
    a1 = c[2, 2] - c[2, 1] - a0
    b1 = c[2, 1] - c[1, 1] - a1
    x = c[1, 1] - a0
    return x + layers * a0 + (loops - 1) * (layers * a1 + b1)


def _figures(config: Config, devices, step: str, kernels: dict) -> dict[str, float]:
    """XLA's cost and collectives of `config`'s step compiled for `devices`; the custom kernels
    XLA cannot price are added to `kernels`. Micro-batches are unrolled, so that all count."""
    with step_lib.unrolled_micro_batches():
        lowered, _ = lower(config, devices, step)

    def read() -> dict:
        compiled = compile_lowered(lowered, devices)
        cost = _cost(compiled)
        hlo = compiled.as_text()
        coll = collectives(hlo)
        return {"kernels": unpriced_kernels(hlo), "figures": {
            "flops": float(cost.get("flops", 0.0)), "kernel_flops": declared_kernel_flops(hlo),
            "seconds": float(cost.get("optimal_seconds", 0.0)),
            **{f"{op}/{key}": float(coll[op][key]) for op in COLLECTIVES
               for key in ("count", "bytes")}}}

    got = kept.figures("cost", lowered, devices, _options(devices), read)
    kernels.update(got["kernels"])
    return got["figures"]


def step_cost(config: Config, devices, step: str = "train") -> dict:
    """XLA's per-chip flops, step time (`optimal_seconds`) and collectives of the whole step,
    extrapolated from shallow unrolled compiles (module docstring)."""
    K, L = config.model.n_loops, config.model.n_unique
    points = [(1, 1), (1, 2)] + ([(2, 1), (2, 2)] if K > 1 else [])
    accum = config.train.grad_accum
    # A train step in micro-batches is a part done once (the optimiser's update; the gradient's
    # reduction and fsdp's gather, where they happen once a step) and a part done per
    # micro-batch; one and two micro-batches a step tell them apart. The eval steps have no
    # such part: all is per micro-batch.
    twice = accum > 1 and step == "train"
    figures, kernels, seconds = {}, {}, []
    for k, l in points:
        one = _figures(_shallow(config, k, l), devices, step, kernels)
        seconds.append(one["seconds"])
        if twice:
            two = _figures(_shallow(config, k, l, accum=2), devices, step, kernels)
            seconds.append(two["seconds"])
            figures[k, l] = {name: one[name] + (accum - 1) * (two[name] - one[name])
                             for name in one}
        else:
            figures[k, l] = {name: accum * value for name, value in one.items()}
    est = {name: _extrapolate({p: f[name] for p, f in figures.items()}, K, L)
           for name in figures[1, 1]}
    out = {
        "xla_flops_per_chip": est["flops"],
        "kernel_flops_per_chip": est["kernel_flops"],
        "est_step_time_s": est["seconds"] or None,  # 0: this backend's model has no time
        "cost_warning": None,
        "collectives": {op: {"count": round(est[f"{op}/count"]), "bytes": est[f"{op}/bytes"]}
                        for op in COLLECTIVES},
    }
    warnings = []
    if min(seconds) < 0:
        # libtpu's cost model prices some instructions at -1 s (measured: sort and the top_k
        # custom call, which the model therefore avoids; a program over several slices comes
        # out negative too; so do megablox's group bookkeeping or its kernels); a negative
        # sum is no estimate.
        out["est_step_time_s"] = None
        warnings.append("XLA's cost model gives a negative step time for this program "
                        "(measured for sort, the top_k custom call, megablox, and programs over "
                        "several slices)")
    if kernels:
        warnings.append(f"XLA's cost model does not price {' or '.join(sorted(kernels))}: its "
                        "FLOPs and time are missing from xla_flops_per_chip, est_step_time_s "
                        "and est_mfu, which are therefore optimistic (the FLOPs the kernels "
                        "declare themselves are kernel_flops_per_chip)")
    out["cost_warning"] = "; ".join(warnings) or None
    return out


# libtpu refuses to compile a program that does not fit, naming what it needs (in GiB).
_OOM_RE = re.compile(r"memory required for HLO temporaries \(([\d.]+)G\) exceeds available HBM")


def _shard_bytes(tree) -> int:
    return sum(x.dtype.itemsize * math.prod(x.sharding.shard_shape(x.shape))
               for x in jax.tree.leaves(tree))


def compile_step(config: Config, devices, step: str = "train") -> dict:
    """Memory of the real (scanned) step compiled for `devices`, and how long that took. A
    step the compiler refuses for lack of memory is reported from its error: the temporaries
    it needs, the arguments from their shardings (`memory_per_chip.from_error` is then true)."""
    t0 = time.perf_counter()
    lowered, s = lower(config, devices, step)

    def read() -> dict:
        try:
            compiled = compile_lowered(lowered, devices)
        except jax.errors.JaxRuntimeError as e:
            need = _OOM_RE.search(str(e))
            if not need:
                raise
            state = trainer.abstract_state(s)
            args = _shard_bytes((state if step == "train" else state.params,
                                 abstract_batch(config, s.batch_sharding)))
            temps = int(float(need.group(1)) * 2**30)
            return {"memory_per_chip": {"arguments": args, "outputs": None, "aliased": None,
                                        "temporaries": temps, "code": None,
                                        "total": args + temps, "from_error": True},
                    "async_collectives": None}
        return {"memory_per_chip": memory(compiled),
                "async_collectives": async_collectives(compiled.as_text())}

    got = kept.figures("memory", lowered, devices, _options(devices), read)
    return {"mesh": dict(s.mesh.shape), **got, "compile_time_s": time.perf_counter() - t0}


@dataclasses.dataclass(frozen=True)
class Target:
    """What to compile for: devices, and the chip's HBM and peak rate (None where unknown)."""

    name: str
    devices: list
    slices: int
    hbm_bytes: float | None
    peak_flops: float | None


def tpu_target(name: str, slices: int = 1) -> Target:
    topo = topology.parse(name, slices)
    devices = topology.devices(topo)
    # The chips' bfloat16 peak (a float32 matmul at default precision is one bf16 MXU pass).
    peak = peaks.peak_flops(devices[0].device_kind, DType.BFLOAT16)
    return Target(topo.name, devices, slices, topo.generation.hbm_bytes, peak)


def local_target(peak_flops: float = 0.0, dtype: DType = DType.BFLOAT16) -> Target:
    """The local devices (GPUs where present): HBM from the runtime's own limit, the peak
    given, or else the chip's from the table (parallel/peaks.py; None for a CPU or a chip it
    does not list) for matmuls in `dtype`."""
    devices = jax.devices()
    stats = devices[0].memory_stats() or {}
    peak = peak_flops or peaks.peak_flops(devices[0].device_kind, dtype)
    return Target(f"local:{devices[0].platform}", devices, 1, stats.get("bytes_limit"), peak)


def model_flops(config: Config, step: str = "train", maxtext: bool = False) -> float:
    """Model FLOPs of one step: 6N per token for training (forward 2N + backward 4N), 2N for a
    forward-only evaluation; recomputation not counted. By default N holds the input embedding
    and the attention matmuls are counted in full (`6n_attn`); `maxtext` counts as MaxText does
    for its MFU: no embedding lookup, causal attention (flops.maxtext_flops_per_token)."""
    t = config.train
    per_token = (flops_lib.maxtext_flops_per_token(config.model, t.seq_len) if maxtext else
                 flops_lib.flops_per_token(config.model, t.seq_len, FlopConvention.ATTENTION))
    return per_token * t.batch_size * t.seq_len * (1.0 if step == "train" else 1 / 3)


def est_mfu(config: Config, target: Target, seconds: float | None, step: str = "train",
            maxtext: bool = False) -> float | None:
    """Model FLOPs per chip per second over the chip's peak, at XLA's estimated step time."""
    if not seconds or not target.peak_flops:
        return None
    return model_flops(config, step, maxtext) / len(target.devices) / seconds / target.peak_flops


def report(config: Config, target: Target, step: str = "train", cost: bool = True) -> dict:
    """Everything `loopscale compile` prints (commands/compile.py documents the keys)."""
    t = config.train
    compiled = compile_step(config, target.devices, step)
    mem = compiled["memory_per_chip"]
    hbm = target.hbm_bytes
    out = {
        "topology": target.name,
        "chips": len(target.devices),
        "slices": target.slices,
        "device_kind": target.devices[0].device_kind,
        "step": step,
        "mesh": compiled["mesh"],
        "global_batch": t.batch_size,
        "seq_len": t.seq_len,
        "n_loops": config.model.n_loops,
        "dtype": config.model.dtype.value,
        "hbm_bytes_per_chip": hbm,
        "memory_per_chip": mem,
        "hbm_fraction": mem["total"] / hbm if hbm else None,
        "fits": mem["total"] <= hbm if hbm else None,
        "model_flops_per_step": model_flops(config, step),
        "model_flops_per_step_maxtext": model_flops(config, step, maxtext=True),
        "xla_flops_per_chip": None,
        "kernel_flops_per_chip": None,
        "est_step_time_s": None,
        "est_mfu": None,
        "est_mfu_maxtext": None,
        "cost_warning": None,
        "collectives": None,
        "async_collectives": compiled["async_collectives"],
        "compile_time_s": compiled["compile_time_s"],
    }
    if cost and out["fits"] is not False:
        out.update(step_cost(config, target.devices, step))
        out["est_mfu"] = est_mfu(config, target, out["est_step_time_s"], step)
        out["est_mfu_maxtext"] = est_mfu(config, target, out["est_step_time_s"], step, maxtext=True)
    return out
