"""Mixture of experts: routing losses, the two dispatch paths, and a per-token reference."""

import dataclasses
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import init_params, tiny_model_config, tokens, unrolled

from loopscale.config import GroupedMatmul, MeshConfig, MoEDispatch
from loopscale.model import LoopedLM, unstack_layers
from loopscale.model import moe
from loopscale.model.moe import MoE, capacity, resolve_matmul
from loopscale.parallel import mesh as mesh_lib

CFG = tiny_model_config(ffn="moe", n_experts=4, top_k=2, d_ff=64)
X = jax.random.normal(jax.random.PRNGKey(3), (2, 16, CFG.d_model))
MEGABLOX = dataclasses.replace(CFG, moe_matmul=GroupedMatmul.MEGABLOX)


@pytest.fixture(scope="module")
def moe_params():
    return nn.unbox(MoE(CFG).init(jax.random.PRNGKey(0), X)["params"])


def apply(params, cfg=CFG, x=X):
    return MoE(cfg).apply({"params": params}, x)


def test_uniform_router_gives_unit_load_balancing_loss(moe_params):
    params = {**moe_params, "router": jnp.zeros_like(moe_params["router"])}
    _, stats = apply(params)
    assert float(stats["lb_loss"]) == pytest.approx(1.0, abs=1e-6)
    # All logits are zero, so logsumexp = log E and the z-loss is (log E)^2.
    assert float(stats["router_z"]) == pytest.approx(np.log(CFG.n_experts) ** 2, rel=1e-6)


def test_skewed_router_raises_load_balancing_loss(moe_params):
    router = jnp.zeros_like(moe_params["router"]).at[:, 0].set(5.0).at[:, 1].set(4.0)
    _, stats = apply({**moe_params, "router": router}, x=jnp.abs(X))
    assert float(stats["lb_loss"]) > 1.5


def test_dropless_matches_per_token_reference(moe_params):
    y, stats = apply(moe_params)
    p = moe_params
    x = np.asarray(X).reshape(-1, CFG.d_model)
    want = np.zeros_like(x)
    for n in range(x.shape[0]):
        logits = x[n] @ np.asarray(p["router"])
        top = np.argsort(-logits)[: CFG.top_k]
        gates = np.exp(logits[top] - logits[top].max())
        gates /= gates.sum()
        for g, e in zip(gates, top):
            h = jax.nn.silu(x[n] @ p["w_gate"][e]) * (x[n] @ p["w_up"][e])
            want[n] += g * np.asarray(h @ p["w_down"][e])
    np.testing.assert_allclose(np.asarray(y).reshape(-1, CFG.d_model), want, atol=1e-5, rtol=1e-4)
    load = np.asarray(stats["expert_load"])
    assert load.sum() == pytest.approx(1.0) and float(stats["dropped_frac"]) == 0.0


def test_capacity_path_agrees_with_dropless_when_capacity_is_ample(moe_params):
    ample = dataclasses.replace(CFG, moe_dispatch=MoEDispatch.CAPACITY,
                                capacity_factor=CFG.n_experts / CFG.top_k)
    y_dropless, s_dropless = apply(moe_params)
    y_capacity, s_capacity = apply(moe_params, cfg=ample)
    np.testing.assert_allclose(y_capacity, y_dropless, atol=1e-5, rtol=1e-5)
    assert float(s_capacity["dropped_frac"]) == 0.0
    np.testing.assert_allclose(s_capacity["expert_load"], s_dropless["expert_load"])


def test_tight_capacity_drops_assignments_and_zeroes_fully_dropped_tokens(moe_params):
    tight = dataclasses.replace(CFG, moe_dispatch=MoEDispatch.CAPACITY, capacity_factor=0.25)
    y, stats = apply(moe_params, cfg=tight)
    dropped = float(stats["dropped_frac"])
    assert 0.5 <= dropped < 1.0  # capacity 0.25 keeps at most a quarter of the assignments
    y_full, _ = apply(moe_params)
    changed = np.any(np.abs(np.asarray(y) - np.asarray(y_full)) > 1e-6, axis=-1)
    assert changed.mean() > 0.3


def _expert(p, e, x_D):
    h = jax.nn.silu(x_D @ p["w_gate"][e]) * (x_D @ p["w_up"][e])
    return np.asarray(h @ p["w_down"][e])


def test_capacity_keeps_the_first_assignments_in_queue_order(moe_params):
    """Per sequence and expert: all first choices in token order, then all second choices; an
    expert keeps the first C, a dropped assignment adds nothing and the kept gates are not
    renormalised. Checked against a token-by-token transcription of that rule."""
    tight = dataclasses.replace(CFG, moe_dispatch=MoEDispatch.CAPACITY, capacity_factor=0.5)
    y, stats = apply(moe_params, cfg=tight)
    B, T, _ = X.shape
    k, cap, p = CFG.top_k, capacity(tight, T), moe_params
    want, kept = np.zeros(X.shape, np.float32), 0
    for b in range(B):
        x = np.asarray(X[b])
        logits = x @ np.asarray(p["router"])
        top = np.argsort(-logits, axis=-1)[:, :k]
        top_logits = np.take_along_axis(logits, top, axis=-1)
        gates = np.exp(top_logits - top_logits.max(-1, keepdims=True))
        gates /= gates.sum(-1, keepdims=True)
        used = np.zeros(CFG.n_experts, int)
        for j in range(k):
            for t in range(T):
                e = top[t, j]
                if used[e] < cap:
                    used[e] += 1
                    kept += 1
                    want[b, t] += gates[t, j] * _expert(p, e, x[t])
    assert 0 < kept < B * T * k  # the rule really dropped some and kept some
    np.testing.assert_allclose(np.asarray(y), want, atol=1e-5, rtol=1e-4)
    assert float(stats["dropped_frac"]) == pytest.approx(1 - kept / (B * T * k))


def test_capacity_and_dropless_gradients_agree_when_capacity_is_ample(moe_params):
    ample = dataclasses.replace(CFG, moe_dispatch=MoEDispatch.CAPACITY,
                                capacity_factor=CFG.n_experts / CFG.top_k)
    probe = jax.random.normal(jax.random.PRNGKey(5), X.shape)

    def grads(cfg):
        return jax.grad(lambda p, x: jnp.sum(apply(p, cfg=cfg, x=x)[0] * probe), argnums=(0, 1))(
            moe_params, X)

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
                 grads(ample), grads(CFG))


def test_megablox_matches_ragged_dot_outputs_and_gradients(moe_params):
    """The Pallas grouped-matmul kernel (interpret mode on this CPU) computes what ragged_dot
    does, forward and backward (its custom VJP: gmm for the inputs, tgmm for the weights),
    with 2 x 16 x 2 = 64 assignments in one row tile and, at 2 x 13 x 2 = 52, padded to one."""
    for x in (X, X[:, :13]):
        probe = jax.random.normal(jax.random.PRNGKey(5), x.shape)

        def run(cfg):
            loss = lambda p, x: jnp.sum(apply(p, cfg=cfg, x=x)[0] * probe)  # noqa: E731
            return apply(moe_params, cfg=cfg, x=x)[0], jax.grad(loss, argnums=(0, 1))(
                moe_params, x)

        want, got = run(CFG), run(MEGABLOX)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4),
                     got, want)


def test_megablox_tiles_fit_vmem_and_pad_least():
    """Whole widths where their tiles fit the VMEM budget (MoE `:paper`'s 704 x 960 in
    bfloat16, either way round); at d 1024 x 1376 in float32, where whole widths needed 17.1
    MiB of libtpu's 16, tiles of 512 along the width that 512 divides and no padding; row tiles
    keep expert boundaries within 15% of the tiles (8 experts on 8,192 rows: 128)."""
    assert moe.megablox_widths(128, 704, 960, 2) == (704, 960)
    assert moe.megablox_widths(128, 960, 704, 2) == (960, 704)
    for tgmm in (False, True):
        tk, tn = moe.megablox_widths(256, 1024, 1376, 4, tgmm)
        assert 1024 % tk == 0 and 1376 % tn == 0 and (tk, tn) != (1024, 1376)
    assert moe.megablox_rows_tile(8192, 8) == 128 and moe.megablox_rows_tile(52, 4) == 56


def test_auto_takes_ragged_dot_here_and_an_explicit_choice_stays():
    assert resolve_matmul(GroupedMatmul.AUTO) is GroupedMatmul.RAGGED_DOT  # this CPU
    assert resolve_matmul(GroupedMatmul.MEGABLOX) is GroupedMatmul.MEGABLOX


def test_looped_moe_scan_matches_python_loops_and_reports_routing_per_loop():
    cfg = tiny_model_config(ffn="moe", n_experts=4, top_k=2, injection="repeat")
    toks = tokens()
    params = init_params(cfg, toks)
    scanned = LoopedLM(cfg).apply({"params": params}, toks)
    flat = unstack_layers(params, cfg.n_unique)
    looped = LoopedLM(unrolled(cfg)).apply({"params": flat}, toks)
    np.testing.assert_allclose(scanned.logits, looped.logits, atol=1e-5, rtol=1e-5)
    K, L = cfg.n_loops, cfg.n_unique
    assert scanned.moe["experts"].shape == (K, L, *toks.shape, cfg.top_k)
    assert scanned.moe["expert_load"].shape == (K, L, cfg.n_experts)
    np.testing.assert_array_equal(scanned.moe["experts"], looped.moe["experts"])
    # The same physical layer routes differently on different passes (the study's mechanism).
    assert np.any(np.asarray(scanned.moe["experts"][0]) != np.asarray(scanned.moe["experts"][1]))
    assert float(scanned.lb_loss) > 0 and float(scanned.router_z) > 0


def _mesh(**sizes):
    return mesh_lib.make_mesh(MeshConfig(**{"data": 1, "fsdp": 1, "tensor": 1, "expert": 1,
                                            **sizes}))


def _output_and_grads(params, x, cfg=CFG):
    probe = jax.random.normal(jax.random.PRNGKey(5), x.shape)
    loss = lambda p, x: jnp.sum(apply(p, cfg=cfg, x=x)[0] * probe)  # noqa: E731
    return apply(params, cfg=cfg, x=x)[0], jax.grad(loss, argnums=(0, 1))(params, x)


@pytest.mark.parametrize("sizes,cfg", [(dict(data=4, fsdp=2), CFG),
                                       (dict(data=2, fsdp=2, expert=2), CFG),
                                       (dict(data=2, fsdp=2, tensor=2), CFG),
                                       (dict(data=4, fsdp=2), MEGABLOX)],
                         ids=["data-fsdp", "expert", "tensor", "megablox"])
def test_dropless_per_shard_matches_one_device(moe_params, sizes, cfg):
    """Under data parallelism each shard routes its own tokens (a shard_map over the batch
    axes); outputs and gradients equal the single-device computation, with the parameters
    sharded as the trainer shards them (FSDP, expert and tensor axes), megablox's kernel too."""
    x = jax.random.normal(jax.random.PRNGKey(4), (8, 8, CFG.d_model))
    want = jax.jit(_output_and_grads)(moe_params, x)
    mesh = _mesh(**sizes)
    boxed = MoE(CFG).init(jax.random.PRNGKey(0), X)["params"]
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh,
                                            mesh_lib.LOGICAL_RULES)
    with mesh_lib.activate(mesh):
        got = jax.jit(functools.partial(_output_and_grads, cfg=cfg))(
            jax.device_put(moe_params, shardings), jax.device_put(x, mesh_lib.batch_sharding(mesh)))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), got, want)


def test_dropless_batch_the_shards_cannot_split_takes_the_global_path(moe_params):
    # The trainer initialises the model on a one-row batch with the mesh in context.
    x = X[:1]
    with mesh_lib.activate(_mesh(data=8)):
        got = jax.jit(_output_and_grads)(moe_params, x)
    want = jax.jit(_output_and_grads)(moe_params, x)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), got, want)


def _array_shapes(hlo: str, op: str) -> list[tuple[int, ...]]:
    """Shapes of the arrays each `op` instruction of a compiled HLO module produces."""
    shapes = []
    for line in hlo.splitlines():
        m = re.search(rf"= \(?([^=]*?)\)? {op}\(", line)
        if m:
            shapes += [tuple(int(d) for d in dims.split(",") if d)
                       for dims in re.findall(r"\w+\[([\d,]*)\]", m.group(1))]
    return shapes


def test_dropless_no_device_sorts_the_global_batch(moe_params):
    """data=8, global batch 8b: every device orders and multiplies its own b*T*k assignments.
    (Ordering the global batch all-gathers the routing and runs every token's experts on every
    device: 8x the work and memory.) The order is a counting sort: no sort instruction."""
    b, T, k = 1, 12, CFG.top_k
    local_rows, global_rows = b * T * k, 8 * b * T * k
    x = jax.random.normal(jax.random.PRNGKey(4), (8 * b, T, CFG.d_model))
    loss = lambda p, x: jnp.sum(apply(p, x=x)[0])  # noqa: E731
    mesh = _mesh(data=8)
    with mesh_lib.activate(mesh):
        hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
            moe_params, jax.device_put(x, mesh_lib.batch_sharding(mesh))).compile().as_text()
    assert not _array_shapes(hlo, "sort")
    dots, scatters = _array_shapes(hlo, "dot"), _array_shapes(hlo, "scatter")
    assert scatters and all(global_rows not in shape for shape in scatters), scatters
    assert any(shape[0] == local_rows for shape in dots), dots
    assert not any(global_rows in shape for shape in dots), dots
