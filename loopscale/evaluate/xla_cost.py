"""What XLA says a training step costs: `cost_analysis` of the compiled jit(value_and_grad(loss)).

The step counted is the training loss the train step differentiates (train/step.py `loss_fn`:
the LM loss plus the logit z-loss and the MoE load-balancing and router z-losses at their
train-config weights) differentiated with respect to every parameter, on one batch of
train.batch_size x train.seq_len tokens; nothing of the optimiser update. Lowering and compiling need no memory for the arrays: parameters and batch
are abstract (`jax.ShapeDtypeStruct`), so paper-sized models can be costed on a laptop.

XLA's HloCostAnalysis counts the body of a `while` loop once, whatever its trip count, so a
scanned model would be under-counted by about the number of loops times the number of layers.
The count is therefore taken from the unrolled model (`scan=False`), which executes the same
arithmetic (same parameters, converted by `model.unstack_layers`).

How HloCostAnalysis counts (measured on CPU, jax 0.10): a dot is 2*M*N*K flops; every other
elementwise op, integer and predicate ops, converts and selects included, is one flop per output
element; a reduction is one per input element less one per output; exp, log, tanh, rsqrt,
logistic are `transcendentals`, reported apart from `flops`; a sort of n is n*log2(n); top_k
(a custom call) is -1.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from loopscale.config.schema import ModelConfig, TrainConfig
from loopscale.model.transformer import LoopedLM
from loopscale.train.step import loss_fn


def abstract_params(model: LoopedLM, batch: int, seq_len: int):
    """Shapes and dtypes of `model`'s parameters (unboxed), without allocating them."""
    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    variables = jax.eval_shape(model.init, jax.random.key(0), tokens)
    return nn.unbox(variables["params"])


def lower_train_step(model_cfg: ModelConfig, train: TrainConfig):
    """The lowered (not yet compiled) value-and-grad of the training loss on abstract inputs."""
    model = LoopedLM(model_cfg)
    B, T = train.batch_size, train.seq_len
    params = abstract_params(model, B, T)
    ints = jax.ShapeDtypeStruct((B, T), jnp.int32)
    mask = jax.ShapeDtypeStruct((B, T), jnp.bool_)

    def loss(p, tokens, targets, m):
        return loss_fn(p, {"inputs": tokens, "targets": targets, "mask": m}, model, train,
                       model_cfg.n_loops)[0]

    return jax.jit(jax.value_and_grad(loss)).lower(params, ints, ints, mask)


def train_step_cost(model_cfg: ModelConfig, train: TrainConfig) -> dict:
    """`cost_analysis()` of the compiled, unrolled training step: flops, transcendentals, bytes."""
    compiled = lower_train_step(dataclasses.replace(model_cfg, scan=False), train).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    return dict(cost or {})


def xla_flops_per_token_train(model_cfg: ModelConfig, train: TrainConfig) -> dict:
    """XLA's flops (and transcendentals, reported apart) of one training step, per token."""
    cost = train_step_cost(model_cfg, train)
    tokens = train.batch_size * train.seq_len
    return {
        "xla_flops_per_token_train": float(cost.get("flops", 0.0)) / tokens,
        "xla_transcendentals_per_token_train": float(cost.get("transcendentals", 0.0)) / tokens,
    }
