"""muP rules: roles of every weight, init scales, forward multipliers, LR multipliers."""

import dataclasses

import jax
import numpy as np
import pytest
import reference
from helpers import init_params, tiny_model_config, tokens

from loopscale.config import Param
from loopscale.model import LoopedLM, Role, lr_multipliers, param_roles, unstack_layers
from loopscale.model.mup import init_of

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
    mup = lr_by_role("mup", 128)  # width_mult 4; w_down's fan-in, the expert width, 192/64 = 3
    assert mup == {Role.EMBEDDING: {1.0}, Role.HIDDEN: {0.25, 1 / 3}, Role.READOUT: {1.0},
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


# The fan-in axes of every hidden weight, as microsoft/mup's InfShape reads them (its width_mult
# is the last infinite dimension's: a matrix's fan-in). Leading axes (layers, experts) are batch.
FAN_IN_AXES = {"wq": (-3,), "wk": (-3,), "wv": (-3,), "wo": (-3, -2), "w_up": (-2,),
               "w_gate": (-2,), "w_down": (-2,)}


@pytest.mark.parametrize("ffn", ["dense", "moe"])
def test_hidden_width_mult_is_the_fan_ins_as_in_mup(ffn):
    """mup's rule from the shapes themselves: a hidden weight's width multiplier is its fan-in at
    this width over its fan-in in the base model (set_base_shapes); Adam's LR is divided by it and
    the init variance too. The SwiGLU width 64*ceil(8d/3/64) is 384 at d 128 and 1408 at d 512,
    so w_down (fan-in d_ff, or d_ff/2 per expert) has 3.67, not d_model's 4: the old rule
    (d_model's multiplier for every hidden weight) fails here."""
    def model(d):
        return tiny_model_config(ffn=ffn, param="mup", d_model=d, base_d_model=128, n_heads=d // 64,
                                 vocab_size=64, n_unique=1, n_loops=1)
    base_cfg, cfg = model(128), model(512)
    base, wide = (jax.eval_shape(lambda c=c: init_params(c, TOKENS)) for c in (base_cfg, cfg))
    mults = flat(lr_multipliers(wide, cfg))
    base, wide = flat(base), flat(wide)
    def fan_in(name, shape):
        return int(np.prod([shape.shape[a] for a in FAN_IN_AXES[name]]))

    checked = set()
    for key, shape in wide.items():
        name = key.split("'")[-2]
        if name not in FAN_IN_AXES:
            continue
        width_mult = fan_in(name, shape) / fan_in(name, base[key])
        assert mults[key] == pytest.approx(1.0 / width_mult), key
        assert init_of(name, cfg).std == pytest.approx(init_of(name, base_cfg).std / np.sqrt(width_mult))
        checked.add(name)
    assert checked >= {"wq", "wo", "w_up", "w_down"}
    assert mults[next(k for k in wide if k.endswith("['w_down']"))] == pytest.approx(384 / 1408)
    # The drawn weights have that std (not only the table). Initialised jitted, as the trainer
    # initialises: eagerly, op by op, the MoE model's init took twice the CPU (the draws differ
    # from the eager ones, the statistic not: 49,152 draws and more per matrix).
    def w_down(c):
        return init_params(c, TOKENS, jit=True)["loop"]["stack"]["layers"]["moe" if ffn == "moe" else "mlp"]["w_down"]

    ratio = np.std(w_down(cfg)) / np.std(w_down(base_cfg))
    assert ratio == pytest.approx(np.sqrt(384 / 1408), rel=0.01)


def test_mup_sparse_keeps_the_studys_d_model_rule_for_w_down():
    """The sparse-layers study divides init variance and LR by d/128 for every weight."""
    cfg = tiny_model_config(param="mup_sparse", d_model=512, base_d_model=128, n_heads=8)
    params = jax.eval_shape(lambda: init_params(cfg, TOKENS))
    w_down = next(v for k, v in flat(lr_multipliers(params, cfg)).items() if k.endswith("['w_down']"))
    assert w_down == 0.25
