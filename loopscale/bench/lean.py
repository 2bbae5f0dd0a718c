"""A lean plain-JAX train step: the yardstick the Base train step is measured against.

Written from scratch here, with none of the project's code: token embedding, `L` pre-norm layers
(parameter-free RMSNorm, causal multi-head attention with rotary positions and a float32
softmax, a SwiGLU / GELU / relu^2 MLP), final norm, untied unembedding, mean cross-entropy, and
optax AdamW. Nothing else: no muP multipliers, no metrics, no logical sharding, no scans (a
Python loop over layers), no loss chunking. Same shapes and the same matmuls as the project's
dense model of the same `ModelConfig`, so the ratio of the two steps is what the project adds.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from loopscale.config.schema import MLPKind, ModelConfig, TrainConfig


def init_params(cfg: ModelConfig, n_layers: int, seed: int = 0) -> dict:
    D, H, K, F, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.ffn_width, cfg.vocab_size
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 4 + 7 * n_layers))

    def normal(shape):
        return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

    layers = []
    for _ in range(n_layers):
        layer = {"wq": normal((D, H, K)), "wk": normal((D, H, K)), "wv": normal((D, H, K)),
                 "wo": normal((H, K, D)), "w_up": normal((D, F)), "w_down": normal((F, D))}
        if cfg.mlp is MLPKind.SWIGLU:
            layer["w_gate"] = normal((D, F))
        layers.append(layer)
    return {"embedding": normal((V, D)), "unembed": normal((D, V)), "layers": layers}


def _norm(x, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _rope(x_BxTxHxK, cos_TxK2, sin_TxK2):
    x1, x2 = jnp.split(x_BxTxHxK, 2, axis=-1)
    cos, sin = cos_TxK2[None, :, None, :], sin_TxK2[None, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _mlp(kind: MLPKind, p, x_BxTxD):
    up = x_BxTxD @ p["w_up"]
    if kind is MLPKind.SWIGLU:
        h = jax.nn.silu(x_BxTxD @ p["w_gate"]) * up
    elif kind is MLPKind.GELU:
        h = jax.nn.gelu(up)
    else:
        h = jnp.square(jax.nn.relu(up))
    return h @ p["w_down"]


def loss_fn(params, inputs_BxT, targets_BxT, cfg: ModelConfig):
    T = inputs_BxT.shape[1]
    eps = cfg.norm_eps
    freq = 1.0 / (cfg.rope_base ** (jnp.arange(0, cfg.d_head, 2, dtype=jnp.float32) / cfg.d_head))
    angles = jnp.arange(T, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    causal = jnp.tril(jnp.ones((T, T), bool))
    x = params["embedding"][inputs_BxT]
    for p in params["layers"]:
        xn = _norm(x, eps)
        q = _rope(jnp.einsum("btd,dhk->bthk", xn, p["wq"]), cos, sin)
        k = _rope(jnp.einsum("btd,dhk->bthk", xn, p["wk"]), cos, sin)
        v = jnp.einsum("btd,dhk->bthk", xn, p["wv"])
        logits = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(cfg.d_head)
        probs = jax.nn.softmax(jnp.where(causal, logits, jnp.finfo(jnp.float32).min), axis=-1)
        x = x + jnp.einsum("bthk,hkd->btd", jnp.einsum("bhts,bshk->bthk", probs, v), p["wo"])
        x = x + _mlp(cfg.mlp, p, _norm(x, eps))
    logits = _norm(x, eps) @ params["unembed"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets_BxT))


def make_step(cfg: ModelConfig, train: TrainConfig):
    """(jitted step (params, opt_state, inputs, targets) -> (params, opt_state, loss), the
    optimiser). The step donates params and optimiser state, as the project's does."""
    tx = optax.adamw(train.lr, b1=train.b1, b2=train.b2, eps=train.eps,
                     weight_decay=train.weight_decay)

    def step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets, cfg)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1)), tx


class LeanStep:
    """The lean step of `config`'s dense model (n_unique x n_loops layers, unshared) with its
    state and one batch; calling it runs one step and waits, like steps.TrainStep."""

    def __init__(self, config, batch: dict):
        cfg, train = config.model, config.train
        fn, tx = make_step(cfg, train)
        self.params = init_params(cfg, cfg.n_unique * cfg.n_loops, config.seed)
        self.opt_state = tx.init(self.params)
        self.inputs, self.targets = jnp.asarray(batch["inputs"]), jnp.asarray(batch["targets"])
        start = time.perf_counter()
        self.compiled = fn.lower(self.params, self.opt_state, self.inputs, self.targets).compile()
        self.compile_s = time.perf_counter() - start

    def __call__(self) -> None:
        self.params, self.opt_state, loss = self.compiled(self.params, self.opt_state,
                                                          self.inputs, self.targets)
        jax.block_until_ready((self.params, self.opt_state, loss))
