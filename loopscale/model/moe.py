"""Token-choice top-k mixture of experts, with two dispatch paths that compute the same thing.

- dropless: every (token, expert) assignment is sorted by expert and the experts run as one
  grouped matmul, so no token is ever dropped; under data parallelism each batch shard sorts
  and runs only its own tokens (a shard_map over the batch axes). The grouped matmul
  (`model.moe_matmul`) is `jax.lax.ragged_dot`, or on TPU megablox, the Pallas grouped-matmul
  kernel shipped in jax (MaxText's choice): libtpu runs ragged_dot as a dense matmul over every
  expert, which a compile of MoE `:paper` for v5p-128 priced at 3.7e12 FLOPs a chip a step
  against the 1.6e12 the experts' matmuls are (2026-12-06, docs/compile.md).
  Megablox's rows come in tiles (`megablox_rows_tile`); the assignments are padded to whole
  tiles (rows in no group, which it leaves alone) and cut back. Off TPU it runs in Pallas
  interpret mode, which is how this CPU tests it against ragged_dot (tests/test_moe.py);
- capacity: GShard/Switch-style, each expert taking at most C = ceil(capacity_factor * T *
  top_k / E) assignments per sequence (top-1 choices first) into a fixed (E, C) buffer, moved
  there and back by index; the rest are dropped and reported as `dropped_frac`.
With ample capacity (capacity_factor >= E / top_k) the two agree (tests/test_moe.py).

Router: bias-free linear map, softmax over all experts for the load-balancing loss; combine
weights are the softmax over the k selected logits (the sparse-layers study's choice).
Losses: Switch load balancing E * sum_i f_i P_i (f_i the share of assignments sent to expert i,
P_i its mean router probability; exactly 1.0 for a uniform router) and the router z-loss
mean(logsumexp(logits)^2).
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec


from loopscale.config.schema import GroupedMatmul, MLPKind, ModelConfig, MoEDispatch
from loopscale.model import mup
from loopscale.model.ffn import activate
from loopscale.model.layers import weight
from loopscale.model.sharding import (current_platform, free_batch_axes, gather,
                                      manual_batch_axes, manual_part)

# The kernels' module (its package's `gmm` attribute is the op with megablox's own VJP).
megablox = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

# Logical axis names of (w_up, w_gate, w_down).
WeightAxes = tuple[tuple[str | None, ...], ...]


def load_balancing_loss(probs_NxE: jax.Array, load_E: jax.Array) -> jax.Array:
    n_experts = probs_NxE.shape[-1]
    return n_experts * jnp.sum(load_E * jnp.mean(probs_NxE, axis=0))


def top_k(logits_xE: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k` as k rounds of argmax (k is 1 or 2 here, E small): the same values and
    indices, ties to the lower index. `lax.top_k` lowers to a custom call that libtpu's cost
    model prices at a negative time (-1 s per call, measured), which made every MoE step's
    estimated time negative in `loopscale compile`."""
    values, indices = [], []
    for _ in range(k):
        index = jnp.argmax(logits_xE, axis=-1)
        values.append(jnp.take_along_axis(logits_xE, index[..., None], axis=-1)[..., 0])
        indices.append(index)
        taken = jax.nn.one_hot(index, logits_xE.shape[-1], dtype=jnp.bool_)
        logits_xE = jnp.where(taken, -jnp.inf, logits_xE)
    return jnp.stack(values, axis=-1), jnp.stack(indices, axis=-1)


def router_z_loss(logits_NxE: jax.Array) -> jax.Array:
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits_NxE, axis=-1)))


def capacity(cfg: ModelConfig, tokens_per_group: int) -> int:
    return max(1, math.ceil(cfg.capacity_factor * tokens_per_group * cfg.top_k / cfg.n_experts))


class MoE(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxTxD: jax.Array) -> tuple[jax.Array, dict]:
        cfg = self.cfg
        B, T, D = x_BxTxD.shape
        E, F, k = cfg.n_experts, cfg.expert_width, cfg.top_k
        dtype = x_BxTxD.dtype

        w_router = weight(self, "router", (D, E), ("embed", None), cfg)
        router_mult = mup.scaling(mup.Role.ROUTER, cfg).forward_mult
        logits_BxTxE = jnp.einsum(
            "btd,de->bte", x_BxTxD.astype(jnp.float32), w_router
        ) * router_mult
        probs_BxTxE = jax.nn.softmax(logits_BxTxE, axis=-1)
        top_logits_BxTxK, experts_BxTxK = top_k(logits_BxTxE, k)
        gates_BxTxK = jax.nn.softmax(top_logits_BxTxK, axis=-1)

        axes_in, axes_out = ("expert", "embed", "mlp"), ("expert", "mlp", "embed")
        w_up = weight(self, "w_up", (E, D, F), axes_in, cfg)
        w_gate = weight(self, "w_gate", (E, D, F), axes_in, cfg) if cfg.mlp is MLPKind.SWIGLU else None
        w_down = weight(self, "w_down", (E, F, D), axes_out, cfg, zero=cfg.zero_init_out)
        weights = (w_up.astype(dtype), None if w_gate is None else w_gate.astype(dtype), w_down.astype(dtype))

        if cfg.moe_dispatch is MoEDispatch.DROPLESS:
            y_BxTxD = _dropless(x_BxTxD, experts_BxTxK, gates_BxTxK, weights,
                                (axes_in, axes_in, axes_out), cfg.mlp, E,
                                resolve_matmul(cfg.moe_matmul))
            dropped = jnp.zeros((), jnp.float32)
        else:
            y_BxTxD, dropped = _with_capacity(
                x_BxTxD, experts_BxTxK, gates_BxTxK, weights, cfg.mlp, capacity(cfg, T)
            )

        load_E = jnp.mean(jax.nn.one_hot(experts_BxTxK, E, dtype=jnp.float32), axis=(0, 1, 2))
        # Where each device holds only its own rows of the batch (train/step.py
        # `local_gradients`), the load is still the whole batch's: the load-balancing loss is
        # then each device's share of the whole batch's, and their sum the whole batch's.
        manual = manual_batch_axes(jax.sharding.get_abstract_mesh())
        if manual:
            load_E = jax.lax.pmean(load_E, manual)
        stats = {
            "lb_loss": load_balancing_loss(probs_BxTxE.reshape(-1, E), load_E),
            "router_z": router_z_loss(logits_BxTxE.reshape(-1, E)),
            "expert_load": load_E,
            "experts": experts_BxTxK.astype(jnp.int32),
            "dropped_frac": dropped,
        }
        return nn.with_logical_constraint(y_BxTxD, ("act_batch", "act_length", "act_embed")), stats


def _expert_ffn(kind: MLPKind, x, weights, matmul: Callable) -> jax.Array:
    w_up, w_gate, w_down = weights
    gate = None if w_gate is None else matmul(x, w_gate)
    return matmul(activate(kind, matmul(x, w_up), gate), w_down)


def resolve_matmul(impl: GroupedMatmul) -> GroupedMatmul:
    """The grouped matmul `impl` is on the platform and mesh in context (auto made concrete):
    megablox on TPU unless the tensor axis splits the experts' width (the kernel takes each
    expert's matrices whole), ragged_dot elsewhere."""
    if impl is not GroupedMatmul.AUTO:
        return impl
    mesh = jax.sharding.get_abstract_mesh()
    tensor = mesh.shape.get("tensor", 1) if mesh.axis_names else 1
    tpu = current_platform() == "tpu" and tensor == 1
    return GroupedMatmul.MEGABLOX if tpu else GroupedMatmul.RAGGED_DOT


def _dropless(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, weight_axes: WeightAxes,
              kind: MLPKind, n_experts: int, impl: GroupedMatmul) -> jax.Array:
    """Dropless dispatch, per data-parallel shard when a mesh is in context.

    Sorting the global batch by expert would make every device sort, gather and run every
    token's experts (the argsort does not partition along the batch), so compute and memory
    would grow with the data-parallel size. Routing never crosses sequences, so each shard
    sorts only its own tokens instead: a shard_map manual over the batch axes, `tensor` left
    to the compiler. A batch the shards cannot split evenly (the trainer's one-row init batch)
    takes the global path, as does a single device. Megablox, a Mosaic kernel, cannot be left
    to the compiler at all: with it the shard_map is manual over every axis (`tensor` is 1
    there: resolve_matmul, validate.py), and the global path is one too, replicated."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = free_batch_axes(mesh)
    shards = math.prod(mesh.shape[a] for a in axes)
    split = shards > 1 and x_BxTxD.shape[0] % shards == 0
    free = tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
    # Inside a partial-manual shard_map (train/step.py `local_gradients`) the compiler still
    # partitions the other axes, even at size 1, and refuses a Mosaic kernel there.
    kernel = impl is GroupedMatmul.MEGABLOX and bool(free) and (
        math.prod(mesh.shape[a] for a in free) > 1 or bool(mesh.manual_axes))
    if not split and not kernel:
        return _dropless_local(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, kind, n_experts,
                               impl)
    manual = free if kernel else axes
    # Every shard needs every expert whole. The weights enter split as they are stored (ZeRO-3
    # over fsdp, experts over expert) and are all-gathered inside, because the transpose of
    # that all-gather reduce-scatters their gradients; with a replicated in_spec, a v5p compile
    # all-reduced each whole gradient and sliced it instead (twice a reduce-scatter's bytes).
    weight_specs = tuple(_manual_spec(names, manual) for names in weight_axes)

    def per_shard(x, experts, gates, split_weights):
        whole = tuple(None if w is None else gather(w, spec)
                      for w, spec in zip(split_weights, weight_specs))
        return _dropless_local(x, experts, gates, whole, kind, n_experts, impl)

    batch = PartitionSpec(axes if split else None)
    # check_vma off with megablox: its pallas_call declares its outputs without saying how they
    # vary over the manual axes (they vary as its inputs do; out_specs says so).
    return jax.shard_map(per_shard, mesh=mesh, in_specs=(batch, batch, batch, weight_specs),
                         out_specs=batch, axis_names=frozenset(manual),
                         check_vma=impl is not GroupedMatmul.MEGABLOX)(
        x_BxTxD, experts_BxTxK, gates_BxTxK, weights)


def _manual_spec(names: tuple[str | None, ...], manual: tuple[str, ...]) -> PartitionSpec:
    """A weight's stored partitioning (its logical axes under the rules in context) limited to
    the shard_map's manual axes."""
    return manual_part(PartitionSpec(*nn.logical_to_mesh_axes(names)), manual)


def _dropless_local(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, kind: MLPKind,
                    n_experts: int, impl: GroupedMatmul) -> jax.Array:
    B, T, D = x_BxTxD.shape
    k = experts_BxTxK.shape[-1]
    x_NxD = x_BxTxD.reshape(B * T, D)
    expert_A = experts_BxTxK.reshape(-1)
    token_A = jnp.repeat(jnp.arange(B * T), k)
    # A stable sort by expert as a counting sort: assignment a goes to its expert's offset plus
    # its rank among that expert's assignments. Linear in A * E, and no sort instruction, which
    # libtpu's cost model prices at a negative time (measured: -1 s per sort).
    onehot_AxE = jax.nn.one_hot(expert_A, n_experts, dtype=jnp.int32)
    rank_A = jnp.sum((jnp.cumsum(onehot_AxE, axis=0) - 1) * onehot_AxE, axis=-1)
    sizes_E = jnp.sum(onehot_AxE, axis=0)
    dest_A = (jnp.cumsum(sizes_E) - sizes_E)[expert_A] + rank_A  # sorted position of a
    order_A = jnp.zeros_like(dest_A).at[dest_A].set(jnp.arange(dest_A.shape[0]))
    xs_AxD = x_NxD[token_A[order_A]]

    def grouped(x, w):
        if impl is GroupedMatmul.MEGABLOX:
            return megablox_matmul(x, w, sizes_E)
        return jax.lax.ragged_dot(x, w, sizes_E)

    ys_AxD = _expert_ffn(kind, xs_AxD, weights, grouped)
    y_AxD = ys_AxD[dest_A]  # undo the sort with a gather
    y_NxKxD = y_AxD.reshape(B * T, k, D)
    gates_NxK = gates_BxTxK.reshape(B * T, k).astype(y_NxKxD.dtype)
    return jnp.einsum("nkd,nk->nd", y_NxKxD, gates_NxK).reshape(B, T, D)


def megablox_rows_tile(rows: int, groups: int) -> int:
    """Megablox's row tile. The kernel visits every row tile once per group with rows in it,
    so each group boundary inside a tile costs one more tile (at most groups - 1): the largest
    of 512, 256, 128 whose extra tiles stay within 15% of the rows' own (MoE `:paper` on
    v5p-128, 8,192 rows a chip and 8 experts: 128, at most 7 extra tiles on 64); whole
    sublanes for fewer rows."""
    return next((t for t in (512, 256, 128) if rows >= t and groups - 1 <= 0.15 * (rows // t)),
                128 if rows >= 128 else -(-rows // 8) * 8)


def megablox_matmul(x_AxD: jax.Array, w_ExDxF: jax.Array, sizes_E: jax.Array) -> jax.Array:
    """ragged_dot(x, w, sizes) by megablox, the rows padded to whole row tiles (in no group,
    so the kernel leaves them alone) and cut back."""
    A = x_AxD.shape[0]
    tm = megablox_rows_tile(A, w_ExDxF.shape[0])
    x = jnp.pad(x_AxD, ((0, -(-A // tm) * tm - A), (0, 0)))
    return _gmm(x, w_ExDxF, sizes_E.astype(jnp.int32), tm, current_platform() != "tpu")[:A]


# The VMEM a megablox call's tiles may take: libtpu's scoped VMEM limit is 16 MiB (a compile
# of a d 1024 x 1376 float32 matmul with whole-width tiles needed 17.1 MiB and was refused).
MEGABLOX_VMEM = 12 * 2**20


def megablox_widths(tm: int, k: int, n: int, itemsize: int,
                    tgmm: bool = False) -> tuple[int, int]:
    """The (k, n) tiles of one megablox call of `tm`-row tiles (gmm: (m, k) @ (k, n) -> (m, n);
    tgmm: (k, m) @ (m, n) -> (k, n) per group): a whole width, or a multiple of the TPU's 128
    lanes with the kernel masking what a last tile holds past it; the pair that pads the
    matmul least among those whose double-buffered input tiles, output tile and float32
    accumulator fit MEGABLOX_VMEM, the larger on a tie."""
    def options(d: int) -> list[int]:
        return [d] + [t for t in (512, 256, 128) if t < d]

    def vmem(tk: int, tn: int) -> int:
        inputs, out = ((tk * tm + tm * tn), tk * tn) if tgmm else ((tm * tk + tk * tn), tm * tn)
        return 2 * inputs * itemsize + out * (2 * itemsize + 4)

    def padded(d: int, t: int) -> int:
        return -(-d // t) * t

    fits = [(tk, tn) for tk in options(k) for tn in options(n) if vmem(tk, tn) <= MEGABLOX_VMEM]
    return min(fits, key=lambda p: (padded(k, p[0]) * padded(n, p[1]), -p[0] * p[1]))


# Megablox's own VJP (megablox.ops.gmm) runs the backward pass at the forward's tiling, so
# its column tiles must fit both widths: multiples of 128 that pad MoE `:paper`'s 704 and
# 960 to 768 and 1,024 (+16% of the FLOPs). Each call here gets its own tiling instead
# (megablox_widths: whole widths where they fit): x @ w, the inputs' gradient g @ w^T, the
# weights' x^T @ g per expert (tgmm).
def _tiling(tm: int, k: int, n: int, dtype, tgmm: bool = False) -> tuple[int, int, int]:
    return (tm, *megablox_widths(tm, k, n, jnp.dtype(dtype).itemsize, tgmm))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm(x_AxD, w_ExDxF, sizes_E, tm: int, interpret: bool):
    _, D, F = w_ExDxF.shape
    return megablox.gmm(x_AxD, w_ExDxF, sizes_E, x_AxD.dtype, _tiling(tm, D, F, x_AxD.dtype),
                        interpret=interpret)


def _gmm_fwd(x_AxD, w_ExDxF, sizes_E, tm, interpret):
    return _gmm(x_AxD, w_ExDxF, sizes_E, tm, interpret), (x_AxD, w_ExDxF, sizes_E)


def _gmm_bwd(tm, interpret, residuals, g_AxF):
    x_AxD, w_ExDxF, sizes_E = residuals
    E, D, F = w_ExDxF.shape
    g_x = megablox.gmm(g_AxF, w_ExDxF, sizes_E, x_AxD.dtype, _tiling(tm, F, D, g_AxF.dtype),
                       transpose_rhs=True, interpret=interpret)
    g_w = megablox.tgmm(x_AxD.swapaxes(0, 1), g_AxF, sizes_E, w_ExDxF.dtype,
                        _tiling(tm, D, F, x_AxD.dtype, tgmm=True), num_actual_groups=E,
                        interpret=interpret)
    return g_x, g_w, None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def _with_capacity(x_BxTxD, experts_BxTxK, gates_BxTxK, weights, kind, cap):
    """Each sequence's assignments queue per expert (all first choices in token order, then all
    second choices, ...); an expert keeps the first `cap`. Dispatch and combine move tokens by
    index (gathers; their gradients are scatter-adds), which costs O(tokens * k * D) rather
    than the O(tokens * E * C * D) of one-hot dispatch einsums and allocates no (T, E, C)
    tensor: on a CPU the one-hot form was 3/4 of a tiny MoE's step."""
    B, T, D = x_BxTxD.shape
    k = experts_BxTxK.shape[-1]
    n_experts = weights[0].shape[0]
    queue_BxKTxE = jax.nn.one_hot(experts_BxTxK.transpose(0, 2, 1).reshape(B, k * T), n_experts,
                                  dtype=jnp.int32)
    # Each assignment's place in its expert's queue (one expert per row of the one-hot).
    position_BxKT = jnp.sum((jnp.cumsum(queue_BxKTxE, axis=1) - 1) * queue_BxKTxE, axis=-1)
    position_BxTxK = position_BxKT.reshape(B, k, T).transpose(0, 2, 1)
    kept_BxTxK = position_BxTxK < cap
    # Slot e * cap + c of the (E * cap)-slot buffer; dropped assignments point past its end.
    slot_BxTxK = jnp.where(kept_BxTxK, experts_BxTxK * cap + position_BxTxK, n_experts * cap)

    # Which token fills each slot (T: none, reading a zero row appended to the sequence).
    rows_Bx1 = jnp.arange(B)[:, None]
    token_BxTK = jnp.broadcast_to(jnp.arange(T)[:, None], (T, k)).reshape(1, T * k)
    source_BxS = jnp.full((B, n_experts * cap), T, jnp.int32).at[
        rows_Bx1, slot_BxTxK.reshape(B, T * k)].set(jnp.broadcast_to(token_BxTK, (B, T * k)),
                                                    mode="drop")
    padded_BxTxD = jnp.concatenate([x_BxTxD, jnp.zeros((B, 1, D), x_BxTxD.dtype)], axis=1)
    xin_BxSxD = jnp.take_along_axis(padded_BxTxD, source_BxS[..., None], axis=1)
    # Expert-major for the expert matmuls: a leading batch axis is what a batched dot wants
    # (with the batch axis second, XLA's CPU dots transposed and were 3x slower).
    xin_ExNxD = xin_BxSxD.reshape(B, n_experts, cap, D).transpose(1, 0, 2, 3).reshape(
        n_experts, B * cap, D)

    def batched(x, w):
        return jnp.einsum("end,edf->enf", x, w)

    yout_ExNxD = _expert_ffn(kind, xin_ExNxD, weights, batched)
    yout_BxSxD = yout_ExNxD.reshape(n_experts, B, cap, D).transpose(1, 0, 2, 3).reshape(
        B, n_experts * cap, D)
    # Combine: each token reads its kept slots back, weighted by its gates.
    safe_BxTK = jnp.where(kept_BxTxK, slot_BxTxK, 0).reshape(B, T * k)
    y_BxTxKxD = jnp.take_along_axis(yout_BxSxD, safe_BxTK[..., None], axis=1).reshape(B, T, k, D)
    gates_BxTxK = jnp.where(kept_BxTxK, gates_BxTxK, 0.0).astype(x_BxTxD.dtype)
    y_BxTxD = jnp.einsum("btkd,btk->btd", y_BxTxKxD, gates_BxTxK)
    dropped = 1.0 - jnp.sum(kept_BxTxK) / (B * T * k)
    return y_BxTxD, dropped.astype(jnp.float32)
