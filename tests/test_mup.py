"""muP rules: roles of every weight, init scales, forward multipliers, LR multipliers."""

import dataclasses

import jax
import numpy as np
import pytest
import reference
from helpers import init_params, tiny_model_config, tokens

from loopscale.config import Param
from loopscale.model import LoopedLM, Role, lr_multipliers, param_roles, unstack_layers

TOKENS = tokens(length=8)


def flat(tree):
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("ffn", ["dense", "moe"])
def test_every_weight_has_a_role(ffn):
    cfg = tiny_model_config(ffn=ffn, norm_gain=True, mlp="swiglu")
    params = jax.eval_shape(lambda: init_params(cfg, TOKENS))
    roles = flat(param_roles(params))
    assert set(roles.values()) >= {Role.EMBEDDING, Role.HIDDEN, Role.READOUT, Role.NORM}
    assert (Role.ROUTER in roles.values()) == (ffn == "moe")


def lr_by_role(param, width):
    cfg = tiny_model_config(ffn="moe", norm_gain=True, param=param, d_model=width, base_d_model=32,
                            n_heads=width // 16)
    params = jax.eval_shape(lambda: init_params(cfg, TOKENS))
    roles, mults = flat(param_roles(params)), flat(lr_multipliers(params, cfg))
    out = {}
    for key, role in roles.items():
        out.setdefault(role, set()).add(mults[key])
    return out


def test_lr_multipliers_per_preset():
    mup = lr_by_role("mup", 128)  # width_mult 4
    assert mup == {Role.EMBEDDING: {1.0}, Role.HIDDEN: {0.25}, Role.READOUT: {1.0},
                   Role.ROUTER: {1.0}, Role.NORM: {1.0}}
    sparse = lr_by_role("mup_sparse", 128)
    assert sparse == {Role.EMBEDDING: {1.0}, Role.HIDDEN: {0.25}, Role.READOUT: {0.25},
                      Role.ROUTER: {0.25}, Role.NORM: {1.0}}
    sp = lr_by_role("sp", 128)
    assert all(v == {1.0} for v in sp.values())


@pytest.mark.parametrize("param,hidden_ratio,readout_ratio", [
    ("mup", 0.5, 1.0), ("mup_sparse", 0.5, 0.5), ("sp", 1.0, 1.0)])
def test_init_std_scales_with_width(param, hidden_ratio, readout_ratio):
    """Measured std of the initialised weights at 4x the width, relative to the base width."""
    def stds(width):
        cfg = tiny_model_config(param=param, d_model=width, base_d_model=64, n_heads=width // 32,
                                vocab_size=512)
        p = init_params(cfg, TOKENS)
        layer = p["loop"]["stack"]["layers"]
        return {"hidden": float(np.std(layer["mlp"]["w_up"])), "readout": float(np.std(p["unembed"])),
                "embedding": float(np.std(p["embedding"]))}
    small, large = stds(64), stds(256)
    assert large["hidden"] / small["hidden"] == pytest.approx(hidden_ratio, rel=0.05)
    assert large["readout"] / small["readout"] == pytest.approx(readout_ratio, rel=0.05)
    assert large["embedding"] / small["embedding"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("param", ["mup", "sp", "mup_sparse"])
def test_forward_multipliers_match_reference_away_from_base_width(param):
    """Readout multiplier 1/w and attention scale attn_mult/d_head (muP) or 1/sqrt(d_head) (sp)."""
    cfg = tiny_model_config(param=param, d_model=64, base_d_model=16, n_heads=2, output_mult=2.0,
                            attn_mult=3.0, injection="flt", embed_norm=True)
    params = init_params(cfg, TOKENS)
    got = LoopedLM(cfg).apply({"params": params}, TOKENS).logits
    want = reference.forward(unstack_layers(params, cfg.n_unique), TOKENS, cfg)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    if param == "mup":  # and the multiplier really is applied: without it logits are 2x larger
        plain = dataclasses.replace(cfg, param=Param.SP)
        sp_logits = LoopedLM(plain).apply({"params": params}, TOKENS).logits
        assert not np.allclose(got, sp_logits, atol=1e-4)
