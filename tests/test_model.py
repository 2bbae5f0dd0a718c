"""The looped model: scan == Python loops, every injection mode == its equations, parameter
counts independent of mode and loop count, logical axes on every parameter."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import init_params, n_params, tiny_model_config, tokens, unrolled

from loopscale import flops
from loopscale.config import Injection, Remat, load_config, parse
from loopscale.config.schema import DType
from loopscale.errors import UsageError
from loopscale.model import LoopedLM, StreamEdit, stack_layers, unstack_layers
from loopscale.train import sharded_state
from loopscale.train.step import loss_fn

# The modes without parameters of their own (parcae and concat have theirs:
# tests/test_loop_modulation.py).
MODES = [m.value for m in Injection if m not in (Injection.PARCAE, Injection.CONCAT)]
TOKENS = tokens()


@pytest.fixture(scope="module")
def params_by_mode():
    """Scanned params per mode (all modes share shapes, so one init serves all)."""
    cfg = tiny_model_config()
    params = init_params(cfg, TOKENS)
    return cfg, params


@pytest.mark.parametrize("mode", MODES)
def test_mode_matches_hand_written_equations(params_by_mode, mode):
    cfg, params = params_by_mode
    cfg = dataclasses.replace(cfg, injection=Injection(mode), embed_norm=True, qk_norm=True)
    out = LoopedLM(cfg).apply({"params": params}, TOKENS)
    want = reference.forward(unstack_layers(params, cfg.n_unique), TOKENS, cfg)
    np.testing.assert_allclose(out.logits, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mode", ["none", "fla", "flt", "attn_first"])
def test_scan_and_python_loops_agree(params_by_mode, mode):
    cfg, params = params_by_mode
    cfg = dataclasses.replace(cfg, injection=Injection(mode))
    scanned = LoopedLM(cfg, collect_layers=True).apply({"params": params}, TOKENS)
    flat = unstack_layers(params, cfg.n_unique)
    looped = LoopedLM(unrolled(cfg), collect_layers=True).apply({"params": flat}, TOKENS)
    for a, b in [(scanned.logits, looped.logits), (scanned.loop_hidden, looped.loop_hidden),
                 (scanned.layer_hidden, looped.layer_hidden),
                 (scanned.residual_norm, looped.residual_norm)]:
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def loops_unscanned(cfg):
    return dataclasses.replace(cfg, scan_loops=False)


# Modes whose switches read the loop index, a Python int in one model and traced in the
# other: where a loop starts (input), the first layer of a loop only (attn_first).
@pytest.mark.parametrize("mode", ["input", "attn_first"])
def test_loops_in_python_around_the_layer_scan_compute_the_nested_scans(params_by_mode, mode):
    """scan_loops=False (a Python loop over loops, layers still scanned) takes the nested-scan
    model's params as they are and gives its outputs, every collected stream, under an edit
    of the stream, and the gradient of a loss alike."""
    cfg, params = params_by_mode
    cfg = dataclasses.replace(cfg, injection=Injection(mode), embed_norm=True)
    nested, python = (LoopedLM(c, collect_layers=True) for c in (cfg, loops_unscanned(cfg)))
    assert nested.scans_loops and not python.scans_loops
    shapes = jax.eval_shape(lambda: init_params(loops_unscanned(cfg), TOKENS))
    assert jax.tree.map(jnp.shape, shapes) == jax.tree.map(jnp.shape, params)

    @functools.partial(jax.jit, static_argnums=(0, 2))
    def run(model, p, n_loops, edit):
        out = model.apply({"params": p}, TOKENS, n_loops=n_loops, edit=edit)
        grad = jax.grad(lambda q: jnp.mean(jnp.square(
            model.apply({"params": q}, TOKENS, n_loops=n_loops, edit=edit).logits)))(p)
        return out, grad

    edit = _random_edit(cfg)
    (a, ga), (b, gb) = (run(m, params, cfg.n_loops, edit) for m in (nested, python))
    for x, y in [(a.logits, b.logits), (a.loop_hidden, b.loop_hidden),
                 (a.layer_hidden, b.layer_hidden), (a.residual_norm, b.residual_norm),
                 (a.residual_rms, b.residual_rms), *zip(jax.tree.leaves(ga), jax.tree.leaves(gb))]:
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-4)


def test_one_loop_never_scans_its_loops():
    """A model built for one loop (Base, MoE) calls the layer scan directly; more loops at apply
    time then run as a Python loop. With scan_loops the per-loop-params model still scans."""
    one = tiny_model_config(n_loops=1)
    assert not LoopedLM(one).scans_loops and LoopedLM(tiny_model_config()).scans_loops
    assert LoopedLM(loops_unscanned(tiny_model_config()), per_loop_params=True).scans_loops
    assert not LoopedLM(unrolled(tiny_model_config())).scans_loops


def test_layer_param_layouts_round_trip(params_by_mode):
    cfg, params = params_by_mode
    back = stack_layers(unstack_layers(params, cfg.n_unique), cfg.n_unique)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    # The unrolled model initialises exactly the unrolled layout.
    shapes = jax.eval_shape(lambda: init_params(unrolled(cfg), TOKENS))
    assert jax.tree.structure(shapes) == jax.tree.structure(unstack_layers(params, cfg.n_unique))


def test_parameter_count_independent_of_mode_and_loops():
    counts = {}
    for mode in MODES:
        for loops in (1, 4):
            cfg = tiny_model_config(injection=mode, n_loops=loops)
            shapes = jax.eval_shape(lambda c=cfg: init_params(c, TOKENS))
            counts[(mode, loops)] = n_params(shapes)
    assert len(set(counts.values())) == 1, counts


def test_loop_count_can_change_at_apply_time(params_by_mode):
    cfg, params = params_by_mode
    cfg = dataclasses.replace(cfg, injection=Injection.FLT, embed_norm=True)
    model = LoopedLM(cfg)
    for loops in (1, 5):
        out = model.apply({"params": params}, TOKENS, n_loops=loops)
        assert out.loop_hidden.shape[0] == loops and out.residual_norm.shape == (loops,)
        want = reference.forward(unstack_layers(params, cfg.n_unique), TOKENS, cfg, n_loops=loops)
        np.testing.assert_allclose(out.logits, want, atol=2e-5, rtol=2e-5)


def _remat_loss(p, c):
    return jnp.mean(LoopedLM(c).apply({"params": p}, TOKENS).logits ** 2)


# The gradient, jitted as the train step takes it (eagerly, op by op, each case took about
# 10 s of CPU), one module-level function: jit compiles once per config (static), so the
# gradient without remat that both cases compare against is compiled once.
_remat_grad = jax.jit(jax.grad(_remat_loss), static_argnums=1)


@pytest.mark.parametrize("remat", ["layer", "loop", "dots"])
def test_remat_changes_nothing_numerically(params_by_mode, remat):
    cfg, params = params_by_mode
    g0 = _remat_grad(params, cfg)
    g1 = _remat_grad(params, dataclasses.replace(cfg, remat=Remat(remat)))
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def test_every_parameter_has_logical_axes():
    for ffn in ("dense", "moe"):
        cfg = tiny_model_config(ffn=ffn, norm_gain=True)
        boxed = jax.eval_shape(lambda c=cfg: LoopedLM(c).init(jax.random.PRNGKey(0), TOKENS))["params"]
        leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
        for leaf in leaves:
            assert isinstance(leaf, nn.Partitioned), leaf
            assert len(leaf.names) == leaf.value.ndim
        layer_leaves = jax.tree.leaves(boxed["loop"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
        assert all(leaf.names[0] == "layers" for leaf in layer_leaves)
        if ffn == "moe":
            experts = boxed["loop"]["stack"]["layers"]["moe"]["w_up"]
            assert experts.names == ("layers", "expert", "embed", "mlp")


def test_residual_norm_is_mean_token_l2_norm(params_by_mode):
    cfg, params = params_by_mode
    out = LoopedLM(cfg).apply({"params": params}, TOKENS)
    want = jnp.mean(jnp.linalg.norm(out.loop_hidden, axis=-1), axis=(1, 2))
    np.testing.assert_allclose(out.residual_norm, want, rtol=1e-6)


def test_exit_logits_use_the_shared_readout(params_by_mode):
    cfg, params = params_by_mode
    model = LoopedLM(cfg)
    out = model.apply({"params": params}, TOKENS, exit_logits=True)
    assert out.exit_logits.shape == (cfg.n_loops, *out.logits.shape)
    np.testing.assert_allclose(out.exit_logits[-1], out.logits, atol=1e-6)
    middle = model.apply({"params": params}, out.loop_hidden[0], method=LoopedLM.readout)
    np.testing.assert_allclose(out.exit_logits[0], middle, atol=1e-6)


def test_zero_init_output_projections_make_blocks_identity():
    cfg = tiny_model_config(zero_init_out=True, injection="repeat", embed_norm=True)
    params = init_params(cfg, TOKENS)
    out = LoopedLM(cfg).apply({"params": params}, TOKENS)
    e = params["embedding"][TOKENS]
    x0 = e / jnp.sqrt(jnp.mean(e * e, axis=-1, keepdims=True) + cfg.norm_eps)
    for t in range(cfg.n_loops):
        np.testing.assert_allclose(out.loop_hidden[t], x0, atol=1e-5)


def test_softcap_bounds_logits():
    cfg = tiny_model_config(logit_softcap=0.5, init_std=1.0)
    params = init_params(cfg, TOKENS)
    logits = LoopedLM(cfg).apply({"params": params}, TOKENS).logits
    assert float(jnp.max(jnp.abs(logits))) <= 0.5
    assert float(jnp.max(jnp.abs(logits))) > 0.4  # the cap is reached, so it was applied


def test_bfloat16_activations_stay_close_to_float32(params_by_mode):
    cfg, params = params_by_mode
    f32 = LoopedLM(cfg).apply({"params": params}, TOKENS).logits
    bf16 = LoopedLM(dataclasses.replace(cfg, dtype=DType.BFLOAT16)).apply({"params": params}, TOKENS).logits
    assert bf16.dtype == jnp.float32  # logits are always float32
    gap = float(jnp.max(jnp.abs(bf16 - f32)))
    assert 0 < gap < 0.05, gap  # rounded (so bf16 really ran), but close


def _random_edit(cfg, seed=3):
    """keep in {0, 1} (about half the positions), add a random stream, at every loop and layer."""
    K, L, (B, T), D = cfg.n_loops, cfg.n_unique, TOKENS.shape, cfg.d_model
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    keep = jax.random.bernoulli(k1, 0.5, (K, L, B, T)).astype(jnp.float32)
    return StreamEdit(keep, jax.random.normal(k2, (K, L, B, T, D)))


@pytest.mark.parametrize("mode", ["none", "flt", "repeat", "fla"])
def test_stream_edit_replaces_the_stream_where_keep_is_zero(params_by_mode, mode):
    """keep = 0 with add = x' puts x' in the stream at the end of that layer of that loop (the
    last layer's is the loop boundary, what the next loop reads): the hand-written equations
    continued from x', on the scanned and the unrolled model alike."""
    cfg, params = params_by_mode
    cfg = dataclasses.replace(cfg, injection=Injection(mode), embed_norm=True)
    edit = _random_edit(cfg)
    edit = StreamEdit(edit.keep_KxLxBxT, edit.add_KxLxBxTxD * (1 - edit.keep_KxLxBxT)[..., None])

    def by_hand(t, l, x):
        keep = edit.keep_KxLxBxT[t, l][..., None]
        return jnp.where(keep > 0, x, edit.add_KxLxBxTxD[t, l])

    flat = unstack_layers(params, cfg.n_unique)
    want = reference.forward(flat, TOKENS, cfg, after_layer=by_hand)
    scanned = LoopedLM(cfg, collect_layers=True).apply({"params": params}, TOKENS, edit=edit)
    looped = LoopedLM(unrolled(cfg), collect_layers=True).apply({"params": flat}, TOKENS, edit=edit)
    for out in (scanned, looped):
        np.testing.assert_allclose(out.logits, want, atol=2e-5, rtol=2e-5)
        # The collected streams are the edited ones: x' wherever keep is 0.
        put = np.asarray(edit.keep_KxLxBxT) == 0
        np.testing.assert_array_equal(np.asarray(out.layer_hidden)[put],
                                      np.asarray(edit.add_KxLxBxTxD)[put])
    np.testing.assert_allclose(scanned.layer_hidden, looped.layer_hidden, atol=1e-5, rtol=1e-5)


def test_stream_edit_scales_and_adds(params_by_mode):
    """A general edit, x * keep + add with keep anywhere in [0, 2], at every loop and layer."""
    cfg, params = params_by_mode
    cfg = dataclasses.replace(cfg, injection=Injection.FLT, embed_norm=True)
    K, L, (B, T), D = cfg.n_loops, cfg.n_unique, TOKENS.shape, cfg.d_model
    k1, k2 = jax.random.split(jax.random.PRNGKey(5))
    edit = StreamEdit(jax.random.uniform(k1, (K, L, B, T), maxval=2.0),
                      0.3 * jax.random.normal(k2, (K, L, B, T, D)))
    flat = unstack_layers(params, cfg.n_unique)
    want = reference.forward(flat, TOKENS, cfg, after_layer=lambda t, l, x: (
        x * edit.keep_KxLxBxT[t, l][..., None] + edit.add_KxLxBxTxD[t, l]))
    for model, p in ((LoopedLM(cfg), params), (LoopedLM(unrolled(cfg)), flat)):
        np.testing.assert_allclose(model.apply({"params": p}, TOKENS, edit=edit).logits, want,
                                   atol=2e-5, rtol=2e-5)


def test_identity_edit_is_bitwise_the_model_without_one(params_by_mode):
    """keep = 1, add = 0 computes exactly what edit=None does (so the hook's gradient is taken
    at the model itself); None adds no operation at all (the lowered train step's text is
    unchanged by the hook, checked when it was added)."""
    cfg, params = params_by_mode
    K, L, (B, T), D = cfg.n_loops, cfg.n_unique, TOKENS.shape, cfg.d_model
    identity = StreamEdit(jnp.ones((K, L, B, T)), jnp.zeros((K, L, B, T, D)))
    flat = unstack_layers(params, cfg.n_unique)
    for model, p in ((LoopedLM(cfg, collect_layers=True), params),
                     (LoopedLM(unrolled(cfg), collect_layers=True), flat)):
        plain = model.apply({"params": p}, TOKENS)
        edited = model.apply({"params": p}, TOKENS, edit=identity)
        for a, b in ((plain.logits, edited.logits), (plain.layer_hidden, edited.layer_hidden)):
            np.testing.assert_array_equal(a, b)


def test_a_padded_vocabulary_is_the_unpadded_model_on_its_real_rows():
    """model.vocab_multiple: the vocabulary matrices stored with 29 rows rounded up to 32; the
    padding's logits are masked out of the softmax (probability exactly 0, after the soft cap),
    so with the same real rows the loss is the unpadded model's; an odd vocabulary that cannot
    be split over mesh.tensor=2 can once padded."""
    cfg = tiny_model_config(vocab_size=29, vocab_multiple=8, logit_softcap=15.0)
    toks = tokens(vocab=29)
    params = init_params(cfg, toks)
    assert params["embedding"].shape == (32, cfg.d_model)
    assert params["unembed"].shape == (cfg.d_model, 32)
    assert flops.param_counts(cfg)["params_total"] == n_params(params)
    plain = dataclasses.replace(cfg, vocab_multiple=1)
    real = {**params, "embedding": params["embedding"][:29], "unembed": params["unembed"][:, :29]}
    logits = LoopedLM(cfg).apply({"params": params}, toks).logits
    assert float(jnp.max(jax.nn.softmax(logits)[..., 29:])) == 0.0
    np.testing.assert_allclose(jax.nn.log_softmax(logits)[..., :29], jax.nn.log_softmax(
        LoopedLM(plain).apply({"params": real}, toks).logits), atol=1e-6)
    config = parse(load_config("experiments/base.py:tiny", ["--config.model.vocab_size=29"]))
    batch = {"inputs": toks, "targets": jnp.roll(toks, 1, axis=1),
             "mask": jnp.ones(toks.shape, bool)}
    padded_model = dataclasses.replace(config.model, vocab_multiple=8)
    padded = init_params(padded_model, toks)
    cut = {**padded, "embedding": padded["embedding"][:29],
           "unembed": padded["unembed"][:, :29]}
    want = loss_fn(cut, batch, LoopedLM(config.model), config.train, 1)[0]
    got = loss_fn(padded, batch, LoopedLM(padded_model), config.train, 1)[0]
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    tensor = ["--config.model.vocab_size=257", "--config.model.n_heads=2",
              "--config.mesh.tensor=2"]
    with pytest.raises(UsageError, match="cannot be split 2 ways.*vocab_multiple pads"):
        sharded_state.setup(parse(load_config("experiments/base.py:tiny", tensor)))
    s = sharded_state.setup(parse(load_config("experiments/base.py:tiny",
                                              [*tensor, "--config.model.vocab_multiple=128"])))
    assert s.config.model.padded_vocab == 384
