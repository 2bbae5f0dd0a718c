"""The one conversion at the edge: an experiment's ConfigDict validated into a `Config`
(`parse`), or a model section alone into a `ModelConfig` (`parse_model`). Each field is
coerced to its dataclass type (an enum from its value, an int from an integral float), then
the constraints no type states are checked; anything wrong raises UsageError with one line
that names the field.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any

import ml_collections

from loopscale.config.enums import (AttentionImpl, DType, FFNKind, GroupedMatmul, LoopDist,
                                     MoEDispatch, Optimizer, Param, WeightDecay)
from loopscale.config.schema import SPLASH_LANES, Config, InitConfig, ModelConfig, TrainConfig
from loopscale.errors import UsageError


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
    positive = ["vocab_size", "vocab_multiple", "d_model", "n_heads", "n_unique", "n_loops",
                "base_d_model"]
    for name in positive:
        if getattr(m, name) < 1:
            raise UsageError(f"model.{name}={getattr(m, name)} must be at least 1")
    for name in ("n_prelude", "n_coda"):
        if getattr(m, name) < 0:
            raise UsageError(f"model.{name}={getattr(m, name)} must be 0 or more")
    if m.head_dim == 0 and m.d_model % m.n_heads:
        raise UsageError(f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}")
    if m.d_head % 2:
        raise UsageError(f"head size {m.d_head} must be even for rotary positions")
    if m.attention is AttentionImpl.CUDNN and m.dtype is not DType.BFLOAT16:
        raise UsageError(f"model.attention=cudnn needs model.dtype=bfloat16 (got "
                         f"{m.dtype.value}): cuDNN's fused attention takes 16-bit inputs")
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


def _check_loop_schedule(t: TrainConfig) -> None:
    if any(not isinstance(k, int) or k < 1 for k in t.loop_choices):
        raise UsageError(f"train.loop_choices={t.loop_choices} must be positive integers")
    if (t.loop_dist is LoopDist.UNIFORM) != bool(t.loop_choices):
        raise UsageError("train.loop_choices (the counts to draw from) goes with "
                         f"train.loop_dist=uniform, and only with it (got loop_dist="
                         f"{t.loop_dist.value}, loop_choices={t.loop_choices})")
    if t.loop_dist is LoopDist.POISSON_LOGNORMAL and not (t.loop_mean > 0 and t.loop_sigma >= 0):
        raise UsageError(f"train.loop_mean={t.loop_mean} must be positive and train.loop_sigma="
                         f"{t.loop_sigma} at least 0")
    for name in ("loop_max", "bptt_loops"):
        if getattr(t, name) < 0:
            raise UsageError(f"train.{name}={getattr(t, name)} must be 0 (off) or positive")
    if t.bptt_loops and t.loop_grad_every:
        # Per-loop gradient norms split the gradient over every loop; truncated, most are 0.
        raise UsageError("train.loop_grad_every (per-loop gradient norms) is not measured with "
                         "train.bptt_loops (truncated backpropagation)")


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
    _check_loop_schedule(t)
    if config.model.attention is AttentionImpl.SPLASH and t.seq_len % SPLASH_LANES:
        raise UsageError(f"model.attention=splash needs train.seq_len a multiple of "
                         f"{SPLASH_LANES} (got {t.seq_len}): its blocks fill the TPU's lanes")
    if config.model.moe_matmul is GroupedMatmul.MEGABLOX:
        if config.model.moe_dispatch is not MoEDispatch.DROPLESS:
            raise UsageError("model.moe_matmul=megablox is dropless MoE's grouped matmul: it "
                             "needs model.moe_dispatch=dropless")
        if config.mesh.tensor != 1:
            raise UsageError(f"model.moe_matmul=megablox runs each expert's matmuls whole on a "
                             f"device: it needs mesh.tensor=1 (got {config.mesh.tensor})")
    if any(not isinstance(k, int) or not 1 <= k <= t.steps for k in t.keep_steps):
        raise UsageError(f"train.keep_steps={t.keep_steps} must be steps between 1 and "
                         f"train.steps={t.steps}")
    if t.branch_from and not 1 <= t.branch_step < t.steps:
        raise UsageError(f"train.branch_step={t.branch_step} must be between 1 and "
                         f"train.steps={t.steps} - 1 for a branch (train.branch_from)")
    return config
