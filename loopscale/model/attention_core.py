"""The attention core (scores, causal mask, softmax, weighted values) three ways, one result.

- xla: einsums with float32 scores. Every platform; it keeps the (B, H, T, S) scores of every
  layer for the backward pass and computes the masked half of the causal work.
- splash: the Pallas TPU kernel shipped in jax (`splash_attention`): blockwise, online
  softmax, fully masked blocks skipped, nothing of size T x S stored. It sees one device's
  share, so it runs under a shard_map manual over the batch axes and `tensor` (heads), as the
  dropless MoE does. Off TPU it runs in Pallas interpret mode, which is how this CPU tests it
  against the einsums (tests/test_attention_core.py). Needs T a multiple of 128 (its lanes).
- cudnn: `jax.nn.dot_product_attention(..., implementation="cudnn")`, cuDNN's fused flash
  attention, partitioned by jax over batch and heads. GPU only, 16-bit inputs.
- auto: splash on TPU, cudnn on GPU, xla elsewhere or where the kernel cannot take the shapes.

Every path scales the logits by `scale` (muP's 1/d_head or 1/sqrt(d_head)) and masks causally.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from loopscale.config.schema import SPLASH_LANES, AttentionImpl
from loopscale.model.sharding import current_platform, free_batch_axes

SPLASH_BLOCKS = (512, 256, 128)  # tried largest first; MaxText's default block is 512


def resolve(impl: AttentionImpl, platform: str, dtype: jnp.dtype, seq_len: int) -> AttentionImpl:
    """The path `impl` takes on `platform` (auto made concrete). An explicit choice is kept:
    validate.py refuses the shapes a kernel cannot take."""
    if impl is not AttentionImpl.AUTO:
        return impl
    if platform == "tpu" and seq_len % SPLASH_LANES == 0:
        return AttentionImpl.SPLASH
    if platform == "gpu" and jnp.dtype(dtype).itemsize == 2:
        return AttentionImpl.CUDNN
    return AttentionImpl.XLA


def attend(q_BxTxHxK: jax.Array, k_BxSxHxK: jax.Array, v_BxSxHxK: jax.Array, scale: float,
           impl: AttentionImpl) -> jax.Array:
    """softmax(scale * q.k, causal) . v per head, in the activations' dtype, as (B, T, H, K)."""
    impl = resolve(impl, current_platform(), q_BxTxHxK.dtype, q_BxTxHxK.shape[1])
    if impl is AttentionImpl.SPLASH:
        return splash_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale)
    if impl is AttentionImpl.CUDNN:
        return fused_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale, "cudnn")
    return xla_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale)


def xla_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale: float) -> jax.Array:
    # Logits and softmax in float32 whatever the activation dtype.
    logits_BxHxTxS = jnp.einsum(
        "bthk,bshk->bhts", q_BxTxHxK, k_BxSxHxK, preferred_element_type=jnp.float32
    ) * scale
    T, S = logits_BxHxTxS.shape[-2:]
    causal_TxS = jnp.tril(jnp.ones((T, S), dtype=bool))
    logits_BxHxTxS = jnp.where(causal_TxS, logits_BxHxTxS, jnp.finfo(jnp.float32).min)
    probs_BxHxTxS = jax.nn.softmax(logits_BxHxTxS, axis=-1).astype(q_BxTxHxK.dtype)
    return jnp.einsum("bhts,bshk->bthk", probs_BxHxTxS, v_BxSxHxK)


def fused_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale: float, implementation: str):
    """jax's own fused attention (the layout is ours already: batch, length, heads, head dim).
    `implementation` "cudnn" on GPUs; "xla" is the same call's reference path, which the CPU
    tests use to check the call itself."""
    return jax.nn.dot_product_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale=scale,
                                        is_causal=True, implementation=implementation)


def splash_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, scale: float) -> jax.Array:
    """The splash kernel on each device's batch rows and heads (module docstring). A batch the
    batch axes cannot split evenly (the trainer's one-row init batch) runs it unsplit."""
    B, _, H, _ = q_BxTxHxK.shape
    mesh = jax.sharding.get_abstract_mesh()
    batch = free_batch_axes(mesh)
    if B % math.prod(mesh.shape[a] for a in batch):
        batch = ()
    free = "tensor" in mesh.axis_names and "tensor" not in mesh.manual_axes
    heads = ("tensor",) if free and H % mesh.shape["tensor"] == 0 else ()
    interpret = current_platform() != "tpu"
    # The scale goes onto q (the kernel takes none): multiplied in float32, rounded once.
    q_BxTxHxK = (q_BxTxHxK.astype(jnp.float32) * scale).astype(q_BxTxHxK.dtype)

    def local(q, k, v):
        kernel = _kernel(q.shape[2], q.shape[1], k.shape[1], interpret)
        heads_first = functools.partial(jnp.swapaxes, axis1=1, axis2=2)  # (B, H, T, K)
        return heads_first(jax.vmap(kernel)(heads_first(q), heads_first(k), heads_first(v)))

    if not batch + heads:
        return local(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK)
    spec = PartitionSpec(batch or None, None, heads or None, None)
    # check_vma off: the kernel's pallas_call declares its outputs without saying how they vary
    # over the manual axes (every output varies as its inputs do; out_specs says so).
    split = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                          axis_names=frozenset(batch + heads), check_vma=False)
    return split(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK)


def _kernel(n_heads: int, q_len: int, kv_len: int, interpret: bool):
    """A causal splash kernel for (H, T, K) inputs of one sequence, blocks as large as divide
    the lengths (they must be multiples of 128: validate.py and `resolve` see to it). Built at
    each trace, not cached: it holds arrays, which would leak from one trace into the next
    (splash caches the mask's block structure itself)."""
    bq = next(b for b in SPLASH_BLOCKS if q_len % b == 0)
    bkv = next(b for b in SPLASH_BLOCKS if kv_len % b == 0)
    blocks = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                               block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                               block_q_dq=bq, block_kv_dq=bkv)
    mask = masks.MultiHeadMask([masks.CausalMask((q_len, kv_len))] * n_heads)
    return splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=blocks,
                                  interpret=interpret)
