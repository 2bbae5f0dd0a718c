"""The enums of the configuration: every field that takes one of a few named values (an FFN
kind, an injection, a schedule, ...). `parse` (validate.py) turns the ConfigDict's strings into
them when the config is read, so a typo fails at start-up naming the field and the allowed
values; the library then looks values up by member, never by string.
"""

from __future__ import annotations

import enum


class Injection(enum.Enum):
    """How loop t >= 2 sees loop t-1 (PAPERS.md section 1; loop 1 is always the plain stack)."""

    NONE = "none"  # original LT: x0 = h(t-1) = norm(x_L(t-1))
    INPUT = "input"  # x0 = norm(e + h(t-1))
    ATTN_FIRST = "attn_first"  # x0 = norm(e); layer 1 takes its queries from h(t-1)
    FLA = "fla"  # x0 = norm(e); every layer restarts from z = norm(x + h(t-1))
    FLT = "flt"  # x0 = norm(e); every layer takes its queries from h(t-1)
    # Plain repetition (the sparse-layers study): the residual stream runs on unchanged, so a
    # K-loop model is a K*L-layer model with tied weights.
    REPEAT = "repeat"
    # Parcae (Prairie et al. 2026): every loop, loop 1 included, starts from
    # exp(dt * A) x_prev + dt * B e0 (x_prev = 0 before loop 1), A = -exp(log_a) diagonal, so
    # the state's decay lies in (0, 1) by construction (model/block.py `Loop._parcae`).
    PARCAE = "parcae"
    # Huginn (Geiping et al. 2025, its `core_block_forward`): every loop, loop 1 included,
    # starts from adapter([x_prev; e]) with a learned (2 d_model, d_model) adapter
    # (x_prev = 0 before loop 1; model/block.py `Loop._concat`).
    CONCAT = "concat"


class AttentionImpl(enum.Enum):
    """How the attention core (scores, causal mask, softmax, values) is computed
    (model/attention_core.py); every path computes the same function."""

    AUTO = "auto"  # splash on TPU, cudnn on GPU with 16-bit activations, xla elsewhere
    XLA = "xla"  # einsums, float32 scores of size T x S kept for the backward pass
    SPLASH = "splash"  # the Pallas TPU kernel (Pallas interpret mode off TPU)
    CUDNN = "cudnn"  # jax.nn.dot_product_attention(implementation="cudnn"): GPUs only


class GroupedMatmul(enum.Enum):
    """How dropless MoE runs its experts' grouped matmul (model/moe.py); both compute the same."""

    AUTO = "auto"  # megablox on TPU (where the tensor axis is 1), ragged_dot elsewhere
    RAGGED_DOT = "ragged_dot"  # jax.lax.ragged_dot: XLA's own; priced dense over experts on TPU
    MEGABLOX = "megablox"  # the Pallas TPU grouped-matmul kernel (Pallas interpret mode off TPU)


class GradReduction(enum.Enum):
    """When the data-parallel gradient is summed across devices, and fsdp's parameters
    gathered (train/step.py)."""

    # Each device sums its own gradient over every use of a shared weight (every loop) and
    # every micro-batch, then one reduction over `data` and `fsdp` per step (fsdp's
    # parameters gathered once, before the loops), where train/step.py `once_axes` allows it
    # (at most one other mesh axis split, none for an MoE); per_use elsewhere
    ONCE = "once"
    PER_USE = "per_use"  # as XLA partitions the step by itself: at every use


class FFNKind(enum.Enum):
    DENSE = "dense"
    MOE = "moe"


class MLPKind(enum.Enum):
    SWIGLU = "swiglu"
    GELU = "gelu"
    RELU2 = "relu2"


class MoEDispatch(enum.Enum):
    DROPLESS = "dropless"  # tokens sorted by expert, grouped matmul (jax.lax.ragged_dot)
    CAPACITY = "capacity"  # one-hot dispatch/combine einsums with a per-expert capacity


class Param(enum.Enum):
    """Parametrisation: how init, forward multipliers and LRs depend on width (model/mup.py)."""

    MUP = "mup"  # microsoft/mup rules for Adam
    MUP_SPARSE = "mup_sparse"  # the sparse-layers study's variant: init var and LR / (d/base)
    SP = "sp"  # standard parametrisation: nothing depends on width


class InitDist(enum.Enum):
    """A weight's starting distribution, given its std (model/layers.py)."""

    NORMAL = "normal"
    # Cut at 3 sigma; `std` is the untruncated normal's, as in torch's trunc_normal_ and JAX's
    # truncated_normal (the sample's std is 0.987 x that).
    TRUNCATED_NORMAL = "truncated_normal"
    UNIFORM = "uniform"  # symmetric, bound sqrt(3) * std
    ZEROS = "zeros"


class Remat(enum.Enum):
    """What the backward pass recomputes instead of keeping from the forward."""

    NONE = "none"
    LAYER = "layer"  # each layer use keeps its input only
    LOOP = "loop"  # each loop keeps its input only
    # Each layer use keeps its matmuls' outputs without batch dimensions (the projections and
    # the FFN's: jax.checkpoint_policies.dots_with_no_batch_dims_saveable) and recomputes the
    # rest: norms, activations, rotary, and the attention itself (its q.k and probs.v einsums,
    # or the splash kernel's forward).
    DOTS = "dots"


class LoopModulation(enum.Enum):
    """What tells the core which loop it is on (model/block.py `Loop`)."""

    NONE = "none"
    FILM = "film"  # a learned scale and shift per loop index on the core's input


class LossLoops(enum.Enum):
    """Which loop boundaries the LM loss is taken at (averaged over them)."""

    LAST = "last"
    ALL = "all"
    LAST_THIRD = "last_third"


class DType(enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


class FlopConvention(enum.Enum):
    """What a 'FLOP' of training compute counts (flops.py). Accounting moves fitted exponents."""

    KAPLAN = "6n"  # 6 * non-embedding params (per use)
    SPARSE_STUDY = "6n_emb"  # 6 * (params per use + embedding + unembedding), no attention
    ATTENTION = "6n_attn"  # 6N + full T x T attention matmuls
    ATTENTION_CAUSAL = "6n_attn_causal"  # 6N + half of the attention matmuls (causal)


class Schedule(enum.Enum):
    CONSTANT = "constant"
    COSINE = "cosine"  # linear warmup then cosine to min_lr_frac
    WSD = "wsd"  # warmup, stable, decay over the last decay_frac of steps


class LoopDist(enum.Enum):
    """How a training step's loop count is drawn (train/loop_schedule.py)."""

    FIXED = "fixed"  # model.n_loops every step
    UNIFORM = "uniform"  # uniformly from train.loop_choices
    POISSON_LOGNORMAL = "poisson_lognormal"  # Huginn's: r = Poisson(tau) + 1, tau log-normal


class Cooldown(enum.Enum):
    LINEAR = "linear"
    SQRT = "sqrt"


class Optimizer(enum.Enum):
    ADAMW = "adamw"
    MUON = "muon"  # Muon on block matrices, AdamW on embedding and head (FLT recipe)


class WeightDecay(enum.Enum):
    COUPLED = "coupled"  # decay scaled by the LR (optax.adamw); under muP by the base LR, as MuAdamW
    INDEPENDENT = "independent"  # decay not scaled by the LR schedule peak


class DataSource(enum.Enum):
    PERMUTATION = "permutation"
    TEXT = "text"
    TFDS = "tfds"


class Tokenizer(enum.Enum):
    BYTE = "byte"
    SENTENCEPIECE = "sentencepiece"


class ValSplit(enum.Enum):
    """Which documents a text corpus without its own validation split holds out (data/text.py)."""

    TAIL = "tail"  # the last documents (for the KJV: the end of Revelation)
    SPREAD = "spread"  # every k-th document, so the held-out text comes from across the corpus
