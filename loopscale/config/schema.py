"""Typed, frozen configuration dataclasses: `Config` and the sections library functions take
(`ModelConfig`, `TrainConfig`, `DataConfig`, `MeshConfig`, ...).

Every field name here is part of the command-line contract (`--config.model.d_model=...`), and
every default lives in `defaults.base_config`, not here, so the two cannot drift: `parse`
(validate.py) requires every field. The enums the fields use live in enums.py; importing
them here also makes `from loopscale.config.schema import FFNKind` (as the library and tests
read them) keep working.
"""

from __future__ import annotations

import dataclasses
import math

# Every enum a field is annotated with; `typing.get_type_hints` (validate.py) resolves the
# annotations in this module's namespace.
from loopscale.config.enums import (
    AttentionImpl,
    Cooldown,
    DataSource,
    DType,
    FFNKind,
    FlopConvention,
    GradReduction,
    GroupedMatmul,
    InitDist,
    Injection,
    LoopDist,
    LoopModulation,
    LossLoops,
    MLPKind,
    MoEDispatch,
    Optimizer,
    Param,
    Remat,
    Schedule,
    Tokenizer,
    ValSplit,
    WeightDecay,
)


@dataclasses.dataclass(frozen=True)
class InitSpec:
    dist: InitDist
    # At the base width; the parametrisation scales it with width (model/mup.py). 0: init_std.
    std: float


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """How each kind of weight starts (`--config.model.init.head.std=0.001`). The default,
    normal with std 0 everywhere, is every weight normal at `init_std`: loopscale's init
    before this table existed. `zero_init_out` / `zero_init_readout` still force zeros."""

    embedding: InitSpec
    attn_qkv: InitSpec  # wq, wk, wv
    attn_out: InitSpec  # wo
    ffn_in: InitSpec  # w_up and w_gate, dense and experts
    ffn_out: InitSpec  # w_down, dense and experts
    router: InitSpec
    head: InitSpec  # the unembedding

# model.attention=splash: the kernel's blocks are multiples of the TPU's 128 lanes, so the
# sequence length must be one too (model/attention_core.py).
SPLASH_LANES = 128


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    # The embedding and unembedding are stored with the vocabulary rounded up to a multiple of
    # this (`padded_vocab`; the FLT authors pad 151,669 to 151,680), so that a sharded vocabulary
    # axis divides; the padded logits are masked out of every softmax. 1: no padding.
    vocab_multiple: int
    d_model: int
    n_heads: int
    head_dim: int  # 0: d_model // n_heads
    n_unique: int  # unique layers in the looped block (the recurrent core)
    n_loops: int
    # Unlooped layers before and after the core (Huginn's 2-4-2: prelude 2, core 4, coda 2),
    # each with its own parameters; 0 and 0: the core alone, every model before them.
    n_prelude: int
    n_coda: int
    injection: Injection
    # film: x <- x * (1 + scale_t) + shift_t on loop t's start (Marin's per-iteration FiLM,
    # LoopMoE's IterAdaLN); zero-initialised, so the model starts as without it.
    loop_modulation: LoopModulation
    embed_norm: bool  # loop 1 starts from norm(e) (FLT code) instead of e
    attention: AttentionImpl  # the attention core's kernel (auto: the platform's own)
    ffn: FFNKind
    mlp: MLPKind
    d_ff: int  # 0: SwiGLU 64*ceil(8d/3/64), otherwise 4d
    n_experts: int
    top_k: int
    expert_d_ff: int  # 0: d_ff // top_k, so active FFN params equal the dense FFN's
    moe_dispatch: MoEDispatch
    moe_matmul: GroupedMatmul  # dropless experts' grouped matmul (auto: megablox on TPU)
    capacity_factor: float
    qk_norm: bool
    norm_gain: bool  # RMSNorm with a learnable gain
    norm_eps: float
    rope_base: float
    logit_softcap: float  # 0: off; else cap * tanh(z / cap)
    zero_init_out: bool  # attention and MLP output projections start at zero
    zero_init_readout: bool
    loss_loops: LossLoops
    param: Param
    base_d_model: int
    init_std: float  # std at the base width of every weight whose `init` entry has std 0
    init: InitConfig
    attn_mult: float  # attention logits = attn_mult * q.k / d_head under muP
    output_mult: float  # readout forward multiplier at the base width
    emb_mult: float
    remat: Remat
    scan: bool  # nested scans (True) or plain Python loops (False); same params either way
    # With scan: the loops as an nn.scan around the layer scan (True: compile time flat in the
    # loop count) or a Python loop around it (False: no second level of stacked residuals,
    # which XLA:CPU pays for in copies; same params and outputs). One loop is never scanned.
    scan_loops: bool
    dtype: DType  # activation dtype; parameters and softmaxes stay float32
    # Accounting only (flops.py): whether params_active and the 6N FLOPs count the MoE routers'
    # weights. The sparse-layers study does not (its paper presets: false); the model has them.
    count_router: bool

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def ffn_width(self) -> int:
        if self.d_ff:
            return self.d_ff
        if self.mlp is MLPKind.SWIGLU:
            return 64 * math.ceil(8 * self.d_model / 3 / 64)
        return 4 * self.d_model

    @property
    def expert_width(self) -> int:
        return self.expert_d_ff or max(1, self.ffn_width // self.top_k)

    @property
    def width_mult(self) -> float:
        return self.d_model / self.base_d_model

    @property
    def effective_depth(self) -> int:
        """Layer uses per token: the prelude once, the core once per loop, the coda once."""
        return self.n_prelude + self.n_unique * self.n_loops + self.n_coda


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    schedule: Schedule
    warmup_steps: int
    decay_frac: float  # WSD: fraction of steps in the cooldown
    cooldown: Cooldown
    min_lr_frac: float
    optimizer: Optimizer
    b1: float
    b2: float
    eps: float
    weight_decay: float
    weight_decay_mode: WeightDecay
    grad_clip: float  # 0: off
    grad_accum: int
    embed_lr: float  # Muon recipe: AdamW LR of the embedding (0: train.lr)
    head_lr: float  # Muon recipe: AdamW LR of the output head (0: train.lr)
    # Muon recipe: the block matrices' momentum, ramped linearly from muon_momentum_start over
    # the first muon_momentum_warmup updates (0: constant muon_momentum; FLT: 0.85 -> 0.95, 300).
    muon_momentum: float
    muon_momentum_start: float
    muon_momentum_warmup: int
    z_loss_weight: float
    # Positions projected onto the vocabulary at once in the loss (model/loss.py), so the
    # (B, T, V) logits never exist whole; 0: all at once. Changes memory, not the loss.
    ce_chunk: int
    lb_loss_weight: float
    router_z_weight: float
    # The loop count of each training step (train/loop_schedule.py): fixed (model.n_loops),
    # uniform over loop_choices, or poisson_lognormal (Huginn: tau ~ LogNormal(log(loop_mean) -
    # loop_sigma^2 / 2, loop_sigma), r = Poisson(tau) + 1, at most loop_max when it is set).
    loop_dist: LoopDist
    loop_choices: tuple
    loop_mean: float
    loop_sigma: float
    loop_max: int  # 0: no cap
    # Truncated backpropagation: the gradient flows through the last bptt_loops iterations of
    # the core only (the stream entering the one before is a constant); 0: through all.
    bptt_loops: int
    # once (one all-reduce a step) or per_use (XLA's own): enums.GradReduction
    grad_reduction: GradReduction
    intermediate_supervision: bool
    log_every: int
    eval_every: int
    eval_batches: int
    checkpoint_every: int
    keep_checkpoints: int
    # Steps whose checkpoints are saved and kept whatever keep_checkpoints says: the branch
    # points of a cooldown trunk (sweep.branches).
    keep_steps: tuple
    # A cooldown branch starts from the checkpoint at branch_step of the run in branch_from (a
    # run directory; relative: beside this run's), then trains on with its own schedule.
    branch_from: str
    branch_step: int
    loop_grad_every: int  # per-loop gradient norms every N steps (0: never)
    # act_grad_norm per loop (and per layer) on every logged row: one more backward pass per
    # logged step, apart from the train step (train/step.act_grad_norms)
    log_act_grads: bool
    # grad_cosine on every row: the cosine between consecutive steps' raw gradients (one more
    # gradient-sized buffer in the optimiser state: optimizer.track_grad_cosine)
    log_grad_cosine: bool
    peak_flops: float  # chip peak for MFU (0: the chip's from parallel/peaks.py, or measured)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: DataSource
    paths: str  # text files or globs, comma-separated; empty: the KJV text
    tokenizer: Tokenizer
    spm_vocab_size: int
    val_fraction: float
    # which documents are held out (a corpus with its own validation split ignores it)
    val_split: ValSplit
    cache_dir: str  # where packed corpus caches live; empty: ~/.cache/loopscale
    n_nodes: int  # permutation task
    hops_min: int
    hops_max: int
    tfds_name: str
    tfds_data_dir: str
    tfds_text_key: str
    worker_count: int


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int  # -1 fills the devices left over
    fsdp: int
    tensor: int
    expert: int
    # ZeRO-1: the optimiser state split over the data-parallel axis `data` too (each chip keeps
    # and updates its share; parallel/mesh.py `zero1_shardings`); parameters stay whole.
    zero1: bool = False


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig
    train: TrainConfig
    data: DataConfig
    mesh: MeshConfig
    seed: int
    flop_convention: FlopConvention
    name: str

    @property
    def step_shape(self) -> tuple:
        """What the compiled train and eval steps depend on: runs equal in it share them (a
        warm sweep worker compiles a shape once, whatever the budget, schedule or seed)."""
        return (self.model, dataclasses.replace(self.train, **dict.fromkeys(HOST_ONLY_TRAIN)),
                self.mesh)


# Fields of TrainConfig that only the host loop reads (the schedule enters the step as a
# multiplier argument; train/optimizer.py), left out of Config.step_shape.
HOST_ONLY_TRAIN = ("steps", "schedule", "warmup_steps", "decay_frac", "cooldown", "min_lr_frac",
                   "loop_dist", "loop_choices", "loop_mean", "loop_sigma", "loop_max",
                   "log_every", "eval_every", "eval_batches", "checkpoint_every",
                   "keep_checkpoints", "keep_steps", "branch_from", "branch_step",
                   "loop_grad_every", "log_act_grads", "peak_flops")
