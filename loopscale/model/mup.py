"""Width parametrisations (muP and friends) as a pure function of a weight's role and width.

Every weight of the model is created through `layers.weight`, which asks `init_of(name, cfg)`
for its distribution and std (its init role's entry, scaled by `scaling(role, cfg)`); the
forward multipliers are applied where the weight is used; and
`lr_multipliers(params, cfg)` gives the optimiser a pytree of per-parameter LR factors. All
three read the same table below, so init, forward pass and optimiser cannot disagree.

width_mult = w = d_model / base_d_model; s is a weight's std at the base width: its init role's
entry in `model.init` (INIT_ROLE_OF_NAME; the distribution comes from there too), `init_std`
where that entry's std is 0 (the default: every weight at one std); a = attn_mult; the readout's
forward multiplier is also scaled by output_mult in every preset. At w = 1 the presets differ
only in the attention scale.

| role      | sp             | mup (microsoft/mup, Adam)        | mup_sparse (sparse-layers study) |
|-----------|----------------|----------------------------------|----------------------------------|
| embedding | std s, lr 1    | std s, lr 1                      | std s, lr 1                      |
| hidden    | std s, lr 1    | std s/sqrt(w), lr 1/w            | std s/sqrt(w), lr 1/w            |
| readout   | std s, lr 1    | std s, lr 1, forward x 1/w       | std s/sqrt(w), lr 1/w            |
| router    | std s, lr 1    | std s, lr 1, forward x 1/w       | std s/sqrt(w), lr 1/w            |
| norm gain | 1, lr 1        | 1, lr 1                          | 1, lr 1                          |
| attention | a/sqrt(d_head) | a/d_head                         | a/d_head                         |

Under `mup`, w of a hidden weight is its fan-in's width multiplier, as microsoft/mup's
InfShape.width_mult (its last infinite dimension, the fan-in): d_model/base_d_model for wq, wk,
wv, w_up, w_gate and wo (heads*d_head = d_model), but for w_down the FFN width (the expert
width in an MoE) at this d_model over the same at base_d_model (`fan_in_mult`). The SwiGLU rule
64*ceil(8d/3/64) is not proportional to d (d 128 -> 384, 512 -> 1408: x3.67, not x4), so
"variance proportional to 1/fan_in" is s^2/fan_in_mult there. The readout and router are "vector-like" in mup's
sense (only their fan-in grows): mup's MuReadout keeps their init and Adam LR width-independent
and divides their output by w. The sparse-layers study instead divides init variance and LR by
w for every weight except the embedding and uses no multipliers; its d/128 is d_model's, for
w_down too, as the study states it.
"""

from __future__ import annotations

import dataclasses
import enum
import math

import jax

from loopscale.config.schema import FFNKind, InitSpec, ModelConfig, Param


class Role(enum.Enum):
    EMBEDDING = "embedding"
    HIDDEN = "hidden"
    READOUT = "readout"
    ROUTER = "router"
    NORM = "norm"


@dataclasses.dataclass(frozen=True)
class Scaling:
    init_std: float
    forward_mult: float
    lr_mult: float


class InitRole(enum.Enum):
    """Finer than Role, for init only: each value names a field of `model.init` (InitConfig)."""

    EMBEDDING = "embedding"
    ATTN_QKV = "attn_qkv"
    ATTN_OUT = "attn_out"
    FFN_IN = "ffn_in"
    FFN_OUT = "ffn_out"
    ROUTER = "router"
    HEAD = "head"


def scaling(role: Role, cfg: ModelConfig, base_std: float | None = None,
            fan_in: float | None = None) -> Scaling:
    """`base_std`: the weight's std at the base width (default `cfg.init_std`); `fan_in`: a
    hidden weight's fan-in width multiplier under `mup` (default d_model's, `cfg.width_mult`;
    `fan_in_mult` gives it by name)."""
    s, w = cfg.init_std if base_std is None else base_std, cfg.width_mult
    if role is Role.NORM:
        return Scaling(init_std=0.0, forward_mult=1.0, lr_mult=1.0)
    if role is Role.EMBEDDING:
        return Scaling(init_std=s, forward_mult=cfg.emb_mult, lr_mult=1.0)
    base_forward = cfg.output_mult if role is Role.READOUT else 1.0
    if cfg.param is Param.SP:
        return Scaling(init_std=s, forward_mult=base_forward, lr_mult=1.0)
    if cfg.param is Param.MUP_SPARSE:
        return Scaling(init_std=s / math.sqrt(w), forward_mult=base_forward, lr_mult=1.0 / w)
    # Param.MUP
    if role is Role.HIDDEN:
        w = w if fan_in is None else fan_in
        return Scaling(init_std=s / math.sqrt(w), forward_mult=1.0, lr_mult=1.0 / w)
    return Scaling(init_std=s, forward_mult=base_forward / w, lr_mult=1.0)


def attention_scale(cfg: ModelConfig) -> float:
    """Multiplier of q.k: attn_mult/sqrt(d_head) under sp, attn_mult/d_head under both muP
    presets (muP's 1/d keeps attention logits Theta(1) once q and k align during training)."""
    if cfg.param is Param.SP:
        return cfg.attn_mult / math.sqrt(cfg.d_head)
    return cfg.attn_mult / cfg.d_head


# Parameter leaf names -> role. Every weight the model creates is named here (a test checks it).
ROLE_OF_NAME = {
    "embedding": Role.EMBEDDING,
    "unembed": Role.READOUT,
    "router": Role.ROUTER,
    "scale": Role.NORM,
    # FiLM's per-loop scale and shift (loop_modulation=film): vectors per loop, like a gain.
    "film_scale": Role.NORM,
    "film_shift": Role.NORM,
    # Parcae's injection: per-channel decay and step (vectors), and its input matrix B.
    "parcae_log_a": Role.NORM,
    "parcae_log_dt": Role.NORM,
    "parcae_b": Role.HIDDEN,
    # Huginn's concatenation adapter (injection=concat): a hidden input projection.
    "adapter": Role.HIDDEN,
    "wq": Role.HIDDEN,
    "wk": Role.HIDDEN,
    "wv": Role.HIDDEN,
    "wo": Role.HIDDEN,
    "w_gate": Role.HIDDEN,
    "w_up": Role.HIDDEN,
    "w_down": Role.HIDDEN,
}


# Weights whose start is fixed by what they mean, not drawn from `model.init`: norm gains (1),
# FiLM's scale and shift (0: the identity), Parcae's injection (its authors' init, block.py).
FIXED_INIT = frozenset({"scale", "film_scale", "film_shift", "parcae_log_a", "parcae_log_dt",
                        "parcae_b"})

# Parameter leaf names -> init role (which entry of `model.init` draws it). Same names as
# above, but for FIXED_INIT.
INIT_ROLE_OF_NAME = {
    "embedding": InitRole.EMBEDDING,
    "unembed": InitRole.HEAD,
    "router": InitRole.ROUTER,
    "adapter": InitRole.ATTN_QKV,
    "wq": InitRole.ATTN_QKV,
    "wk": InitRole.ATTN_QKV,
    "wv": InitRole.ATTN_QKV,
    "wo": InitRole.ATTN_OUT,
    "w_gate": InitRole.FFN_IN,
    "w_up": InitRole.FFN_IN,
    "w_down": InitRole.FFN_OUT,
}


def ffn_fan_in_mult(cfg: ModelConfig) -> float:
    """w_down's fan-in, the FFN width (an expert's in an MoE), at this width over the same at
    base_d_model. An explicit width (d_ff, expert_d_ff) is taken to scale with d_model, as
    coordcheck's width_config scales it, so only the rules (SwiGLU's rounding, d_ff // top_k)
    can make this differ from d_model/base_d_model."""
    if cfg.d_ff or (cfg.ffn is FFNKind.MOE and cfg.expert_d_ff):
        return cfg.width_mult
    base = dataclasses.replace(cfg, d_model=cfg.base_d_model)
    if cfg.ffn is FFNKind.MOE:
        return cfg.expert_width / base.expert_width
    return cfg.ffn_width / base.ffn_width


def fan_in_mult(name: str, cfg: ModelConfig) -> float:
    """The width multiplier of the fan-in of the weight called `name` (see the table's notes)."""
    return ffn_fan_in_mult(cfg) if name == "w_down" else cfg.width_mult


def scaling_of(name: str, cfg: ModelConfig, base_std: float | None = None) -> Scaling:
    """`scaling` of the weight called `name`: its role, at its own fan-in multiplier."""
    return scaling(ROLE_OF_NAME[name], cfg, base_std, fan_in_mult(name, cfg))


def init_of(name: str, cfg: ModelConfig) -> InitSpec:
    """The distribution and std, at this width, of the weight called `name`: its init role's
    entry, its std (or init_std) scaled by the parametrisation for its muP role."""
    spec = getattr(cfg.init, INIT_ROLE_OF_NAME[name].value)
    std = scaling_of(name, cfg, spec.std or cfg.init_std).init_std
    return InitSpec(dist=spec.dist, std=std)


def _leaf_name(path) -> str:
    """The parameter's own name: the last dict key (a boxed leaf adds `.value` after it)."""
    keys = [k for k in path if isinstance(k, jax.tree_util.DictKey)]
    return str(keys[-1].key)


def param_roles(params):
    """Pytree of Role with the structure of `params` (plain or boxed arrays)."""
    return jax.tree_util.tree_map_with_path(lambda p, _: ROLE_OF_NAME[_leaf_name(p)], params)


def lr_multipliers(params, cfg: ModelConfig):
    """Pytree of per-parameter learning-rate factors, for optax (train/optimizer.py)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, _: scaling_of(_leaf_name(p), cfg).lr_mult, params
    )
