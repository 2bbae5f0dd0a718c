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

import math

from ml_collections import ConfigDict

from loopscale.config.defaults import base_config

GPT2_VOCAB = 50257

# The study's four families at 16 effective layers: (unique layers, loops, FFN).
FAMILIES = {
    "base": (16, 1, "dense"),
    "looped": (8, 2, "dense"),
    "moe": (16, 1, "moe"),
    "looped_moe": (8, 2, "moe"),
}

# The study's IsoFLOP budgets and, per family, the compute-optimal width at each, as far as the
# study reports one (PAPERS.md section 2 and issue 12): at 1e18 Base d 896 (246M), Looped 168M
# stored (d 896: 168.0M), MoE 366M stored (no width of the grid gives it: d 704 has 362.1M, d 768
# 417.0M; d 704 is the nearest) and Looped-MoE d 704 (216M stored, 167M active). The optima at the
# three smaller budgets are not given as widths or sizes there: None, not guessed.
BUDGETS = (5e16, 2e17, 5e17, 1e18)
OPTIMAL_WIDTH: dict[str, dict[float, int | None]] = {
    "base": {5e16: None, 2e17: None, 5e17: None, 1e18: 896},
    "looped": {5e16: None, 2e17: None, 5e17: None, 1e18: 896},
    "moe": {5e16: None, 2e17: None, 5e17: None, 1e18: 704},
    "looped_moe": {5e16: None, 2e17: None, 5e17: None, 1e18: 704},
}


# The accelerator presets write a training row every 10 steps: the trainer reads the device
# only at those steps (train/trainer.py), so the host stays out of the device's way, while the
# divergence rule still judges every step. The CPU presets log every step.
PAPER_LOG_EVERY = 10


def glorot_std(fan_in: int, fan_out: int) -> float:
    """Glorot (Xavier) normal std, sqrt(2 / (fan_in + fan_out))."""
    return math.sqrt(2.0 / (fan_in + fan_out))


# The study's init: per kind of weight, the Glorot std at the base shapes (d 128, SwiGLU width
# 64*ceil(8*128/3/64) = 384, 8 experts, the GPT-2 vocabulary) and the embedding at 1.0, each a
# normal truncated at 3 sigma; `mup_sparse` then divides every variance but the embedding's by
# d/128. The experts take the dense FFN's 0.0625 (their own base shape, 128 x 192, would give
# 0.079; the study's figures give one FFN std).
BASE_D, BASE_FF, BASE_EXPERTS = 128, 384, 8
SPARSE_INIT_STD = {
    "embedding": 1.0,
    "attn_qkv": glorot_std(BASE_D, BASE_D),  # 0.088
    "attn_out": glorot_std(BASE_D, BASE_D),
    "ffn_in": glorot_std(BASE_D, BASE_FF),  # 0.0625
    "ffn_out": glorot_std(BASE_FF, BASE_D),
    "router": glorot_std(BASE_D, BASE_EXPERTS),  # 0.121
    "head": glorot_std(BASE_D, GPT2_VOCAB),  # 0.0063
}


def budget_name(budget: float) -> str:
    """5e16, not 5e+16: as the study writes its budgets (and as `paper,BUDGET` takes them)."""
    return f"{budget:.0e}".replace("e+", "e")


def optimal_width(family: str, budget: float) -> int:
    """The study's compute-optimal d_model of `family` at `budget` FLOPs; a ValueError (one line,
    shown by the config loader) where the study does not give it."""
    widths = OPTIMAL_WIDTH[family]
    if budget not in widths:
        raise ValueError(f"{budget_name(budget)} is not one of the study's budgets "
                         f"({', '.join(map(budget_name, BUDGETS))})")
    if widths[budget] is None:
        raise ValueError(f"the sparse-layers study gives no compute-optimal width for {family} at "
                         f"{budget_name(budget)} FLOPs; set --config.model.d_model (and n_heads "
                         f"= d/64)")
    return widths[budget]


def sparse_study(arg: str | None, family: str) -> ConfigDict:
    """The `family` of the sparse-layers study. ARG `tiny` (default): byte-level text on a CPU;
    `paper`: the compute-optimal model at 1e18 FLOPs; `paper,BUDGET`: at another of the
    study's budgets, where it gives the width."""
    size, _, budget = (arg or "tiny").partition(",")
    c = base_config()
    c.name = family
    m = c.model
    m.n_unique, m.n_loops, m.ffn = FAMILIES[family]
    m.injection = "repeat"  # plain repetition: no re-injection, no prelude/coda
    m.head_dim = 64
    m.param = "mup_sparse"
    c.train.b2 = 0.999
    c.train.weight_decay, c.train.weight_decay_mode = 1e-4, "independent"
    c.train.schedule, c.train.cooldown, c.train.decay_frac, c.train.min_lr_frac = "wsd", "sqrt", 0.1, 0.05
    if size == "paper":
        d = optimal_width(family, float(budget or 1e18))
        m.d_model, m.n_heads, m.vocab_size = d, d // 64, GPT2_VOCAB
        c.train.seq_len, c.train.batch_size = 1024, 256
        m.dtype = "bfloat16"  # activations; parameters, softmaxes and the loss stay float32
        c.train.log_every = PAPER_LOG_EVERY
        m.count_router = False  # "router FLOPs are not counted": N_active leaves the router out
        # Two loops as a Python loop around the layer scan: compiled for v5p-128, the nested
        # scan's step needs 22.0 GB a chip (Looped) and 21.4 (Looped-MoE), this one 17.0 and
        # 16.3, compiling as fast (model/transformer.py says why).
        m.scan_loops = False
        for role, std in SPARSE_INIT_STD.items():
            m.init[role].dist, m.init[role].std = "truncated_normal", std
    else:  # tiny: byte-level text, loopscale's default init (the demo's runs were made with it)
        m.d_model, m.n_heads = 64, 1
        m.n_unique = max(1, m.n_unique // 4)
        c.train.seq_len, c.train.batch_size, c.train.steps = 64, 8, 50
        c.train.warmup_steps = 5
    return c


# Middle-looped models (Huginn, Parcae; PAPERS.md section 4): prelude 2 -> core 4 looped ->
# coda 2, the loop count drawn per step from Huginn's log-normal Poisson with backpropagation
# through the last iterations only. Per size: (d_model, heads, vocabulary, E[r] - 1 = loop_mean,
# loop_max, bptt_loops, batch, sequence). `small` is ~100M parameters at Huginn's head size 96
# and vocabulary (65,536) with its mean recurrence 32 and backpropagation depth 8; `tiny` the
# CPU setting (byte-level text, d 64, mean recurrence 4, the last 2 loops backpropagated).
MIDDLE_TOKENS_PER_PARAM = 20  # `small`'s training length
MIDDLE_LOOPED = {
    "tiny": (64, 4, 256, 3.0, 8, 2, 16, 128),
    "small": (576, 6, 65536, 31.0, 64, 8, 256, 1024),
}


def middle_looped(arg: str | None, name: str, injection: str) -> ConfigDict:
    """Huginn's 2-4-2 shape and recurrence schedule with `injection` (`concat`: Huginn's
    adapter; `parcae`: Parcae's stability-constrained injection), at `tiny` or `small`.
    n_loops, the count the model is evaluated at, is the schedule's mean E[r] = loop_mean + 1.
    `small` trains in bfloat16 with a WSD schedule; its steps (20 tokens per stored parameter)
    are set by the experiment file (flops.steps_at_tokens_per_param: flops sits above config)."""
    size = arg or "tiny"
    if size not in MIDDLE_LOOPED:
        raise ValueError(f"experiments/{name}.py takes tiny or small, not {size!r}")
    d, heads, vocab, loop_mean, loop_max, bptt, batch, seq = MIDDLE_LOOPED[size]
    c = base_config()
    c.name = name
    m, t = c.model, c.train
    m.n_prelude, m.n_unique, m.n_coda = 2, 4, 2
    m.injection = injection
    m.d_model, m.n_heads, m.head_dim, m.vocab_size = d, heads, d // heads, vocab
    m.base_d_model = d
    m.n_loops = int(loop_mean) + 1
    t.loop_dist, t.loop_mean, t.loop_sigma = "poisson_lognormal", loop_mean, 0.5
    t.loop_max, t.bptt_loops = loop_max, bptt
    t.batch_size, t.seq_len = batch, seq
    if size == "small":
        m.dtype = "bfloat16"
        t.schedule = "wsd"
        t.log_every = PAPER_LOG_EVERY
    return c
