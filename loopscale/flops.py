"""Analytic parameter and FLOP accounting, pure functions of ModelConfig (and the sequence length).

Parameters (`param_counts`), all exact (tests compare them with the real parameter tree):
- `params_embedding`: the two vocabulary matrices, input embedding V*D plus unembedding D*V
  (untied); `params_embedding_in` and `params_unembedding` give them apart.
- `params_unique`: every other stored parameter (attention, FFN or all experts, routers, norm
  gains), each physical layer once: what a checkpoint holds besides the vocabulary matrices.
- `params_effective`: the same counted per use, a core layer once per loop pass (K x the core's
  layers), a prelude or coda layer once.
- `params_active`: per use as well, but an MoE layer counts only top_k of its experts (and its
  router unless `model.count_router` is false), and the embedding and unembedding are
  included: the sparse-layers study's N_active (Looped-MoE d704 8x2: 167.4M active without the
  routers, 167.5M with them, against 216.4M stored; the study says 167M and 216M).
  `params_active_nonembedding` is it without the vocabulary matrices (Kaplan's N);
  `params_active_stored` counts each physical layer once (not loop-aware) and includes the
  vocabulary matrices. The stored counts (unique, effective, total) always hold the routers.
- `params_total`: everything stored, `params_embedding + params_unique`.
- The recurrence law's split (scaling/recurrence.py; Schwethelm et al. 2026): `params_rec`,
  the looped block's stored parameters (the n_unique layers every loop pass reuses, their
  routers and norm gains included: a Base model is one pass of its layers), and `params_once`,
  everything else: embedding, unembedding, final norm, and the prelude's and coda's layers
  (`model.n_prelude`, `model.n_coda`; stored, every expert of an MoE prelude counted), so
  `params_once + params_rec == params_total`. `params_rec_active` is the looped block per token
  as `params_active` counts it (top_k experts, the routers when `model.count_router`;
  `params_rec` for a dense model), so for a dense model `params_once + n_loops *
  params_rec_active == params_active`.

FLOPs of training per token (`flops_per_token`), one of the `FlopConvention`s (the top-level
config field `flop_convention` picks the one the sweep planner spends budgets with). All of them
are forward x 3 (forward + backward), loop-aware (a layer counted once per loop pass), and
MoE-active (top_k experts, plus the router when `model.count_router`, as params_active); they
differ in the N of 6N and in attention:
- `6n` (Kaplan et al. 2020): 6 * params_active_nonembedding; no embedding, no unembedding, no
  attention matrices.
- `6n_emb` (the sparse-layers study, arXiv 2605.09165): 6 * params_active, i.e. with embedding
  and unembedding. The study says router FLOPs are not counted; its presets say so with
  `model.count_router=false` (its published 167M active fits either count); elsewhere the
  router is counted by default, as 6 x its params.
- `6n_attn`: `6n_emb` plus the T x T attention matmuls (q.k logits and probs.v), computed over
  the full matrix: 12 * T * n_heads * d_head per layer use (Chinchilla's appendix F count).
- `6n_attn_causal`: the same with the attention term halved, what a causal kernel that skips
  masked blocks needs.
`flops_per_token_6n` is always the `6n` figure, `flops_per_token_train` the configured one.

`computed_flops_per_token` is different in kind: what the compiled training step
(jit(value_and_grad(loss_fn)) of the unrolled model, see evaluate/xla_cost.py) executes, as
XLA's cost analysis counts it: every matmul with its two backward matmuls, full attention
matrices (masked entries included), the unembedding at every readout, remat's recomputation, and
the main elementwise terms (transcendentals are left out, as XLA reports them apart; bf16
converts are not counted, about 1% at d 128 on CPU). MoE: on CPU, JAX lowers
`jax.lax.ragged_dot` densely (the assignments masked into an E x A x D array, then one matmul
against all experts), so the dropless step really executes E times the grouped expert FLOPs,
forward and backward, and it is counted that way; `ragged_dot_dense=False` counts a grouped
kernel (GPU/TPU lowerings). The capacity path counts its gathers, queue cumsum and combine and
the experts on all E*C slots. Against XLA it is within 0.3% on the test matrix
(tests/test_flops.py), 1.2% with loop remat.
"""

from __future__ import annotations

import dataclasses

from ml_collections import ConfigDict

from loopscale.config.schema import (
    FFNKind,
    FlopConvention,
    Injection,
    LoopModulation,
    LossLoops,
    MLPKind,
    ModelConfig,
    MoEDispatch,
    Remat,
)
from loopscale.config.validate import parse_model
from loopscale.model.loss import loss_loop_indices
from loopscale.model.moe import capacity


def ffn_matrices(cfg: ModelConfig) -> int:
    """Weight matrices of one FFN or expert: SwiGLU has up, gate and down; the others two."""
    return 3 if cfg.mlp is MLPKind.SWIGLU else 2


def attention_dim(cfg: ModelConfig) -> int:
    """n_heads * d_head: the width of q, k and v (d_model unless head_dim says otherwise)."""
    return cfg.n_heads * cfg.d_head


def layer_params(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of one physical layer by part; `ffn_active` is what one token uses."""
    D = cfg.d_model
    attention = 4 * D * attention_dim(cfg)  # wq, wk, wv, wo
    norms = 2 * D if cfg.norm_gain else 0  # attn_norm and ffn_norm gains
    one_ffn = ffn_matrices(cfg) * D
    if cfg.ffn is FFNKind.MOE:
        router = D * cfg.n_experts
        stored = cfg.n_experts * one_ffn * cfg.expert_width
        active = cfg.top_k * one_ffn * cfg.expert_width
    else:
        router, stored = 0, one_ffn * cfg.ffn_width
        active = stored
    return {"attention": attention, "norms": norms, "router": router, "ffn_stored": stored,
            "ffn_active": active}


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Every parameter count of the module docstring, exact."""
    p = layer_params(cfg)
    V, D, L, K = cfg.padded_vocab, cfg.d_model, cfg.n_unique, cfg.n_loops
    once = cfg.n_prelude + cfg.n_coda  # layers run once per token, outside the loop
    final_norm = D if cfg.norm_gain else 0
    shared = p["attention"] + p["norms"]
    stored_layer = shared + p["router"] + p["ffn_stored"]
    active_layer = shared + (p["router"] if cfg.count_router else 0) + p["ffn_active"]
    embedding = 2 * V * D
    # FiLM (loop_modulation=film): a scale and a shift of width D per loop, part of the core;
    # each loop pass uses its own row.
    film = 2 * K * D if cfg.loop_modulation is LoopModulation.FILM else 0
    # Parcae's injection (injection=parcae): B (D x D), log_a and log_dt, used on every loop.
    # Huginn's adapter (injection=concat): (2D x D), used on every loop.
    inject = {Injection.PARCAE: D * D + 2 * D, Injection.CONCAT: 2 * D * D}.get(cfg.injection, 0)
    unique = (once + L) * stored_layer + final_norm + film + inject
    active_nonemb = (once + K * L) * active_layer + final_norm + film + K * inject
    return {
        "params_embedding": embedding,
        "params_embedding_in": V * D,
        "params_unembedding": D * V,
        "params_unique": unique,
        "params_effective": (once + K * L) * stored_layer + final_norm + film + K * inject,
        "params_active": active_nonemb + embedding,
        "params_active_nonembedding": active_nonemb,
        "params_active_stored": ((once + L) * active_layer + final_norm + embedding + film
                                 + inject),
        "params_total": embedding + unique,
        "params_once": embedding + final_norm + once * stored_layer,
        "params_rec": L * stored_layer + film + inject,
        "params_rec_active": L * active_layer + film // K + inject,
    }


def steps_at_tokens_per_param(cfg: ModelConfig, tokens_per_step: int, ratio: float) -> int:
    """Whole training steps for `ratio` tokens per stored parameter (params_total), the rule
    the FLT study's and the middle-looped presets' step counts follow."""
    return int(ratio * param_counts(cfg)["params_total"] // tokens_per_step)


def steps_at_tokens_per_param_of(config: ConfigDict, ratio: float) -> int:
    """`steps_at_tokens_per_param` of an experiment file's ConfigDict (its model and batch)."""
    t = config.train
    return steps_at_tokens_per_param(parse_model(config.model), t.batch_size * t.seq_len, ratio)


def attention_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = False) -> float:
    """Training FLOPs per token of the T x T attention matmuls over all layer uses:
    forward 2*T*HK (q.k) + 2*T*HK (probs.v) per layer use, x3 for training, halved if causal."""
    per_use = 3 * 4 * seq_len * attention_dim(cfg)
    return per_use * cfg.effective_depth * (0.5 if causal else 1.0)


def flops_per_token(cfg: ModelConfig, seq_len: int, convention: FlopConvention) -> float:
    """Training FLOPs per token under `convention` (see the module docstring)."""
    p = param_counts(cfg)
    if convention is FlopConvention.KAPLAN:
        return 6.0 * p["params_active_nonembedding"]
    six_n = 6.0 * p["params_active"]
    if convention is FlopConvention.SPARSE_STUDY:
        return six_n
    causal = convention is FlopConvention.ATTENTION_CAUSAL
    return six_n + attention_flops_per_token(cfg, seq_len, causal)


def maxtext_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token as MaxText counts them for its MFU (its
    `calculate_tflops_training_per_device`): 6 x the matmul parameters a token passes through
    (every layer use, MoE's top_k experts and router as `params_active`, the unembedding) but
    not the input embedding, a table lookup that multiplies nothing; plus the attention
    matmuls of a causal mask, half of the T x T products. The count of MFU as the field reports
    it, lower than `6n_attn`'s (which counts the lookup and the masked half)."""
    p = param_counts(cfg)
    return (6.0 * (p["params_active"] - p["params_embedding_in"])
            + attention_flops_per_token(cfg, seq_len, causal=True))


def layer_use_flops(cfg: ModelConfig, seq_len: int, convention: FlopConvention) -> float:
    """Training FLOPs per token of one layer use under `convention`: what one more loop of a
    one-layer core adds (the same in the prelude, the core and the coda)."""
    one = dataclasses.replace(cfg, n_unique=1, n_loops=1, n_prelude=0, n_coda=0)
    two = dataclasses.replace(one, n_loops=2)
    return flops_per_token(two, seq_len, convention) - flops_per_token(one, seq_len, convention)


def step_flops_per_token(cfg: ModelConfig, seq_len: int, convention: FlopConvention,
                         bptt_loops: int = 0) -> float:
    """Training FLOPs per token of a step at cfg.n_loops loops, with truncated backpropagation
    through the last `bptt_loops` (0: all): the core's earlier iterations run forward only, so
    they cost 2N of the convention's 6N (the backward's 4N dropped)."""
    full = flops_per_token(cfg, seq_len, convention)
    if not bptt_loops or cfg.n_loops <= bptt_loops:
        return full
    frozen = (cfg.n_loops - bptt_loops) * cfg.n_unique
    return full - frozen * layer_use_flops(cfg, seq_len, convention) * 2.0 / 3.0


def flops_by_part(cfg: ModelConfig, seq_len: int, convention: FlopConvention) -> dict[str, float]:
    """Training FLOPs per token under `convention` by part, as the recurrence law counts them:
    the prelude once, the core n_loops times, the coda once, and `other` (the vocabulary
    matrices and final norm, as the convention counts them)."""
    layer = layer_use_flops(cfg, seq_len, convention)
    parts = {"prelude": cfg.n_prelude * layer, "core": cfg.n_loops * cfg.n_unique * layer,
             "coda": cfg.n_coda * layer}
    return {**parts, "other": flops_per_token(cfg, seq_len, convention) - sum(parts.values())}


def flops_by_convention(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    return {c.value: flops_per_token(cfg, seq_len, c) for c in FlopConvention}


# ---- what the compiled step executes -------------------------------------------------------
# Elementwise flops per element, forward + backward, as XLA's HloCostAnalysis counts them
# (one flop per elementwise op and per reduced element; exp/tanh/rsqrt/logistic are
# `transcendentals`, not flops). Read off the compiled CPU step by varying one dimension at a
# time; they are the main terms only (a few percent of the total at d 64), not an exact tally.
EW_NORM = 12  # RMSNorm: square, mean, scale; backward about twice that
EW_GAIN = 12  # learnable norm gain: multiply, and its two backward products
EW_RESIDUAL = 2  # a residual add and the fan-out add of its gradient
EW_ROPE = 20  # rotary on q and k (per element of q): 6 ops each way for q and for k
EW_QK_NORM = 19  # the parameter-free norms of q and k (per element of q)
EW_ATTN_PROBS = 14  # per logit: scale, mask select, softmax; backward of the three
EW_ACTIVATION = {MLPKind.SWIGLU: 21, MLPKind.RELU2: 7, MLPKind.GELU: 42}
EW_CROSS_ENTROPY = 4  # per logit: log-softmax and its gradient
EW_SOFTCAP = 5  # per logit: divide, multiply, and the tanh derivative
EW_FILM = 6  # per element of a loop's start: scale and shift, and their three gradients
EW_PARCAE = 8  # per element of a loop's start: decay, add, and their gradients (measured)
EW_CONCAT = 12  # per element of a loop's start: the halves' sum and its gradients (measured)
EW_DENSE_MASK = 4  # per element of the CPU ragged_dot expansion: 2 compares, and, select
EW_GATHER = 10  # per assigned token and d_model: sort gather, unsort gather, combine, backward
EW_ROUTER = 20  # per token and expert: softmaxes, one-hot load, both aux losses
EW_QUEUE = 4  # capacity dispatch, per (token, choice, expert): one-hot queue and its cumsum


def _moe_costs(cfg: ModelConfig, seq_len: int,
               ragged_dot_dense: bool) -> tuple[float, float, float]:
    """(training, forward, combine forward) FLOPs per token of one MoE layer use.

    Dropless dispatch runs `jax.lax.ragged_dot`. On CPU JAX lowers it densely: the sorted
    assignments are masked into an (E, A, D) array and multiplied with all E experts, so each
    of the three matmuls (forward, two backward) costs E times the grouped one, plus a select
    mask per expanded element (once per distinct expanded operand: XLA reuses the rest). On GPU
    and TPU it lowers to a grouped matmul (`ragged_dot_dense=False`).
    Capacity dispatch: tokens gathered into E x C slots per sequence and back (no matmuls),
    queue positions from a cumsum over a one-hot (integers: no gradient), the experts on all
    E*C slots, filled or not."""
    D, E, k, F = cfg.d_model, cfg.n_experts, cfg.top_k, cfg.expert_width
    nm = ffn_matrices(cfg)
    router = 2 * D * E
    ew = EW_ROUTER * E
    if cfg.moe_dispatch is MoEDispatch.DROPLESS:
        rows = k * (E if ragged_dot_dense else 1)  # expert-matmul rows per token
        combine = 2 * k * D
        fwd = router + rows * nm * 2 * D * F + combine
        ew += EW_ACTIVATION[cfg.mlp] * k * F + EW_GATHER * k * D
        if ragged_dot_dense:
            ew += EW_DENSE_MASK * k * E * (2 * D + nm * F)
        return 3 * fwd + ew, fwd, combine
    C = capacity(cfg, seq_len)
    slots = E * C / seq_len  # expert rows per token, filled or not
    combine = 2 * k * D  # the gate-weighted sum of the k gathered expert outputs
    fwd = router + slots * nm * 2 * D * F + combine
    ew += EW_ACTIVATION[cfg.mlp] * slots * F + EW_GATHER * k * D + EW_QUEUE * k * E
    return 3 * fwd + ew, fwd, combine


def _layer_costs(cfg: ModelConfig, seq_len: int,
                 ragged_dot_dense: bool) -> tuple[float, float, float]:
    """(training, forward, last forward) FLOPs per token of one layer use, norms excluded.

    training: projections, q.k and probs.v over the full T x T matrix (masked entries too),
    the FFN, x3 for the backward, plus elementwise work; forward: the forward part, what remat
    recomputes; last: the final matmul, whose output the backward never needs."""
    D, HK, T = cfg.d_model, attention_dim(cfg), seq_len
    attn_fwd = 8 * D * HK + 4 * T * HK  # wq wk wv wo, q.k, probs.v
    ew = EW_ATTN_PROBS * cfg.n_heads * T + EW_ROPE * HK + 2 * EW_RESIDUAL * D
    if cfg.qk_norm:
        ew += EW_QK_NORM * HK
    if cfg.ffn is FFNKind.MOE:
        ffn_train, ffn_fwd, last = _moe_costs(cfg, seq_len, ragged_dot_dense)
    else:
        F = cfg.ffn_width
        ffn_fwd = ffn_matrices(cfg) * 2 * D * F
        ffn_train, last = 3 * ffn_fwd + EW_ACTIVATION[cfg.mlp] * F, 2 * F * D
    return 3 * attn_fwd + ew + ffn_train, attn_fwd + ew / 3 + ffn_fwd, last


def _dots_kept(cfg: ModelConfig) -> float:
    """Forward FLOPs per token of a layer use that `remat=dots` keeps rather than recomputes,
    less the last matmul (which no remat recomputes): the four attention projections and a
    dense FFN's first matmuls, dot_generals without batch dimensions. (An MoE's grouped
    matmuls are another primitive, recomputed.)"""
    kept = 8 * cfg.d_model * attention_dim(cfg)
    if cfg.ffn is not FFNKind.MOE:
        kept += ffn_matrices(cfg) * 2 * cfg.d_model * cfg.ffn_width - 2 * cfg.ffn_width * cfg.d_model
    return kept


def _norms_per_layer_use(cfg: ModelConfig, t: int, layer: int) -> int:
    """RMSNorm applications in one layer on loop t (0-based), injection included."""
    n = 2  # attn_norm, ffn_norm
    if t > 0 and cfg.injection is Injection.FLA:
        n += 1  # z = norm(x + h)
    first = cfg.injection is Injection.ATTN_FIRST and layer == 0
    injected = cfg.injection is Injection.FLT or first
    if t > 0 and injected:
        n += 1  # attn_norm(h) for the injected queries
    return n


def _loop_start_norms(cfg: ModelConfig, t: int) -> int:
    """Norms where loop t's stream starts: h = norm(x_prev), and for `input` norm(e + h)."""
    if t == 0:
        return 1 if cfg.embed_norm else 0
    return {Injection.NONE: 1, Injection.INPUT: 2, Injection.REPEAT: 0,
            Injection.PARCAE: 0, Injection.CONCAT: 0}.get(cfg.injection, 1)


def _reused_per_loop(cfg: ModelConfig) -> float:
    """Forward FLOPs per token that XLA computes once instead of once per loop in the unrolled
    step: with `flt` and `attn_first` every loop restarts from norm(e), so the first layer's
    keys and values (norm, two projections, rotary on k) are the same on every loop."""
    if cfg.injection not in (Injection.FLT, Injection.ATTN_FIRST):
        return 0.0
    D, HK = cfg.d_model, attention_dim(cfg)
    return 2 * 2 * D * HK + 3 * HK + 3 * D


def _readouts(cfg: ModelConfig) -> tuple[int, int]:
    """(readouts computed, readouts in the loss): with loss at several loops the model reads
    out every loop boundary (the unused ones' backward runs on zero cotangents), and runs the
    coda at each of them."""
    if cfg.loss_loops is LossLoops.LAST:
        return 1, 1
    return cfg.n_loops, len(loss_loop_indices(cfg.loss_loops, cfg.n_loops))


def computed_flops_per_token(cfg: ModelConfig, seq_len: int,
                             ragged_dot_dense: bool = True) -> float:
    """FLOPs per token of the compiled, unrolled training step, counted as XLA counts them.

    Matmuls are exact: 2*m*n*k forward and twice that backward (gradients to both operands),
    attention over the full T x T matrix, the unembedding at every readout, remat's recomputed
    forward (all but the matmul whose output the backward never needs), less the loop-invariant
    first-layer keys and values XLA computes once (`_reused_per_loop`; a scanned step
    recomputes them every loop). Elementwise work uses the EW_* table (approximate).
    `ragged_dot_dense`: the MoE grouped matmul runs densely over all experts (CPU lowering)."""
    D, V, K, L = cfg.d_model, cfg.padded_vocab, cfg.n_loops, cfg.n_unique
    norm = EW_NORM + (EW_GAIN if cfg.norm_gain else 0)
    train, forward, last = _layer_costs(cfg, seq_len, ragged_dot_dense)
    computed, in_loss = _readouts(cfg)
    # The core's K x L layer uses; the prelude's once; the coda's at every readout computed.
    # Outside the core a layer is plain (two norms, as on loop 1), and loop remat
    # rematerialises the prelude and each coda pass as one block.
    passes = [(cfg.n_prelude, 1), (cfg.n_coda, computed)]  # (layers, passes) outside the core
    total = K * L * train - (K - 1) * _reused_per_loop(cfg)
    film = EW_FILM * D if cfg.loop_modulation is LoopModulation.FILM else 0
    if cfg.injection is Injection.PARCAE:
        # B_bar e0 is the same on every loop: XLA computes its forward once in the unrolled
        # step, its two backward matmuls once per loop (measured: 10 D^2 at 2 loops).
        total += 2 * D * D + K * (4 * D * D + EW_PARCAE * D)
    if cfg.injection is Injection.CONCAT:
        # The adapter's e half likewise (2 D^2 once, 4 D^2 a loop); its state half 6 D^2 a
        # loop, less the gradient into loop 1's zero state (2 D^2): 10 K D^2 in all (measured).
        total += K * (10 * D * D + EW_CONCAT * D)
    for t in range(K):
        total += _loop_start_norms(cfg, t) * EW_NORM * D + film
        total += sum(_norms_per_layer_use(cfg, t, layer) for layer in range(L)) * norm * D
    total += sum(n * runs * (train + 2 * norm * D) for n, runs in passes)
    if cfg.remat is Remat.LAYER:
        total += (K * L + sum(n * runs for n, runs in passes)) * (forward - last)
    elif cfg.remat is Remat.DOTS:
        total += (K * L + sum(n * runs for n, runs in passes)) * (forward - _dots_kept(cfg) - last)
    elif cfg.remat is Remat.LOOP:
        total += K * (L * forward - last)
        total += sum(runs * (n * forward - last) for n, runs in passes if n)
    head = computed * (3 * 2 * D * V + norm * D)
    head += in_loss * V * (EW_CROSS_ENTROPY + (EW_SOFTCAP if cfg.logit_softcap else 0))
    return total + head + 2 * D  # + the embedding gather and its scatter-add


def report(cfg: ModelConfig, seq_len: int, convention: FlopConvention,
           ragged_dot_dense: bool = True) -> dict:
    """The analytic part of `loopscale flops`: params, and FLOPs per token under each view."""
    out: dict = dict(param_counts(cfg))
    out["flop_convention"] = convention.value
    out["count_router"] = cfg.count_router  # whether params_active and the 6N FLOPs hold routers
    out["flops_per_token_train"] = flops_per_token(cfg, seq_len, convention)
    out["flops_per_token_6n"] = flops_per_token(cfg, seq_len, FlopConvention.KAPLAN)
    out["flops_per_token_by_convention"] = flops_by_convention(cfg, seq_len)
    out["flops_per_token_by_part"] = flops_by_part(cfg, seq_len, convention)
    out["attention_flops_per_token"] = attention_flops_per_token(cfg, seq_len)
    out["flops_per_token_computed"] = computed_flops_per_token(cfg, seq_len, ragged_dot_dense)
    out["moe_ragged_dot_dense"] = bool(ragged_dot_dense and cfg.ffn is FFNKind.MOE
                                       and cfg.moe_dispatch is MoEDispatch.DROPLESS)
    out["seq_len"] = seq_len
    out["effective_depth"] = cfg.effective_depth
    return out
