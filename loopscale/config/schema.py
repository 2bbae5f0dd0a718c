"""Typed, frozen configuration dataclasses and the enums they use.

A ConfigDict from an experiment file is validated once by `parse` into a `Config`; everything
inside the library takes the narrow dataclass it needs. Every field name here is part of the
command-line contract (`--config.model.d_model=...`), and every default lives in
`defaults.base_config`, not here, so the two cannot drift: `parse` requires every field.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import typing
from typing import Any

import ml_collections

from loopscale.errors import UsageError


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
    NONE = "none"
    LAYER = "layer"
    LOOP = "loop"


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


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_heads: int
    head_dim: int  # 0: d_model // n_heads
    n_unique: int  # unique layers in the looped block
    n_loops: int
    injection: Injection
    embed_norm: bool  # loop 1 starts from norm(e) (FLT code) instead of e
    ffn: FFNKind
    mlp: MLPKind
    d_ff: int  # 0: SwiGLU 64*ceil(8d/3/64), otherwise 4d
    n_experts: int
    top_k: int
    expert_d_ff: int  # 0: d_ff // top_k, so active FFN params equal the dense FFN's
    moe_dispatch: MoEDispatch
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
        return self.n_unique * self.n_loops


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
    loop_choices: tuple  # non-empty: sample the loop count per step from these
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
    peak_flops: float  # device peak for MFU (0: measure a matmul peak on this machine)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    source: DataSource
    paths: str  # text files or globs, comma-separated; empty: the KJV text
    tokenizer: Tokenizer
    spm_vocab_size: int
    val_fraction: float
    cache_dir: str  # where packed ArrayRecord caches live; empty: ~/.cache/loopscale
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
                   "loop_choices", "log_every", "eval_every", "eval_batches", "checkpoint_every",
                   "keep_checkpoints", "keep_steps", "branch_from", "branch_step",
                   "loop_grad_every", "log_act_grads", "peak_flops")


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Converts one ConfigDict value to the dataclass field's type, or says what is wrong."""
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        if isinstance(value, typ):
            return value
        allowed = ", ".join(m.value for m in typ)
        try:
            return typ(value)
        except ValueError:
            raise UsageError(f"{where}={value!r} is not one of: {allowed}") from None
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"{where}={value!r} must be true or false")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise UsageError(f"{where}={value!r} must be an integer")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{where}={value!r} must be a number")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise UsageError(f"{where}={value!r} must be a string")
        return value
    if typ is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(value)
        raise UsageError(f"{where}={value!r} must be a tuple")
    raise TypeError(f"no coercion for {typ}")  # a bug in this module, not user input


def _build(cls: type, section: Any, where: str) -> Any:
    if not isinstance(section, (ml_collections.ConfigDict, dict)):
        raise UsageError(f"config section {where} is missing or not a dict")
    data = dict(section)
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    prefix = f"{where}." if where else ""
    unknown = sorted(set(data) - fields)
    if unknown:
        raise UsageError(f"unknown config field {prefix}{unknown[0]}")
    missing = sorted(fields - set(data))
    if missing:
        raise UsageError(f"config field {prefix}{missing[0]} is missing")
    kwargs = {}
    for name in fields:
        typ = hints[name]
        sub = prefix + name
        if dataclasses.is_dataclass(typ):
            kwargs[name] = _build(typ, data[name], sub)
        else:
            kwargs[name] = _coerce(data[name], typ, sub)
    return cls(**kwargs)


def _check_model(m: ModelConfig) -> None:
    positive = ["vocab_size", "d_model", "n_heads", "n_unique", "n_loops", "base_d_model"]
    for name in positive:
        if getattr(m, name) < 1:
            raise UsageError(f"model.{name}={getattr(m, name)} must be at least 1")
    if m.head_dim == 0 and m.d_model % m.n_heads:
        raise UsageError(f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}")
    if m.d_head % 2:
        raise UsageError(f"head size {m.d_head} must be even for rotary positions")
    if m.ffn is FFNKind.MOE and not 1 <= m.top_k <= m.n_experts:
        raise UsageError(f"model.top_k={m.top_k} must be between 1 and model.n_experts={m.n_experts}")
    if m.capacity_factor <= 0:
        raise UsageError(f"model.capacity_factor={m.capacity_factor} must be positive")
    if m.logit_softcap < 0:
        raise UsageError(f"model.logit_softcap={m.logit_softcap} must be 0 (off) or positive")
    for f in dataclasses.fields(InitConfig):
        if getattr(m.init, f.name).std < 0:
            raise UsageError(f"model.init.{f.name}.std={getattr(m.init, f.name).std} must be 0 "
                             f"(model.init_std) or positive")


def parse_model(section: Any) -> ModelConfig:
    model = _build(ModelConfig, section, "model")
    _check_model(model)
    return model


def parse(cfg: ml_collections.ConfigDict) -> Config:
    """Validates a whole experiment ConfigDict into a `Config` (raises UsageError)."""
    config = _build(Config, cfg, "")
    _check_model(config.model)
    t = config.train
    for name in ["steps", "batch_size", "seq_len", "grad_accum"]:
        if getattr(t, name) < 1:
            raise UsageError(f"train.{name}={getattr(t, name)} must be at least 1")
    if t.batch_size % t.grad_accum:
        raise UsageError(f"train.batch_size={t.batch_size} is not divisible by train.grad_accum")
    if t.optimizer is Optimizer.MUON and t.weight_decay and t.weight_decay_mode is WeightDecay.INDEPENDENT:
        raise UsageError("train.weight_decay_mode=independent is not available with "
                         "train.optimizer=muon (optax's Muon couples decay to the LR)")
    if t.optimizer is Optimizer.MUON and config.model.param is not Param.SP:
        # muP's LR factors are Adam's rules (entrywise-normalised updates); Muon's orthogonalised
        # update sets its own width scaling, so muP's init and forward multipliers without them,
        # or with them, is an untested mixture. The FLT recipe is Muon with sp.
        raise UsageError(f"train.optimizer=muon needs model.param=sp (got "
                         f"{config.model.param.value}): muP's LR multipliers are Adam's rules")
    if any(not isinstance(k, int) or k < 1 for k in t.loop_choices):
        raise UsageError(f"train.loop_choices={t.loop_choices} must be positive integers")
    if any(not isinstance(k, int) or not 1 <= k <= t.steps for k in t.keep_steps):
        raise UsageError(f"train.keep_steps={t.keep_steps} must be steps between 1 and "
                         f"train.steps={t.steps}")
    if t.branch_from and not 1 <= t.branch_step < t.steps:
        raise UsageError(f"train.branch_step={t.branch_step} must be between 1 and "
                         f"train.steps={t.steps} - 1 for a branch (train.branch_from)")
    return config


