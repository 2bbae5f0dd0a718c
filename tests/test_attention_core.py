"""model.attention: the splash kernel (Pallas interpret mode on this CPU) and the fused-attention
call of the cudnn path compute what the einsums compute, forward and backward, on one device
and split over a mesh; `auto` takes each platform's kernel; a model trained with splash has
the einsums' loss; splash compiled for a TPU (libtpu on this CPU) keeps no T x T scores and
its cost estimate says the kernel is not priced. The cuDNN kernel itself needs a GPU: the test
marked `gpu` runs in benchmarks/gpu_check.sh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, tiny_model_config, tokens

from loopscale.aot import compile as aot
from loopscale.aot import hlo as hlo_lib
from loopscale.aot import topology
from loopscale.config import AttentionImpl, load_config, parse
from loopscale.config.schema import MeshConfig
from loopscale.errors import UsageError
from loopscale.model import LoopedLM
from loopscale.model import attention_core as core
from loopscale.parallel import mesh as mesh_lib

topology.quiet_libtpu()

B, T, H, K = 4, 128, 2, 16  # T: splash's blocks are multiples of 128 positions
SCALE = 1.0 / K  # muP's attention scale


@pytest.fixture(scope="module")
def qkv():
    keys = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.random.normal(k, (B, T, H, K), jnp.float32) for k in keys)


def _value_and_grads(attend, qkv):
    """The output, and the gradients of a loss that weights every output entry differently
    (so every position, head and feature of q, k and v is checked)."""
    w = jax.random.normal(jax.random.key(1), (B, T, H, K))

    def loss(q, k, v):
        out = attend(q, k, v, SCALE)
        return jnp.sum(w * out), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*qkv)
    return out, grads


@pytest.fixture(scope="module")
def einsums(qkv):
    return _value_and_grads(core.xla_attention, qkv)


def _assert_close(got, want, tol):
    (out, grads), (out_ref, grads_ref) = got, want
    np.testing.assert_allclose(out, out_ref, atol=tol, rtol=tol)
    for g, g_ref, name in zip(grads, grads_ref, "qkv"):
        np.testing.assert_allclose(g, g_ref, atol=tol, rtol=tol, err_msg=f"d{name}")


def test_splash_is_the_einsums_forward_and_backward(qkv, einsums):
    _assert_close(_value_and_grads(core.splash_attention, qkv), einsums, 1e-5)


def test_splash_split_over_batch_and_heads_is_the_einsums(qkv, einsums):
    """Under a data=2 x tensor=2 mesh the kernel runs in a shard_map on each device's 2 rows
    and 1 head, and the result is the same."""
    mesh = mesh_lib.make_mesh(MeshConfig(data=2, fsdp=1, tensor=2, expert=1), jax.devices()[:4])
    with mesh_lib.activate(mesh):
        jaxpr = str(jax.make_jaxpr(lambda q, k, v: core.splash_attention(q, k, v, SCALE))(*qkv))
        got = _value_and_grads(core.splash_attention, qkv)
    assert "shard_map" in jaxpr and f"f32[{B // 2},{H // 2},{T},{K}]" in jaxpr
    _assert_close(got, einsums, 1e-5)


def test_the_fused_attention_call_is_the_einsums(qkv, einsums):
    """The cudnn path's call (layout, scale, causal mask), run by XLA on this CPU."""
    def fused(q, k, v, scale):
        return core.fused_attention(q, k, v, scale, "xla")
    _assert_close(_value_and_grads(fused, qkv), einsums, 1e-5)


@pytest.mark.parametrize("impl, platform, dtype, seq_len, resolved", [
    ("auto", "tpu", jnp.bfloat16, 1024, "splash"),
    ("auto", "tpu", jnp.float32, 128, "splash"),
    ("auto", "tpu", jnp.bfloat16, 64, "xla"),  # not a multiple of splash's 128-wide blocks
    ("auto", "gpu", jnp.bfloat16, 1024, "cudnn"),
    ("auto", "gpu", jnp.float32, 1024, "xla"),  # cuDNN's fused attention takes 16-bit inputs
    ("auto", "cpu", jnp.bfloat16, 1024, "xla"),
    ("xla", "tpu", jnp.bfloat16, 1024, "xla"),
    ("splash", "cpu", jnp.float32, 128, "splash"),  # an explicit choice is kept (interpreted)
])
def test_auto_takes_each_platforms_kernel(impl, platform, dtype, seq_len, resolved):
    got = core.resolve(AttentionImpl(impl), platform, dtype, seq_len)
    assert got is AttentionImpl(resolved)


def test_auto_on_this_cpu_traces_the_einsums():
    assert core.current_platform() == "cpu"
    cfg = tiny_model_config()
    assert cfg.attention is AttentionImpl.AUTO
    x = tokens()
    params = init_params(cfg, x)
    jaxpr = str(jax.make_jaxpr(lambda p: LoopedLM(cfg).apply({"params": p}, x))(params))
    assert "pallas_call" not in jaxpr and "dot_general" in jaxpr


@pytest.mark.parametrize("overrides, message", [
    (["--config.model.attention=cudnn"], "model.attention=cudnn needs model.dtype=bfloat16"),
    (["--config.model.attention=splash", "--config.train.seq_len=96"],
     "model.attention=splash needs train.seq_len a multiple of 128"),
    (["--config.model.attention=flash"], "model.attention='flash' is not one of"),
])
def test_kernels_that_cannot_take_the_config_are_refused_in_one_line(overrides, message):
    with pytest.raises(UsageError, match=message) as e:
        parse(load_config("experiments/base.py:tiny", overrides))
    assert "\n" not in str(e.value)


def test_a_model_with_splash_computes_the_einsums_logits_and_gradients():
    """The whole model (two layers looped twice, qk-norm, rotary) with the kernel in place of
    the einsums: logits and parameter gradients agree."""
    cfg = tiny_model_config(n_loops=2, qk_norm=True, attention="xla")
    x = tokens(batch=2, length=T)
    params = init_params(cfg, x)

    def loss(p, c):
        logits = LoopedLM(c).apply({"params": p}, x).logits
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

    results = {}
    for impl in (AttentionImpl.XLA, AttentionImpl.SPLASH):
        c = dataclasses.replace(cfg, attention=impl)
        results[impl] = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)(params, c)
    (_, want), grads_want = results[AttentionImpl.XLA]
    (_, got), grads_got = results[AttentionImpl.SPLASH]
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for a, b in zip(jax.tree.leaves(grads_got), jax.tree.leaves(grads_want)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-4)


def test_splash_compiled_for_a_tpu_keeps_no_scores_and_says_it_is_not_priced():
    """Base (4 layers) at T 1024 on one v5p chip: the einsums' train step keeps each layer's
    f32 (B, H, T, T) scores for the backward pass; the kernel's keeps none, which saves at
    least those bytes. XLA's cost model gives the kernel no time, and the report says so."""
    devices = topology.devices(topology.parse("v5p:1x1x1"))
    temps, hlo = {}, {}
    for impl in ("xla", "splash"):
        config = parse(load_config("experiments/base.py:tiny", [
            f"--config.model.attention={impl}", "--config.train.seq_len=1024",
            "--config.train.batch_size=4", "--config.model.n_heads=2"]))
        lowered, _ = aot.lower(config, devices)
        compiled = lowered.compile()
        temps[impl], hlo[impl] = aot.memory(compiled)["temporaries"], compiled.as_text()
    assert "f32[4,2,1024,1024]" in hlo["xla"] and "f32[4,2,1024,1024]" not in hlo["splash"]
    assert hlo_lib.unpriced_kernels(hlo["xla"]) == {}
    kernel = "Pallas TPU kernel (splash attention, megablox)"
    assert hlo_lib.unpriced_kernels(hlo["splash"]) == {kernel: 3}
    scores = config.model.n_unique * 4 * 2 * 1024 * 1024 * 4
    assert temps["xla"] - temps["splash"] >= scores, temps
    cost = aot.step_cost(config, devices)
    assert "does not price Pallas TPU kernel (splash attention, megablox)" in cost["cost_warning"]


@pytest.mark.gpu
def test_cudnn_is_the_einsums_on_a_gpu(qkv, einsums):
    """cuDNN's kernel on bfloat16 inputs against the float32 einsums (bfloat16's precision)."""
    assert jax.default_backend() == "gpu"
    bf16 = tuple(x.astype(jnp.bfloat16) for x in qkv)

    def cudnn(q, k, v, scale):
        return core.fused_attention(q, k, v, scale, "cudnn").astype(jnp.float32)
    out, grads = _value_and_grads(cudnn, bf16)
    _assert_close((out, tuple(g.astype(jnp.float32) for g in grads)), einsums, 3e-2)
