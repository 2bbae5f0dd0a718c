"""The decoder-only looped LM: embedding -> prelude -> n_loops x (n_unique layers, the core) ->
coda -> final norm -> logits.

Prelude and coda (`n_prelude`, `n_coda`; 0 by default, and then no module exists and the model
traces as it did without them) are unlooped layers with their own parameters, Huginn's 2-4-2
shape. The prelude's output is the signal e that every injection mode feeds back (the
embedding when there is no prelude). The coda runs on the stream an exit reads out: at the last
loop, and at every loop boundary when all exits are asked for (`all_exits`, `exit_logits`, or
a loss at several loops), so an early exit or a test-time loop count is the whole model
stopped after t iterations (Huginn, Parcae), not the core's raw state.

Depth is two nested scans: the inner one over the unique layers (params stacked on `layers`),
the outer one over loops with params broadcast, so the parameter count does not depend on the
number of loops and the loop count can be changed at apply time (`n_loops=`), e.g. to evaluate
trained weights at more or fewer loops. `cfg.scan=False` runs the same computation as Python
loops (params named per layer; convert with params.py). `cfg.scan_loops=False` keeps the layer
scan but calls it from a Python loop over loops (same params): the nested scan stacks every
layer's backward residuals twice, once per loop in the inner scan and again across loops in
the outer one, and XLA:CPU copies between the two (measured by `loopscale bench`, README);
a model built for one loop never scans its loops, which would only add that copy.

The residual-stream hook: `edit=StreamEdit(keep_KxLxBxT, add_KxLxBxTxD)` sets x <- x * keep + add
after layer l of loop t (block.py), K the loops of this call and L = n_unique; the edit of the
last layer is the loop boundary (the next loop's input and `loop_hidden[t]`). Activation
patching writes another run's stream there (keep 0, add x'); the activation gradient is the
gradient with respect to a zero `add` (evaluate/patching.py, evaluate/act_grads.py). With
`edit=None` (the default) the traced computation is the one without the hook.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from loopscale.config.schema import DType, LossLoops, ModelConfig, Remat
from loopscale.model import mup
from loopscale.model.block import LayerStack, Loop, StreamEdit, at, stack_trees
from loopscale.model.layers import RMSNorm, rms_norm, rope_tables, weight


@flax.struct.dataclass
class ModelOutputs:
    logits: jax.Array | None  # (B, T, V) float32, last loop (None with readout=False)
    exit_logits: jax.Array | None  # (K, B, T, V) at every loop boundary, when asked for
    loop_hidden: jax.Array  # (K, B, T, D) stream at the end of each loop, before the final norm
    # What the readout reads at the exits, before the final norm: loop_hidden itself without a
    # coda; with one, the coda's output at every loop boundary (K, ...) when all exits are
    # asked for, else at the last loop only (1, ...). [-1] is always the model's output stream.
    exit_hidden: jax.Array
    residual_norm: jax.Array  # (K,) mean over tokens of ||x_L||_2 per loop
    residual_rms: jax.Array  # (K,) RMS of the stream per loop
    layer_hidden: jax.Array | None  # (K, L, B, T, D) when collect_layers
    moe: dict | None  # (K, L, ...) router statistics per loop and layer: expert_load, experts, ...
    # The prelude's and coda's router statistics, {"prelude": ..., "coda": ...} with a leading
    # layer axis (MoE models with those parts only); the coda's once per exit it ran at.
    moe_parts: dict | None
    lb_loss: jax.Array  # load-balancing loss, mean over layer applications (0 for dense)
    router_z: jax.Array  # router z-loss, likewise


class LoopedLM(nn.Module):
    """`per_loop_params=True` (scan path only) gives each loop its own copy of the block's params,
    stacked on a leading loop axis: fed K copies of the shared params it computes exactly the
    shared model, and the gradient with respect to copy t is loop t's contribution to the shared
    weights' gradient (train/step.py uses it for per-loop gradient norms)."""

    cfg: ModelConfig
    collect_layers: bool = False
    per_loop_params: bool = False

    @property
    def scans_loops(self) -> bool:
        """Whether the loops are an nn.scan (module docstring). The per-loop-params model
        always scans them: its params carry a leading loop axis."""
        cfg = self.cfg
        return cfg.scan and (self.per_loop_params or (cfg.scan_loops and cfg.n_loops > 1))

    def setup(self):
        cfg = self.cfg
        V, D = cfg.padded_vocab, cfg.d_model
        self.embedding = weight(self, "embedding", (V, D), ("vocab", "embed"), cfg)
        self.unembed = weight(self, "unembed", (D, V), ("embed", "vocab"), cfg, zero=cfg.zero_init_readout)
        self.final_norm = RMSNorm(cfg)
        # Inside a scan the remat needs no CSE barrier (the loop body is one); in Python loops
        # it does, or XLA merges the recomputation back into the forward pass.
        scans = self.scans_loops
        loop_cls = nn.remat(Loop, prevent_cse=not scans) if cfg.remat is Remat.LOOP else Loop
        if scans and self.per_loop_params:
            loop_cls = nn.scan(
                loop_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, 0),
            )
        elif scans:
            loop_cls = nn.scan(
                loop_cls,
                variable_broadcast="params",
                split_rngs={"params": False},
                in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast, 0),
            )
        self.loop = loop_cls(cfg, self.collect_layers)
        self.loop_cls = loop_cls  # the frozen loops apply it to the same parameters
        # Prelude and coda: one pass each, so loop remat treats each as one (`prevent_cse`:
        # outside any scan).
        part_cls = nn.remat(LayerStack) if cfg.remat is Remat.LOOP else LayerStack
        self.prelude = part_cls(cfg, n_layers=cfg.n_prelude) if cfg.n_prelude else None
        self.coda = part_cls(cfg, n_layers=cfg.n_coda) if cfg.n_coda else None

    def _unlooped(self, part: nn.Module, x_xBxTxD: jax.Array, rope) -> tuple[jax.Array, dict]:
        """The prelude or coda on (..., B, T, D): its layers as on loop 1 (nothing injected);
        leading axes are folded into the batch (exits at several loops run as one batch)."""
        x_BxTxD = x_xBxTxD.reshape(-1, *x_xBxTxD.shape[-2:])
        y_BxTxD, ys = part(x_BxTxD, x_BxTxD, False, rope)
        return y_BxTxD.reshape(x_xBxTxD.shape), ys

    def _shared_truncated(self, e_BxTxD, e0_BxTxD, rope, K: int, frozen: jax.Array,
                          max_frozen: int) -> tuple[jax.Array, dict]:
        """`frozen` loops without a gradient, then K with one (`__call__`'s frozen_loops). The
        frozen loops apply the loop module to stop_gradient'ed parameters and inputs inside a
        lax.while_loop, whose trip count may be traced because nothing is differentiated
        through it; the K loops run as the static path runs them, their indices offset."""
        cfg, scans = self.cfg, self.scans_loops
        params, e, e0 = jax.lax.stop_gradient(
            (self.loop.variables["params"], e_BxTxD, e0_BxTxD))
        loop = self.loop_cls(cfg, parent=None)  # unbound: applied to the params given

        def body(carry):
            x, t, norms, rms = carry
            x, ys = loop.apply({"params": params}, x, t[None] if scans else t, e, e0, rope, None)
            if scans:  # a scan of one loop
                ys = jax.tree.map(lambda a: a[0], ys)
            return x, t + 1, norms.at[t].set(ys["residual_norm"]), rms.at[t].set(
                ys["residual_rms"])

        zeros = jnp.zeros((max_frozen,), jnp.float32)
        x_BxTxD, _, norms, rms = jax.lax.while_loop(
            lambda c: c[1] < frozen, body, (e0, jnp.zeros((), jnp.int32), zeros, zeros))
        # With no frozen loop the first loop starts from e0 itself, its gradient kept.
        x_BxTxD = jnp.where(frozen > 0, x_BxTxD, e0_BxTxD)
        ts = frozen + jnp.arange(K)
        if scans:
            x_BxTxD, ys = self.loop(x_BxTxD, ts, e_BxTxD, e0_BxTxD, rope, None)
        else:
            per_loop = []
            for t in range(K):
                x_BxTxD, y = self.loop(x_BxTxD, ts[t], e_BxTxD, e0_BxTxD, rope)
                per_loop.append(y)
            ys = stack_trees(per_loop)
        # The frozen loops' norms rolled to end where the others begin: zeros first.
        shift = max_frozen - frozen
        return x_BxTxD, {**ys, **{name: jnp.concatenate([jnp.roll(front, shift), ys[name]])
                                  for name, front in (("residual_norm", norms),
                                                      ("residual_rms", rms))}}

    def through_coda(self, x_xBxTxD: jax.Array) -> jax.Array:
        """The coda on streams of the core (..., B, T, D), whole sequences (its attention reads
        every earlier position); the identity without a coda. What an exit at any point of the
        core reads: the lens and the JSD decode each layer's stream this way (Huginn's probing
        of the recurrent state through its coda)."""
        if self.coda is None:
            return x_xBxTxD
        rope = rope_tables(x_xBxTxD.shape[-2], self.cfg.d_head, self.cfg.rope_base)
        return self._unlooped(self.coda, x_xBxTxD, rope)[0]

    def readout(self, x_xD: jax.Array,
                lead: tuple[str | None, ...] = ("act_batch", "act_length")) -> jax.Array:
        """Final norm + unembedding (+ soft cap), shared by the last loop and every early exit.
        `lead` names the logical axes before the vocabulary's (the trailing ones of x)."""
        cfg = self.cfg
        mult = mup.scaling(mup.Role.READOUT, cfg).forward_mult
        xn = self.final_norm(x_xD)
        logits = jnp.einsum("...d,dv->...v", xn, self.unembed.astype(xn.dtype),
                            preferred_element_type=jnp.float32) * mult
        if cfg.logit_softcap:
            logits = cfg.logit_softcap * jnp.tanh(logits / cfg.logit_softcap)
        if cfg.padded_vocab > cfg.vocab_size:  # the padding's logits out of every softmax
            real = jnp.arange(cfg.padded_vocab) < cfg.vocab_size
            logits = jnp.where(real, logits, jnp.finfo(logits.dtype).min)
        names = (None,) * (logits.ndim - 1 - len(lead)) + tuple(lead) + ("act_vocab",)
        return nn.with_logical_constraint(logits, names)

    def __call__(self, tokens_BxT: jax.Array, n_loops: int | None = None,
                 exit_logits: bool = False, readout: bool = True,
                 edit: StreamEdit | None = None, all_exits: bool = False,
                 bptt_loops: int = 0, frozen_loops: jax.Array | None = None,
                 max_frozen: int = 0) -> ModelOutputs:
        """`readout=False` leaves the logits to the caller (model/loss.py projects the hidden
        states a few positions at a time, so the (B, T, V) logits never exist whole). `edit`:
        the residual-stream hook (module docstring), leading axes (n_loops, n_unique), on the
        core's layers. `all_exits`: the coda at every loop boundary (`exit_hidden`).
        `bptt_loops` = k (0: off): truncated backpropagation, the gradient through the last k
        loops only; the loops before them run as constants (their outputs stop_gradient'ed,
        the stream entering loop K - k included). `frozen_loops` (a traced count, at most
        `max_frozen`): truncated backpropagation with the frozen count an argument, so one
        compiled step serves every loop count: that many loops run first without a gradient
        (one while loop), then the `n_loops` loops the gradient goes through, numbered after
        them; loop_hidden holds those `n_loops`, residual_norm and residual_rms all
        `max_frozen + n_loops` entries, zeros first, the real loops last."""
        cfg = self.cfg
        K = n_loops or cfg.n_loops
        dtype = jnp.bfloat16 if cfg.dtype is DType.BFLOAT16 else jnp.float32
        emb_mult = mup.scaling(mup.Role.EMBEDDING, cfg).forward_mult
        e_BxTxD = (jnp.take(self.embedding, tokens_BxT, axis=0) * emb_mult).astype(dtype)
        e_BxTxD = nn.with_logical_constraint(e_BxTxD, ("act_batch", "act_length", "act_embed"))
        parts = {}  # router statistics of the prelude and coda (auxiliary losses, routing)
        if self.prelude is not None:
            # Its own rotary tables (XLA merges them with the core's): computed here, the
            # tables would reorder a model without a prelude's program text.
            prelude_rope = rope_tables(tokens_BxT.shape[1], cfg.d_head, cfg.rope_base)
            e_BxTxD, ys_prelude = self._unlooped(self.prelude, e_BxTxD, prelude_rope)
            parts["prelude"] = ys_prelude
        e0_BxTxD = rms_norm(e_BxTxD, cfg.norm_eps) if cfg.embed_norm else e_BxTxD
        rope = rope_tables(tokens_BxT.shape[1], cfg.d_head, cfg.rope_base)

        cut = K - bptt_loops if 0 < bptt_loops < K else 0  # loops run without a gradient
        if self.per_loop_params and (cut or frozen_loops is not None):
            raise ValueError("per-loop parameters with truncated backpropagation")
        if frozen_loops is not None:
            if cut or edit is not None or self.collect_layers:
                raise ValueError("frozen_loops with bptt_loops, a stream edit or every layer")
            x_BxTxD, ys = self._shared_truncated(e_BxTxD, e0_BxTxD, rope, K, frozen_loops,
                                                 max_frozen)
        elif self.scans_loops and cut:  # two scans over the same (broadcast) parameters
            frozen = jax.lax.stop_gradient(self.loop(e0_BxTxD, jnp.arange(cut), e_BxTxD,
                                                     e0_BxTxD, rope, at(edit, slice(0, cut))))
            x_BxTxD, ys = self.loop(frozen[0], jnp.arange(cut, K), e_BxTxD, e0_BxTxD, rope,
                                    at(edit, slice(cut, K)))
            ys = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), frozen[1], ys)
        elif self.scans_loops:
            x_BxTxD, ys = self.loop(e0_BxTxD, jnp.arange(K), e_BxTxD, e0_BxTxD, rope, edit)
        else:  # the layers may still be scanned: ys then carry the layer axis per loop
            x_BxTxD, per_loop = e0_BxTxD, []
            for t in range(K):
                if cut and t == cut:
                    x_BxTxD, per_loop = jax.lax.stop_gradient((x_BxTxD, per_loop))
                x_BxTxD, y = self.loop(x_BxTxD, t, e_BxTxD, e0_BxTxD, rope, at(edit, t))
                per_loop.append(y)
            ys = stack_trees(per_loop)

        exit_hidden = ys["hidden"]
        if self.coda is not None:
            every = all_exits or exit_logits or cfg.loss_loops is not LossLoops.LAST
            exit_hidden, ys_coda = self._unlooped(
                self.coda, exit_hidden if every else exit_hidden[-1:], rope)
            parts["coda"] = ys_coda
            x_BxTxD = exit_hidden[-1]

        moe = {k: ys[k] for k in ("expert_load", "experts", "dropped_frac", "lb_loss", "router_z") if k in ys}
        zero = jnp.zeros((), jnp.float32)
        return ModelOutputs(
            logits=self.readout(x_BxTxD) if readout else None,
            exit_logits=self.readout(exit_hidden) if exit_logits else None,
            loop_hidden=ys["hidden"],
            exit_hidden=exit_hidden,
            residual_norm=ys["residual_norm"],
            residual_rms=ys["residual_rms"],
            layer_hidden=ys.get("layer_hidden"),
            moe=moe or None,
            moe_parts={name: {k: ys[k] for k in moe} for name, ys in parts.items()}
            if moe and parts else None,
            lb_loss=_mean_over_uses(moe, list(parts.values()), "lb_loss") if moe else zero,
            router_z=_mean_over_uses(moe, list(parts.values()), "router_z") if moe else zero,
        )


def _mean_over_uses(core: dict, parts: list[dict], name: str) -> jax.Array:
    """An auxiliary loss's mean over every MoE layer use: the core's (K, L) uses and the
    prelude's and coda's layers (one use each; several when the coda ran at several exits)."""
    if not parts:
        return jnp.mean(core[name])
    values = [core[name]] + [p[name] for p in parts]
    return sum(jnp.sum(v) for v in values) / sum(v.size for v in values)
