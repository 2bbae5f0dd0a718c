"""Named presets: each study's backbone, parametrisation and optimiser recipe (PAPERS.md).

Experiment files start from one of these and set only what differs."""

from __future__ import annotations

from ml_collections import ConfigDict

from loopscale.config.defaults import base_config

GPT2_VOCAB = 50257
QWEN_VOCAB = 151669  # the FLT study's tokenizer


def sparse_study(arg: str | None, n_unique: int, n_loops: int, ffn: str,
                 paper_d_model: int) -> ConfigDict:
    """The four families of the sparse-layers study differ only in these four arguments."""
    c = base_config()
    m = c.model
    m.n_unique, m.n_loops, m.ffn = n_unique, n_loops, ffn
    m.injection = "repeat"  # plain repetition: no re-injection, no prelude/coda
    m.embed_norm = False
    m.mlp = "swiglu"
    m.head_dim = 64
    m.norm_gain = False
    m.n_experts, m.top_k = 8, 2
    m.param = "mup_sparse"
    m.base_d_model = 128
    c.train.optimizer = "adamw"
    c.train.b1, c.train.b2, c.train.eps = 0.9, 0.999, 1e-8
    c.train.weight_decay, c.train.weight_decay_mode = 1e-4, "independent"
    c.train.schedule, c.train.cooldown, c.train.decay_frac, c.train.min_lr_frac = "wsd", "sqrt", 0.1, 0.05
    c.train.lb_loss_weight, c.train.router_z_weight = 0.01, 0.001
    c.flop_convention = "6n_emb"
    if arg == "paper":
        m.d_model, m.n_heads, m.vocab_size = paper_d_model, paper_d_model // 64, GPT2_VOCAB
        c.train.seq_len, c.train.batch_size = 1024, 256
        m.dtype = "bfloat16"  # activations; parameters, softmaxes and the loss stay float32
    else:  # tiny
        m.d_model, m.n_heads, m.vocab_size = 64, 1, 256
        m.n_unique = max(1, n_unique // 4)
        c.train.seq_len, c.train.batch_size, c.train.steps = 64, 8, 50
        c.train.warmup_steps = 5
    return c


def flt_study(arg: str | None, injection: str, n_loops: int) -> ConfigDict:
    """The FLT study's backbone (arXiv 2605.18797, released code): parameter-free RMSNorm, no
    biases, rotary then qk-norm, head size 128, relu^2 MLP of width 4d, untied embeddings,
    logits soft-capped at 15, zero-initialised output projections, loop 1 on norm(e); Muon on
    the block matrices with AdamW on embedding (0.2) and head (0.004), betas (0.8, 0.95), no
    warmup, constant then linear decay over the last 20%, clip 1.0.

    `paper` is the Base model (12 layers, d 768, 6 heads: 317.9M params); `small` the Small one
    (6 layers, d 384, 3 heads: 127.1M); `tiny` the CPU setting of PAPERS.md's practical notes
    (d 128, 2 heads of 64, 2 layers per loop, byte-level text, sequence 128, batch 16, AdamW
    3e-3, betas 0.9/0.95, clip 1, no warmup)."""
    c = base_config()
    m = c.model
    m.injection, m.n_loops = injection, n_loops
    m.embed_norm = True
    m.qk_norm = True
    m.norm_gain = False
    m.mlp = "relu2"
    m.d_ff = 0  # 4d for relu^2
    m.logit_softcap = 15.0
    m.zero_init_out = True
    m.loss_loops = "last"
    m.param = "sp"
    c.train.grad_clip = 1.0
    c.train.warmup_steps = 0
    if arg in ("paper", "small"):
        m.vocab_size, m.head_dim = QWEN_VOCAB, 128
        m.d_model, m.n_heads, m.n_unique = (768, 6, 12) if arg == "paper" else (384, 3, 6)
        m.base_d_model = m.d_model
        c.train.seq_len, c.train.batch_size = 1024, 512  # 524,288 tokens per step
        c.train.optimizer = "muon"
        c.train.lr, c.train.embed_lr, c.train.head_lr = 0.02, 0.2, 0.004
        c.train.b1, c.train.b2 = 0.8, 0.95
        c.train.schedule, c.train.cooldown, c.train.decay_frac = "wsd", "linear", 0.2
        c.model.dtype = "bfloat16"
        if arg == "paper" and n_loops > 6:
            # Compiled for v5p-128 at batch 512 (8 rows a chip), the step keeps every layer's
            # activations: 66.6 GB a chip at 6 loops, 111 GB at 12 (the chip has 102.8 GB).
            # Beyond 6 loops keep only each layer's input and recompute the rest (~1/3 more
            # compute); benchmarks/compile_paper.py measures both.
            m.remat = "layer"
    else:  # tiny
        m.vocab_size, m.head_dim = 256, 64
        m.d_model, m.n_heads, m.n_unique = 128, 2, 2
        m.base_d_model = 128
        c.train.seq_len, c.train.batch_size, c.train.steps = 128, 16, 200
        c.train.optimizer = "adamw"
        c.train.lr, c.train.b1, c.train.b2 = 3e-3, 0.9, 0.95
        c.train.schedule = "constant"
    return c
