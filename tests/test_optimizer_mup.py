"""The optimiser applies muP's per-role learning-rate multipliers (train/optimizer.py)."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import tiny_model_config, tokens

from loopscale.cli import main
from loopscale.config import Param, load_config, parse
from loopscale.config.schema import Optimizer
from loopscale.errors import UsageError
from loopscale.model import LoopedLM, lr_multipliers
from loopscale.train.optimizer import adam_with_mup, role_labels

LR = 1e-2


@pytest.fixture(scope="module")
def setup():
    # Every role present: embedding, hidden, readout, router (MoE), norm (learnable gains).
    cfg = tiny_model_config(d_model=128, n_heads=4, base_d_model=32, ffn="moe", norm_gain=True,
                            n_loops=2)
    boxed = jax.jit(LoopedLM(cfg).init)(jax.random.PRNGKey(0), tokens())["params"]
    params = nn.unbox(boxed)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    grads = treedef.unflatten([jax.random.normal(k, p.shape) for k, p in zip(keys, leaves)])
    return cfg, boxed, params, grads


def first_update(cfg, params, grads, **kw):
    tx = adam_with_mup(LR, cfg, **kw)
    updates, _ = tx.update(grads, tx.init(params), params)
    return updates


def test_labels_name_every_role(setup):
    cfg, boxed, params, _ = setup
    labels = role_labels(params)
    assert jax.tree.structure(labels) == jax.tree.structure(params)
    assert set(jax.tree.leaves(labels)) == {"embedding", "hidden", "readout", "router", "norm"}
    assert labels["unembed"] == "readout" and labels["embedding"] == "embedding"
    assert labels["loop"]["stack"]["layers"]["moe"]["router"] == "router"
    assert labels["loop"]["stack"]["layers"]["attn"]["wq"] == "hidden"
    # Boxed (nn.Partitioned) parameters get the same labels, one per box.
    boxed_labels = role_labels(boxed)
    assert jax.tree.leaves(boxed_labels) == jax.tree.leaves(labels)


@pytest.mark.parametrize("param", [Param.MUP, Param.MUP_SPARSE])
def test_update_is_sp_update_times_lr_multiplier(setup, param):
    cfg, _, params, grads = setup
    w = cfg.width_mult
    assert w == 4.0
    sp = first_update(dataclasses.replace(cfg, param=Param.SP), params, grads)
    scaled = first_update(dataclasses.replace(cfg, param=param), params, grads)
    mults = lr_multipliers(params, dataclasses.replace(cfg, param=param))
    jax.tree.map(lambda u, s, m: np.testing.assert_allclose(u, s * m, rtol=1e-6), scaled, sp, mults)
    # Spelled out for the roles that matter: hidden weights move 1/w as far under both muPs.
    layers = lambda tree: tree["loop"]["stack"]["layers"]  # noqa: E731
    for leaf in ("wq", "wo"):
        np.testing.assert_allclose(layers(scaled)["attn"][leaf], layers(sp)["attn"][leaf] / w,
                                   rtol=1e-6)
    # w_down's fan-in is the expert width, 192 here against 64 at the base width 32 (SwiGLU's
    # rounded rule): mup divides by that ratio, the sparse-layers study by d_model's.
    fan_in = 192 / 64 if param is Param.MUP else w
    np.testing.assert_allclose(layers(scaled)["moe"]["w_down"],
                               layers(sp)["moe"]["w_down"] / fan_in, rtol=1e-6)
    np.testing.assert_allclose(scaled["embedding"], sp["embedding"], rtol=1e-6)
    np.testing.assert_allclose(layers(scaled)["attn_norm"]["scale"],
                               layers(sp)["attn_norm"]["scale"], rtol=1e-6)
    # Readout and router: Adam LR kept under mup (their forward multiplier does the work), / w
    # under the sparse-layers study's variant.
    factor = 1.0 if param is Param.MUP else 1.0 / w
    np.testing.assert_allclose(scaled["unembed"], sp["unembed"] * factor, rtol=1e-6)
    np.testing.assert_allclose(layers(scaled)["moe"]["router"], layers(sp)["moe"]["router"] * factor,
                               rtol=1e-6)


def test_sp_and_base_width_are_plain_adam(setup):
    cfg, _, params, grads = setup
    reference = optax.adam(LR, b1=0.8, b2=0.9, eps=1e-6)
    expected, _ = reference.update(grads, reference.init(params), params)
    for c in (dataclasses.replace(cfg, param=Param.SP),
              dataclasses.replace(cfg, param=Param.MUP, base_d_model=cfg.d_model)):
        got = first_update(c, params, grads, b1=0.8, b2=0.9, eps=1e-6)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), got, expected)


def test_multipliers_hold_over_steps_and_schedules(setup):
    cfg, boxed, params, grads = setup
    schedule = optax.linear_schedule(LR, 0.0, 10)
    # Boxed parameters go through the same transformation.
    for tree in (params, boxed):
        tx = adam_with_mup(schedule, cfg)
        state = tx.init(tree)
        g = grads if tree is params else jax.tree.map(lambda b, x: b.replace_boxed(x), boxed, grads,
                                                       is_leaf=lambda x: isinstance(x, nn.Partitioned))
        for _ in range(3):
            updates, state = tx.update(g, state, tree)
        updates = nn.unbox(updates)
        layers = updates["loop"]["stack"]["layers"]
        ratio = jnp.abs(layers["mlp" if "mlp" in layers else "moe"]["w_up"]).max() / jnp.abs(
            updates["embedding"]).max()
        # Constant gradients: Adam's direction is +-1 everywhere, so only lr * mult differs.
        np.testing.assert_allclose(ratio, 1.0 / cfg.width_mult, rtol=1e-3)


@pytest.mark.parametrize("param", ["mup", "mup_sparse"])
def test_muon_refuses_a_mup_model(param, capsys):
    """muP's LR factors are Adam's; Muon would drop them while the model still applied muP's
    init and forward multipliers. Refused when the config is read: exit 2, one line."""
    overrides = [f"--config.model.param={param}", "--config.train.optimizer=muon",
                 "--config.train.weight_decay_mode=coupled"]
    with pytest.raises(UsageError, match="model.param=sp"):
        parse(load_config("experiments/base.py:tiny", overrides))
    capsys.readouterr()
    assert main(["flops", "--config=experiments/base.py:tiny", "--no-xla", *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.param=sp" in err[0]
    # The FLT recipe (Muon under sp) is what Muon is for, and parses.
    flt = parse(load_config("experiments/flt.py:small", []))
    assert flt.train.optimizer is Optimizer.MUON and flt.model.param is Param.SP
