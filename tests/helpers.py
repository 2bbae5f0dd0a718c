"""Small shared constructors for model tests."""

import dataclasses
import math

import flax.linen as nn
import jax

from loopscale.config import base_config, parse_model
from loopscale.model import LoopedLM


def tiny_model_config(**overrides):
    """A model small enough to compile in about a second."""
    c = base_config().model
    c.update(dict(vocab_size=32, d_model=32, n_heads=2, n_unique=2, n_loops=3, base_d_model=32))
    c.update(overrides)
    return parse_model(c)


def init_params(cfg, tokens, seed=0, jit=False):
    """The model's unboxed parameters; `jit` initialises compiled, as the trainer does (other
    draws than op by op, and far cheaper for a large model)."""
    init = LoopedLM(cfg).init
    variables = (jax.jit(init) if jit else init)(jax.random.PRNGKey(seed), tokens)
    return nn.unbox(variables["params"])


def tokens(batch=2, length=8, vocab=32, seed=1):
    return jax.random.randint(jax.random.PRNGKey(seed), (batch, length), 0, vocab)


def unrolled(cfg):
    return dataclasses.replace(cfg, scan=False)


def n_params(params):
    return sum(math.prod(p.shape) for p in jax.tree.leaves(params))
