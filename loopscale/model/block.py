"""One transformer layer, one pass through the looped block, and one loop iteration.

The five injection modes of PAPERS.md section 1 (plus plain repetition) differ only in where a
loop's residual stream starts (`Loop`) and in two per-layer switches (`Block`):
- FLA: the layer first restarts its stream from z = norm(x + h), h = the previous loop's output;
- attention injection (FLT at every layer, attn_first at layer 1): queries from norm(h), keys
  and values from norm(x), through the layer's own weights; h never enters the stream.
On loop 1 (t = 0) every layer is plain. The switches are Python booleans on the unrolled path
and traced booleans inside the scans, so one compiled body serves every loop and layer.

Stream edits (`StreamEdit`, for patching and activation gradients): each layer's output x is
replaced by x * keep + add, with keep and add the edit's slices for that loop and layer. The
slices travel as scanned inputs (loops outer, layers inner; on the unrolled path they are
indexed in Python); without an edit (None) no operation is added, so the model traces exactly
as it does without the hook. The edited stream is what the next layer, the next loop, the
collected hidden states and the readout all see.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from loopscale.config.schema import FFNKind, Injection, LoopModulation, ModelConfig, Remat
from loopscale.model.attention import Attention
from loopscale.model.ffn import MLP
from loopscale.model.layers import RMSNorm, rms_norm, weight
from loopscale.model.moe import MoE


@flax.struct.dataclass
class StreamEdit:
    """x <- x * keep + add at the end of layer l of loop t (the end of the last layer is the
    loop boundary, x_L^(t)). Leading axes (K, L) = (loops, unique layers) of the call; keep
    broadcasts over D. keep = 1, add = 0 leaves the model unchanged; keep = 0, add = x' puts x'
    in the stream. Any dtype: cast to the stream's."""

    keep_KxLxBxT: jax.Array
    add_KxLxBxTxD: jax.Array

    def at(self, index) -> StreamEdit:
        """The slice for one loop (then one layer) on the unrolled path."""
        return jax.tree.map(lambda a: a[index], self)

    def apply(self, x_BxTxD: jax.Array) -> jax.Array:
        """On a slice of one loop and layer: (B, T) and (B, T, D)."""
        keep = self.keep_KxLxBxT.astype(x_BxTxD.dtype)[..., None]
        return x_BxTxD * keep + self.add_KxLxBxTxD.astype(x_BxTxD.dtype)


def at(edit: StreamEdit | None, index) -> StreamEdit | None:
    return None if edit is None else edit.at(index)


def select(cond, if_true: Callable[[], jax.Array], if_false: Callable[[], jax.Array]) -> jax.Array:
    """`where` for traced conditions; a plain branch when the condition is a Python bool, so
    the unrolled path computes only what it uses."""
    if isinstance(cond, bool):
        return if_true() if cond else if_false()
    return jnp.where(cond, if_true(), if_false())


class Block(nn.Module):
    """Pre-norm layer: u = x + Attn(q=norm(x or h), kv=norm(x)); x' = u + FFN(norm(u))."""

    cfg: ModelConfig
    collect_layers: bool = False

    @nn.compact
    def __call__(self, x_BxTxD, layer, h_BxTxD, inject, rope, edit: StreamEdit | None = None):
        cfg = self.cfg
        eps = cfg.norm_eps
        if cfg.injection is Injection.FLA:
            x_BxTxD = select(inject, lambda: rms_norm(x_BxTxD + h_BxTxD, eps), lambda: x_BxTxD)

        attn_norm = RMSNorm(cfg, name="attn_norm")
        xn_BxTxD = attn_norm(x_BxTxD)
        if cfg.injection is Injection.FLT:
            inject_here = inject
        elif cfg.injection is Injection.ATTN_FIRST:
            inject_here = inject & (layer == 0)
        else:
            inject_here = False
        qn_BxTxD = select(inject_here, lambda: attn_norm(h_BxTxD), lambda: xn_BxTxD)
        u_BxTxD = x_BxTxD + Attention(cfg, name="attn")(qn_BxTxD, xn_BxTxD, rope)

        un_BxTxD = RMSNorm(cfg, name="ffn_norm")(u_BxTxD)
        if cfg.ffn is FFNKind.MOE:
            f_BxTxD, ys = MoE(cfg, name="moe")(un_BxTxD)
        else:
            f_BxTxD, ys = MLP(cfg, name="mlp")(un_BxTxD), {}
        out_BxTxD = u_BxTxD + f_BxTxD
        if edit is not None:
            out_BxTxD = edit.apply(out_BxTxD)
        out_BxTxD = nn.with_logical_constraint(out_BxTxD, ("act_batch", "act_length", "act_embed"))
        if self.collect_layers:
            ys = {**ys, "layer_hidden": out_BxTxD}
        return out_BxTxD, ys


def stack_trees(trees: list) -> dict:
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


class LayerStack(nn.Module):
    """The n_unique layers once: an `nn.scan` with params stacked on the `layers` axis, or a
    Python loop over layers named layer_0..layer_{L-1} (convert with params.py). `n_layers`
    other than the core's: the prelude or the coda (transformer.py), the same layers unlooped."""

    cfg: ModelConfig
    collect_layers: bool = False
    n_layers: int | None = None  # None: the core's n_unique

    @nn.compact
    def __call__(self, x_BxTxD, h_BxTxD, inject, rope, edit: StreamEdit | None = None):
        cfg = self.cfg
        n_layers = cfg.n_unique if self.n_layers is None else self.n_layers
        block_cls = Block
        if cfg.remat is Remat.LAYER:
            block_cls = nn.remat(Block, prevent_cse=not cfg.scan)
        elif cfg.remat is Remat.DOTS:
            block_cls = nn.remat(Block, prevent_cse=not cfg.scan,
                                 policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        if cfg.scan:
            scanned = nn.scan(
                block_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, 0),
                length=n_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            layers = jnp.arange(n_layers)
            return scanned(cfg, self.collect_layers, name="layers")(x_BxTxD, layers, h_BxTxD, inject,
                                                                    rope, edit)
        ys = []
        for layer in range(n_layers):
            block = block_cls(cfg, self.collect_layers, name=f"layer_{layer}")
            x_BxTxD, y = block(x_BxTxD, layer, h_BxTxD, inject, rope, at(edit, layer))
            ys.append(y)
        return x_BxTxD, stack_trees(ys)


class Loop(nn.Module):
    """Loop iteration t: where the stream starts, then the layer stack.

    carry x_prev = x_L(t-1), the un-normalised stream at the end of the previous loop (for t = 0
    the caller passes the loop-1 start). h = norm(x_prev) is what the next loop sees."""

    cfg: ModelConfig
    collect_layers: bool = False

    @nn.compact
    def __call__(self, x_prev_BxTxD, t, e_BxTxD, e0_BxTxD, rope, edit: StreamEdit | None = None):
        cfg = self.cfg
        eps = cfg.norm_eps
        inject = t > 0
        h_BxTxD = rms_norm(x_prev_BxTxD, eps)
        starts = {
            Injection.NONE: lambda: h_BxTxD,
            Injection.INPUT: lambda: rms_norm(e_BxTxD + h_BxTxD, eps),
            Injection.REPEAT: lambda: x_prev_BxTxD,
        }
        if cfg.injection is Injection.PARCAE:  # its own start on loop 1 too
            x0_BxTxD = self._parcae(x_prev_BxTxD, t, e0_BxTxD)
        elif cfg.injection is Injection.CONCAT:  # likewise
            x0_BxTxD = self._concat(x_prev_BxTxD, t, e0_BxTxD)
        else:
            x0_BxTxD = select(inject, starts.get(cfg.injection, lambda: e0_BxTxD),
                              lambda: e0_BxTxD)
        if cfg.loop_modulation is LoopModulation.FILM:
            x0_BxTxD = self._film(x0_BxTxD, t)
        x_BxTxD, ys = LayerStack(cfg, self.collect_layers, name="stack")(x0_BxTxD, h_BxTxD, inject,
                                                                          rope, edit)
        x32 = x_BxTxD.astype(jnp.float32)
        ys = {
            **ys,
            "hidden": x_BxTxD,
            # The FLT study's residual norm: mean over tokens of ||x_L||_2, before the final norm.
            "residual_norm": jnp.mean(jnp.linalg.norm(x32, axis=-1)),
            "residual_rms": jnp.sqrt(jnp.mean(jnp.square(x32))),
        }
        return x_BxTxD, ys

    def _parcae(self, x_prev_BxTxD, t, e0_BxTxD):
        """Parcae's stability-constrained injection (arXiv 2604.12946; its code's
        `DiagonalInjection`): h_{t+1} = A_bar h_t + B_bar e + R(h_t, e) with
        A = Diag(-exp(log_a)), A_bar = exp(dt A), B_bar = dt B, dt = exp(log_dt). Here the
        loop's start is A_bar x_prev + B_bar e0 and the layers' residual updates are R. Every
        entry of A_bar is exp(-dt exp(log_a)) in (0, 1) whatever log_a and log_dt are: the
        spectral radius of the linear recurrence stays below 1 by construction. Initialised as
        the code does: A = 1, B = I, dt so that A_bar = sqrt(1/5) (its `ssm_decay`). The state
        before loop 1 is 0 (the code's `state_init=zero`; its default draws a random state at
        every forward pass). log_a and log_dt are per channel (a gain's muP role); B is a
        d_model x d_model matrix (a hidden weight's)."""
        D = self.cfg.d_model
        vector = nn.with_logical_partitioning(nn.initializers.zeros, ("embed",))
        log_a = self.param("parcae_log_a", vector, (D,), jnp.float32)
        dt_init = nn.with_logical_partitioning(
            nn.initializers.constant(math.log(-math.log(math.sqrt(1 / 5)))), ("embed",))
        log_dt = self.param("parcae_log_dt", dt_init, (D,), jnp.float32)
        b = self.param("parcae_b", nn.with_logical_partitioning(
            lambda key, shape, dtype: jnp.eye(shape[0], dtype=dtype), ("embed", None)),
            (D, D), jnp.float32)
        dt = jnp.exp(log_dt)
        decay = jnp.exp(-dt * jnp.exp(log_a))  # A_bar's diagonal
        dtype = e0_BxTxD.dtype
        state = select(t > 0, lambda: x_prev_BxTxD * decay.astype(dtype),
                       lambda: jnp.zeros_like(x_prev_BxTxD))
        return state + jnp.einsum("btd,ed->bte", e0_BxTxD, (b * dt[:, None]).astype(dtype))

    def _concat(self, x_prev_BxTxD, t, e0_BxTxD):
        """Huginn's adapter (Geiping et al. 2025, arXiv 2502.05171; its code's
        `core_block_forward`): x0 = [x_prev; e] W with W (2 d_model, d_model), on every loop.
        Before loop 1 Huginn draws a random state; here it is 0 (deterministic: the same
        tokens give the same logits), so loop 1 starts from e W_e. W is drawn as a hidden
        input projection (`model.init.attn_qkv`); computed as two halves, x_prev W_s + e W_e,
        which is the concatenated matmul term for term."""
        cfg = self.cfg
        D = cfg.d_model
        w = weight(self, "adapter", (2 * D, D), ("embed", None), cfg)
        dtype = e0_BxTxD.dtype
        state = select(t > 0, lambda: x_prev_BxTxD, lambda: jnp.zeros_like(x_prev_BxTxD))
        return (jnp.einsum("btd,de->bte", state, w[:D].astype(dtype))
                + jnp.einsum("btd,de->bte", e0_BxTxD, w[D:].astype(dtype)))

    def _film(self, x_BxTxD, t):
        """x * (1 + scale[t]) + shift[t], rows (n_loops, D) zero-initialised: the identity
        until trained. Broadcast over the loop scan like every parameter of the core, indexed
        by the loop (traced there); a loop past the trained count uses the last row."""
        K, D = self.cfg.n_loops, self.cfg.d_model
        init = nn.with_logical_partitioning(nn.initializers.zeros, ("loops", "embed"))
        scale = self.param("film_scale", init, (K, D), jnp.float32)
        shift = self.param("film_shift", init, (K, D), jnp.float32)
        row = jnp.minimum(t, K - 1)
        return (x_BxTxD * (1.0 + scale[row]).astype(x_BxTxD.dtype)
                + shift[row].astype(x_BxTxD.dtype))
