"""The sparse-layers study's recipe (PAPERS.md section 2), shared by its four experiment files.

Each field set here differs from `defaults.base_config()`; what the study shares with the
defaults (AdamW with beta1 0.9 and eps 1e-8, SwiGLU, top-2 of 8 experts, load-balancing and
router z-loss weights 0.01 and 0.001, muP base width 128, the `6n_emb` FLOP convention) is left
to them. It lives in the library, not in experiments/, because experiment files are loaded by
path (config/loader.py runs each file on its own, with no package and nothing added to
sys.path), so experiments/base.py, looped.py, moe.py and looped_moe.py could share a sibling
module only through a sys.path or import-by-path trick. A recipe used by one file lives in that
file (the FLT study's, experiments/flt.py).
"""

from __future__ import annotations

from ml_collections import ConfigDict

from loopscale.config.defaults import base_config

GPT2_VOCAB = 50257


def sparse_study(arg: str | None, n_unique: int, n_loops: int, ffn: str,
                 paper_d_model: int) -> ConfigDict:
    """The four families of the sparse-layers study differ only in these four arguments."""
    c = base_config()
    m = c.model
    m.n_unique, m.n_loops, m.ffn = n_unique, n_loops, ffn
    m.injection = "repeat"  # plain repetition: no re-injection, no prelude/coda
    m.head_dim = 64
    m.param = "mup_sparse"
    c.train.b2 = 0.999
    c.train.weight_decay, c.train.weight_decay_mode = 1e-4, "independent"
    c.train.schedule, c.train.cooldown, c.train.decay_frac, c.train.min_lr_frac = "wsd", "sqrt", 0.1, 0.05
    if arg == "paper":
        m.d_model, m.n_heads, m.vocab_size = paper_d_model, paper_d_model // 64, GPT2_VOCAB
        c.train.seq_len, c.train.batch_size = 1024, 256
        m.dtype = "bfloat16"  # activations; parameters, softmaxes and the loss stay float32
        m.count_router = False  # "router FLOPs are not counted": N_active leaves the router out
    else:  # tiny: byte-level text
        m.d_model, m.n_heads = 64, 1
        m.n_unique = max(1, n_unique // 4)
        c.train.seq_len, c.train.batch_size, c.train.steps = 64, 8, 50
        c.train.warmup_steps = 5
    return c
