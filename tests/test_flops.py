"""Parameter and FLOP accounting (loopscale/flops.py) against the real parameter tree, the
studies' published sizes and XLA's count of the compiled training step: jit(value_and_grad) of
train/step.py `loss_fn`, the loss every train step differentiates (evaluate/xla_cost.py)."""

import dataclasses
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loopscale import cli, flops
from loopscale.config import FlopConvention, load_config, parse
from loopscale.evaluate.xla_cost import lower_train_step, xla_flops_per_token_train
from loopscale.model import LoopedLM
from loopscale.train.step import loss_fn

FAMILIES = ["base", "looped", "moe", "looped_moe"]
INJECTIONS = ["none", "input", "attn_first", "fla", "flt", "repeat"]
PRELUDE_CODA = ["--config.model.n_prelude=1", "--config.model.n_coda=2"]
MID = ["--config.model.d_model=256", "--config.model.n_heads=4", "--config.model.head_dim=64",
       "--config.train.seq_len=256", "--config.train.batch_size=2"]


def config(spec, *overrides):
    return parse(load_config(spec, list(overrides)))


def tree_size(cfg):
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    variables = jax.eval_shape(LoopedLM(cfg).init, jax.random.key(0), tokens)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(variables["params"])))


@pytest.mark.parametrize("spec", [
    "experiments/base.py:paper", "experiments/looped.py:paper", "experiments/moe.py:paper",
    "experiments/looped_moe.py:paper", "experiments/flt.py:paper", "experiments/flt.py:small",
    "experiments/permutation.py:paper", "experiments/flt.py:tiny",
])
def test_param_counts_match_the_parameter_tree(spec):
    cfg = config(spec).model
    p = flops.param_counts(cfg)
    assert p["params_total"] == p["params_embedding"] + p["params_unique"] == tree_size(cfg)
    # Looping multiplies uses, not storage; a norm gain is stored once per physical layer.
    gain = dataclasses.replace(cfg, norm_gain=True)
    assert flops.param_counts(gain)["params_total"] == tree_size(gain)


@pytest.mark.parametrize("family", FAMILIES)
def test_prelude_and_coda_are_stored_once_and_run_once(family):
    """Huginn's shape: n_prelude + n_coda layers of the core's kind, each with its own
    parameters (the tree says how many), counted once per token and in params_once (the
    recurrence law's N_once); the core's counts are the model's without them."""
    core = config(f"experiments/{family}.py:tiny").model
    cfg = dataclasses.replace(core, n_prelude=2, n_coda=1)
    p, q = flops.param_counts(cfg), flops.param_counts(core)
    assert p["params_total"] == tree_size(cfg)
    layer = (p["params_total"] - q["params_total"]) // 3
    assert p["params_total"] == q["params_total"] + 3 * layer
    assert p["params_rec"] == q["params_rec"] and p["params_once"] == q["params_once"] + 3 * layer
    assert p["params_effective"] == q["params_effective"] + 3 * layer
    active_layer = (p["params_active"] - q["params_active"]) // 3
    assert active_layer == q["params_rec_active"] // core.n_unique  # a layer used once
    assert cfg.effective_depth == core.effective_depth + 3
    if family in ("base", "looped"):  # dense: N_once + r N_rec is the active count
        assert p["params_once"] + cfg.n_loops * p["params_rec_active"] == p["params_active"]
    # FLOPs by part: the prelude once, the core n_loops times, the coda once, the rest as before.
    conv = FlopConvention.ATTENTION
    by, by_core = flops.flops_by_part(cfg, 64, conv), flops.flops_by_part(core, 64, conv)
    assert sum(by.values()) == pytest.approx(flops.flops_per_token(cfg, 64, conv))
    assert by["prelude"] == pytest.approx(2 * by["coda"])
    assert by["core"] == pytest.approx(cfg.n_loops * cfg.n_unique * by["coda"]) == by_core["core"]
    assert by["other"] == pytest.approx(by_core["other"]) and by_core["prelude"] == 0


def test_the_studies_published_sizes():
    def m(spec):
        return flops.param_counts(config(spec).model)

    assert round(m("experiments/base.py:paper")["params_total"] / 1e6, 1) == 246.0
    lm = m("experiments/looped_moe.py:paper")
    assert round(lm["params_total"] / 1e6) == 216
    assert round(lm["params_active"] / 1e6) == 167
    assert round(m("experiments/flt.py:paper")["params_total"] / 1e6, 1) == 317.9
    assert round(m("experiments/flt.py:small")["params_total"] / 1e6, 1) == 127.1


def test_the_router_counts_only_where_the_config_says():
    """The sparse-layers study leaves the router out of N_active and its FLOPs (its presets:
    model.count_router=false); counted, it adds D*E per MoE layer use, 6x that in FLOPs. What
    is stored does not change."""
    cfg = config("experiments/looped_moe.py:paper")
    m, T = cfg.model, cfg.train.seq_len
    assert not m.count_router
    counted = dataclasses.replace(m, count_router=True)
    a, b = flops.param_counts(m), flops.param_counts(counted)
    router_uses = m.n_loops * m.n_unique * m.d_model * m.n_experts
    assert b["params_active"] - a["params_active"] == router_uses
    assert b["params_active_stored"] - a["params_active_stored"] == router_uses // m.n_loops
    for key in ("params_unique", "params_effective", "params_total"):
        assert a[key] == b[key]
    for conv in FlopConvention:
        diff = flops.flops_per_token(counted, T, conv) - flops.flops_per_token(m, T, conv)
        assert diff == 6 * router_uses
    assert flops.report(m, T, cfg.flop_convention)["count_router"] is False
    dense = config("experiments/base.py:paper").model  # no router: nothing to leave out
    assert flops.param_counts(dense) == flops.param_counts(
        dataclasses.replace(dense, count_router=True))


def test_loop_and_moe_readings_of_the_param_counts():
    looped = flops.param_counts(config("experiments/looped_moe.py:paper").model)
    layers = looped["params_unique"] // 8  # no norm gains in this preset
    assert looped["params_effective"] == 2 * looped["params_unique"]
    active_layer = (looped["params_active_nonembedding"]) // 16
    assert active_layer < layers
    assert looped["params_active_stored"] == 8 * active_layer + looped["params_embedding"]
    dense = flops.param_counts(config("experiments/base.py:paper").model)
    assert dense["params_active"] == dense["params_total"]


@pytest.mark.parametrize("spec", ["experiments/base.py:paper", "experiments/looped.py:paper",
                                  "experiments/moe.py:paper", "experiments/looped_moe.py:paper",
                                  "experiments/flt.py:tiny"])
@pytest.mark.parametrize("count_router", [False, True])
def test_the_recurrence_split_adds_up(spec, count_router):
    """params_once (vocabulary matrices, final norm) + params_rec (the looped block, stored
    once) is everything stored; with the block used n_loops times at its active size, it is
    params_active. No compile: the totals are the ones checked against the parameter tree."""
    m = dataclasses.replace(config(spec).model, count_router=count_router)
    p = flops.param_counts(m)
    assert p["params_once"] + p["params_rec"] == p["params_total"]
    assert p["params_once"] + m.n_loops * p["params_rec_active"] == p["params_active"]
    assert (p["params_rec"] * m.n_loops + p["params_once"]
            == p["params_effective"] + p["params_embedding"])
    assert p["params_rec_active"] * m.n_loops == p["params_active_nonembedding"] - (
        p["params_once"] - p["params_embedding"])
    if m.ffn.value == "moe":
        assert p["params_rec_active"] < p["params_rec"]
    else:
        assert p["params_rec_active"] == p["params_rec"]
    with_gain = flops.param_counts(dataclasses.replace(m, norm_gain=True))
    assert with_gain["params_once"] == p["params_once"] + m.d_model  # the final norm's gain
    assert with_gain["params_rec"] == p["params_rec"] + 2 * m.d_model * m.n_unique


def test_conventions_relate_as_documented():
    cfg = config("experiments/looped_moe.py:paper")
    m, T = cfg.model, cfg.train.seq_len
    p = flops.param_counts(m)
    by = flops.flops_by_convention(m, T)
    assert by["6n"] == 6 * p["params_active_nonembedding"]
    assert by["6n_emb"] == 6 * p["params_active"]
    attention = 12 * T * m.n_heads * m.d_head * 16
    assert by["6n_attn"] == by["6n_emb"] + attention
    assert by["6n_attn_causal"] == by["6n_emb"] + attention / 2
    report = flops.report(m, T, cfg.flop_convention)
    assert cfg.flop_convention is FlopConvention.SPARSE_STUDY
    assert report["flops_per_token_train"] == by["6n_emb"]
    assert report["flops_per_token_6n"] == by["6n"]


def test_ragged_dot_grouped_count_is_below_the_dense_cpu_one():
    m = config("experiments/moe.py:paper").model
    dense = flops.computed_flops_per_token(m, 1024, ragged_dot_dense=True)
    grouped = flops.computed_flops_per_token(m, 1024, ragged_dot_dense=False)
    # Dense runs every expert on every assignment: (E - 1) x the grouped expert matmuls more.
    expert_matmuls = 16 * 3 * m.top_k * 3 * 2 * m.d_model * m.expert_width
    assert dense - grouped == pytest.approx((m.n_experts - 1) * expert_matmuls, rel=0.02)


CASES = (
    [(f"experiments/{f}.py:tiny",) for f in FAMILIES]
    + [("experiments/flt.py:tiny", f"--config.model.injection={i}") for i in INJECTIONS]
)
CASES = CASES + [(*c, *MID) for c in CASES] + [
    ("experiments/moe.py:tiny", "--config.model.moe_dispatch=capacity"),
    ("experiments/looped_moe.py:tiny", "--config.model.moe_dispatch=capacity", *MID),
    ("experiments/flt.py:tiny", "--config.model.loss_loops=all", "--config.model.remat=layer"),
    ("experiments/base.py:tiny", "--config.model.norm_gain=true", "--config.model.mlp=gelu"),
    # A prelude and a coda: once per token; the coda at every exit when the loss is at all
    # loops; loop remat rematerialising each of them as one pass.
    ("experiments/looped.py:tiny", *PRELUDE_CODA, *MID),
    ("experiments/looped_moe.py:tiny", *PRELUDE_CODA, "--config.model.moe_dispatch=capacity",
     "--config.model.loss_loops=all"),
    ("experiments/flt.py:tiny", *PRELUDE_CODA, "--config.model.remat=loop"),
    ("experiments/looped.py:tiny", "--config.model.loop_modulation=film", *MID),
    ("experiments/looped.py:tiny", "--config.model.injection=parcae", *MID),
    ("experiments/flt.py:tiny", "--config.model.injection=parcae"),
    ("experiments/looped.py:tiny", "--config.model.injection=concat", *MID),
    ("experiments/flt.py:tiny", *PRELUDE_CODA, "--config.model.injection=concat"),
    # Remat keeping the matmuls without batch dimensions: the attention and elementwise work
    # recomputed, the projections and FFN matmuls not.
    ("experiments/flt.py:tiny", "--config.model.remat=dots"),
]


def test_xla_counts_the_training_loss():
    """The program XLA costs is the train step's loss and gradient: with every term of the
    objective switched on (MoE auxiliaries, logit z-loss) it returns `loss_fn`'s value."""
    cfg = config("experiments/looped_moe.py:tiny", "--config.train.z_loss_weight=1e-3",
                 "--config.train.batch_size=2", "--config.train.seq_len=16")
    m, t = cfg.model, cfg.train
    rng = np.random.default_rng(0)
    inputs, targets = (jnp.asarray(rng.integers(0, m.vocab_size, (2, 16)), jnp.int32)
                       for _ in range(2))
    mask = jnp.asarray(rng.random((2, 16)) > 0.2)
    model = LoopedLM(m)
    # Jitted, init and loss alike: run eagerly, op by op, each of their operations compiled
    # on its own (most of this test's time); the value compared is loss_fn's either way.
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), inputs)["params"])
    value, grads = lower_train_step(m, t).compile()(params, inputs, targets, mask)
    batch = {"inputs": inputs, "targets": targets, "mask": mask}
    want, aux = jax.jit(lambda p, b: loss_fn(p, b, model, t, m.n_loops))(params, batch)
    assert float(value) == pytest.approx(float(want), rel=1e-5)
    assert float(aux["lb_loss"]) > 0 and float(value) > float(aux["ce"])
    assert jax.tree.structure(grads) == jax.tree.structure(params)


@pytest.mark.parametrize("case", CASES, ids=lambda c: " ".join(x.split("/")[-1] for x in c))
def test_computed_flops_match_xla_within_5_percent(case):
    """The analytic count of what the training step executes (`computed_flops_per_token`)
    against XLA's count of the compiled train loss and gradient (`loss_fn`, unrolled)."""
    cfg = config(*case)
    xla = xla_flops_per_token_train(cfg.model, cfg.train)["xla_flops_per_token_train"]
    computed = flops.computed_flops_per_token(cfg.model, cfg.train.seq_len, ragged_dot_dense=True)
    assert computed == pytest.approx(xla, rel=0.05)


def test_cli_prints_the_report(capsys):
    assert cli.main(["flops", "--config=experiments/looped.py:tiny", "--no-xla"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ["params_embedding", "params_unique", "params_effective", "params_active",
                "flops_per_token_train", "flops_per_token_6n", "flops_per_token_computed",
                "xla_flops_per_token_train"]:
        assert key in out
    assert out["params_effective"] == 2 * out["params_unique"]
    assert out["xla_flops_per_token_train"] is None
    assert (out["flop_convention"], out["count_router"]) == ("6n_emb", True)  # tiny: defaults


def test_cli_bad_override_exits_2(capsys):
    assert cli.main(["flops", "--config=experiments/base.py:tiny", "--config.model.nope=1"]) == 2
    assert "nope" in capsys.readouterr().err
