"""A direct, unoptimised transcription of PAPERS.md's equations, written independently of
loopscale.model, to test the model against. It reads the unrolled parameter layout
(loop/stack/layer_<l>/..., prelude/layer_<l>, coda/layer_<l>) and supports gain-free norms,
dense FFNs, every injection mode, a prelude and a coda."""

import jax
import jax.numpy as jnp
import numpy as np


def rms(x, eps=1e-6):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x_BxTxHxK, base):
    """Rotary positions as a complex rotation of (first half, second half) pairs."""
    T, K = x_BxTxHxK.shape[1], x_BxTxHxK.shape[-1]
    half = K // 2
    freqs = base ** (-np.arange(half) * 2.0 / K)
    theta = np.arange(T)[:, None] * freqs[None, :]
    rot = jnp.asarray(np.exp(1j * theta))[None, :, None, :]
    z = (x_BxTxHxK[..., :half] + 1j * x_BxTxHxK[..., half:]) * rot
    return jnp.concatenate([z.real, z.imag], axis=-1)


def attention(p, xq, xkv, cfg):
    q = jnp.einsum("btd,dhk->bthk", xq, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", xkv, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", xkv, p["wv"])
    if cfg.qk_norm:
        q, k = rms(q), rms(k)
    q, k = rope(q, cfg.rope_base), rope(k, cfg.rope_base)
    T = xq.shape[1]
    scale = cfg.attn_mult / (np.sqrt(cfg.d_head) if cfg.param.value == "sp" else cfg.d_head)
    scores = jnp.einsum("bthk,bshk->bhts", q, k) * scale
    scores = jnp.where(np.tril(np.ones((T, T), bool)), scores, -1e30)
    out = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bthk,hkd->btd", out, p["wo"])


def mlp(p, x, cfg):
    up = x @ p["w_up"]
    kind = cfg.mlp.value
    if kind == "swiglu":
        h = jax.nn.silu(x @ p["w_gate"]) * up
    elif kind == "gelu":
        h = jax.nn.gelu(up)
    else:
        h = jax.nn.relu(up) ** 2
    return h @ p["w_down"]


def plain_layer(p, x, cfg):
    u = x + attention(p["attn"], rms(x), rms(x), cfg)
    return u + mlp(p["mlp"], rms(u), cfg)


def injected_layer(p, x, h, cfg):
    """Attention injection: queries from norm(h), keys/values from norm(x); h is not added."""
    u = x + attention(p["attn"], rms(h), rms(x), cfg)
    return u + mlp(p["mlp"], rms(u), cfg)


def forward(params, tokens, cfg, n_loops=None, after_layer=None):
    """`after_layer(t, l, x)`, if given, replaces the stream at the end of layer l of loop t
    (0-based), as the model's residual-stream hook does."""
    K = n_loops or cfg.n_loops
    mode = cfg.injection.value
    edit = after_layer or (lambda t, l, x: x)
    layers = [params["loop"]["stack"][f"layer_{l}"] for l in range(cfg.n_unique)]
    e = params["embedding"][tokens]
    for l in range(cfg.n_prelude):  # the prelude once; its output is the injected signal e
        e = plain_layer(params["prelude"][f"layer_{l}"], e, cfg)
    x0 = rms(e) if cfg.embed_norm else e

    def film(t, x):  # loop_modulation=film: x * (1 + scale_t) + shift_t on the loop's start
        if cfg.loop_modulation.value != "film":
            return x
        row = min(t, cfg.n_loops - 1)
        return x * (1 + params["loop"]["film_scale"][row]) + params["loop"]["film_shift"][row]

    def parcae(x_prev):  # exp(-dt exp(log_a)) x_prev + dt (e0 B^T), dt = exp(log_dt)
        loop = params["loop"]
        dt = jnp.exp(loop["parcae_log_dt"])
        return (jnp.exp(-dt * jnp.exp(loop["parcae_log_a"])) * x_prev
                + dt * (x0 @ loop["parcae_b"].T))

    def concat(x_prev):  # Huginn's adapter: [x_prev; e0] W
        return jnp.concatenate([x_prev, x0], axis=-1) @ params["loop"]["adapter"]

    starts = {"parcae": parcae, "concat": concat}  # their own start on loop 1, from 0
    x = film(0, starts[mode](jnp.zeros_like(x0)) if mode in starts else x0)
    for l, layer in enumerate(layers):  # loop 1: the plain stack on x_0^(1)
        x = edit(0, l, plain_layer(layer, x, cfg))
    for t in range(1, K):
        h = rms(x)
        if mode == "none":
            x = h
        elif mode == "input":
            x = rms(e + h)
        elif mode in ("attn_first", "fla", "flt"):
            x = x0
        elif mode in starts:
            x = starts[mode](x)
        elif mode != "repeat":
            raise ValueError(mode)
        x = film(t, x)
        for l, layer in enumerate(layers):
            if mode == "fla":
                x = plain_layer(layer, rms(x + h), cfg)
            elif mode == "flt" or (mode == "attn_first" and l == 0):
                x = injected_layer(layer, x, h, cfg)
            else:
                x = plain_layer(layer, x, cfg)
            x = edit(t, l, x)
    for l in range(cfg.n_coda):  # the coda once, after the last loop
        x = plain_layer(params["coda"][f"layer_{l}"], x, cfg)
    logits = rms(x) @ params["unembed"] * cfg.output_mult
    if cfg.param.value == "mup":
        logits = logits / cfg.width_mult
    if cfg.logit_softcap:
        logits = cfg.logit_softcap * jnp.tanh(logits / cfg.logit_softcap)
    return logits
