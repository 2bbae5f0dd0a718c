"""The FLT stability study: a looped block with one of the five injection modes.

    loopscale flops --config=experiments/flt.py:tiny --config.model.injection=none
    loopscale flops --config=experiments/flt.py:paper   # Base, 12 layers x 6 loops, 317.9M

ARG is `tiny` (CPU), `small` or `paper`, optionally followed by `,LOOPS`, e.g. `tiny,12`.
Default injection `flt` (FLA + attention injection at every layer); compare with
`--config.model.injection=none|input|attn_first|fla`. At 12 loops on CPU the original LT
(`none`) should stall at the byte-unigram loss with a growing residual norm while `flt` trains.

The study's backbone (arXiv 2605.18797, released code): parameter-free RMSNorm, no biases,
rotary then qk-norm, head size 128, relu^2 MLP of width 4d, untied embeddings, logits
soft-capped at 15, zero-initialised output projections, loop 1 on norm(e). `small` and `paper`
also take the released code's init (`authors_init`) and recipe: Muon (0.02, momentum 0.85 ->
0.95 over the first 300 steps) on the block matrices, AdamW on embedding (0.2) and head (0.004)
scaled by (d/768)^-0.5, betas (0.8, 0.95), eps 1e-10; no warmup, constant then linear decay to
0 over the last 20%, clip 1.0; 20 tokens per parameter (`steps_for`). (optax's Muon
bias-corrects its momentum, the authors' does not; the difference fades within ~50 steps.)
`paper` is the Base model (12 layers, d 768, 6 heads: 317.9M params); `small` the Small one
(6 layers, d 384, 3 heads: 127.1M); `tiny` the CPU setting of PAPERS.md's practical notes
(d 128, 2 heads of 64, 2 layers per loop, byte-level text, sequence 128, batch 16, AdamW 3e-3,
betas 0.9/0.95, clip 1, no warmup; loopscale's default init). Only what differs from
loopscale/config/defaults.py is set below.
"""

from ml_collections import ConfigDict

from loopscale import flops
from loopscale.config import base_config, parse_model, presets

QWEN_VOCAB = 151669  # the FLT study's tokenizer
TOKENS_PER_PARAM = 20


def authors_init(m: ConfigDict) -> None:
    """The released code's init (nanochat/gpt.py, init_weights): embedding normal std 1.0, head
    normal std 0.001, Q/K/V and the MLP's input uniform with std 1/sqrt(d) (bound sqrt(3/d)),
    both output projections zero. 1/sqrt(d) follows --config.model.d_model."""
    inv_sqrt_d = m.get_ref("d_model").to_float() ** -0.5
    table = {"embedding": ("normal", 1.0), "head": ("normal", 0.001),
             "attn_qkv": ("uniform", inv_sqrt_d), "ffn_in": ("uniform", inv_sqrt_d),
             "attn_out": ("zeros", 0.0), "ffn_out": ("zeros", 0.0)}
    for role, (dist, std) in table.items():
        m.init[role].dist, m.init[role].std = dist, std


def steps_for(m: ConfigDict, t: ConfigDict) -> int:
    """20 training tokens per parameter (target_param_data_ratio = 20 over every stored
    parameter, the padded vocabulary's rows included, as the authors count them), in whole
    steps: 12,127 for `paper`, 4,848 for `small`. Computed for the preset's
    shape: with another d_model, n_unique or vocabulary, set --config.train.steps too."""
    return flops.steps_at_tokens_per_param(parse_model(m), t.batch_size * t.seq_len,
                                           TOKENS_PER_PARAM)


def get_config(arg: str | None = "tiny") -> ConfigDict:
    size, _, loops = (arg or "tiny").partition(",")
    c = base_config()
    c.name = "flt"
    m = c.model
    m.injection = "flt"
    m.n_loops = int(loops) if loops else 6 if size != "tiny" else 4
    m.embed_norm = True
    m.qk_norm = True
    m.mlp = "relu2"  # d_ff 0: 4d
    m.logit_softcap = 15.0
    m.zero_init_out = True
    m.param = "sp"
    c.train.warmup_steps = 0
    if size in ("paper", "small"):
        m.vocab_size, m.head_dim = QWEN_VOCAB, 128
        # Stored padded to 151,680 rows, as the authors' code pads it (there to a multiple of
        # 64; 128 gives the same and divides a vocabulary axis sharded up to 128 ways).
        m.vocab_multiple = 128
        m.d_model, m.n_heads, m.n_unique = (768, 6, 12) if size == "paper" else (384, 3, 6)
        m.base_d_model = m.d_model
        authors_init(m)
        c.train.seq_len, c.train.batch_size = 1024, 512  # 524,288 tokens per step
        c.train.optimizer = "muon"
        c.train.lr = 0.02
        # The AdamW LRs were tuned at d 768 and scale as (d/768)^-0.5 (setup_optimizers); a
        # field reference, so they follow --config.model.d_model.
        adam_scale = (m.get_ref("d_model").to_float() / 768) ** -0.5
        c.train.embed_lr, c.train.head_lr = adam_scale * 0.2, adam_scale * 0.004
        c.train.b1, c.train.eps = 0.8, 1e-10  # AdamW betas (0.8, 0.95), eps 1e-10
        # Muon's momentum 0.85 -> 0.95 over the first 300 steps (get_muon_momentum).
        c.train.muon_momentum_start, c.train.muon_momentum_warmup = 0.85, 300
        c.train.schedule = "wsd"  # linear cooldown over the last 20%
        c.train.steps = steps_for(m, c.train)
        m.dtype = "bfloat16"
        c.train.log_every = presets.PAPER_LOG_EVERY
        if size == "paper" and m.n_loops > 16:
            # Compiled for v5p-128 at batch 512 (8 rows a chip) with the splash attention kernel
            # (model.attention=auto on TPU, 2026-12-05), the step keeps every layer's
            # activations: 38.4 GB a chip at 6 loops, 62.5 at 12, 78.5 at 16 (76% of the chip's
            # 102.8 GB), 86.5 at 18. Beyond 16 loops keep each layer's projection and FFN
            # matmul outputs and recompute the rest (norms, activations, attention): at 18
            # loops 35.8 GB and an estimated 0.511 s a step, where keeping only each layer's
            # input (remat=layer) took 14.1 GB and 0.573 s (2026-12-06). (With the einsums'
            # attention, which keeps T x T scores, 6 loops took 66.6 GB and 12 did not fit.)
            m.remat = "dots"
    else:  # tiny
        m.head_dim = 64
        c.train.schedule = "constant"
    return c
