"""The FLT study's training recipe as its released code sets it (scripts/base_train.py,
nanochat/gpt.py setup_optimizers): Muon's momentum ramp, the AdamW LRs scaled with width, AdamW's
eps, 20 tokens per parameter, and the stability sweep's 2,000 steps (PAPERS.md section 1)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_model_config

from loopscale import flops
from loopscale.config import load_config, parse
from loopscale.model import LoopedLM
from loopscale.sweep import load_sweep
from loopscale.sweep.plan import plan
from loopscale.train.optimizer import build_optimizer, muon_momentum, scheduled_update


def flt(arg, *overrides):
    return parse(load_config(f"experiments/flt.py:{arg}", list(overrides)))


def authors_momentum(it):
    """get_muon_momentum of the released base_train.py."""
    frac = min(it / 300, 1)
    return (1 - frac) * 0.85 + frac * 0.95


@pytest.mark.parametrize("size", ["small", "paper"])
def test_muon_momentum_ramps_as_the_authors(size):
    schedule = muon_momentum(flt(size).train)
    for it in (0, 1, 100, 150, 299, 300, 301, 5000):
        assert float(schedule(it)) == pytest.approx(authors_momentum(it), abs=1e-6)


def test_without_a_ramp_the_momentum_is_constant():
    train = flt("small", "--config.train.muon_momentum_warmup=0").train
    assert muon_momentum(train) == 0.95


def test_the_ramp_drives_muons_momentum_buffer():
    """Over the ramp, Muon's first moment is mu_t = b_t mu_{t-1} + (1 - b_t) g_t with b_t the
    ramp at update t = 0, 1, ...: rebuilt by hand from the gradients fed in (a 4-step ramp)."""
    cfg = tiny_model_config()
    train = flt("small", "--config.train.muon_momentum_warmup=4", "--config.train.grad_clip=0",
                "--config.train.schedule=constant").train
    params = nn.unbox(jax.jit(LoopedLM(cfg).init)(jax.random.key(0),
                                                  jnp.zeros((1, 8), jnp.int32))["params"])
    tx, lr_factor = build_optimizer(train, cfg)
    state = tx.init(params)
    wq = ("loop", "stack", "layers", "attn", "wq")
    rng = np.random.default_rng(0)
    mu = np.zeros(params["loop"]["stack"]["layers"]["attn"]["wq"].shape, np.float32)
    for t in range(6):
        grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
        _, state = scheduled_update(tx, grads, state, params, lr_factor(t))
        beta = 0.85 + 0.1 * min(t / 4, 1)
        g = np.asarray(grads["loop"]["stack"]["layers"]["attn"]["wq"])
        mu = beta * mu + (1 - beta) * g
        moments = [s for s in jax.tree.leaves(state, is_leaf=_is_muon_state)
                   if _is_muon_state(s)]
        assert len(moments) == 1
        got = moments[0].mu
        for key in wq:
            got = got[key]
        np.testing.assert_allclose(np.asarray(got), mu, rtol=1e-5, atol=1e-6)


def _is_muon_state(x):
    return type(x).__name__ == "MuonState"


@pytest.mark.parametrize("size,d", [("small", 384), ("paper", 768)])
def test_adamw_lrs_scale_with_width_and_eps(size, d):
    t = flt(size).train
    scale = (d / 768) ** -0.5
    assert t.embed_lr == pytest.approx(0.2 * scale) and t.head_lr == pytest.approx(0.004 * scale)
    assert (t.b1, t.b2, t.eps) == (0.8, 0.95, 1e-10)
    assert (t.lr, t.muon_momentum_start, t.muon_momentum, t.muon_momentum_warmup) == (
        0.02, 0.85, 0.95, 300)
    wider = flt(size, "--config.model.d_model=1536", "--config.model.n_heads=12").train
    assert wider.embed_lr == pytest.approx(0.2 * (1536 / 768) ** -0.5)


@pytest.mark.parametrize("arg", ["small", "paper", "paper,12"])
def test_twenty_tokens_per_parameter(arg):
    """num_iterations = 20 * params // tokens per step, as target_param_data_ratio = 20."""
    cfg = flt(arg)
    params = flops.param_counts(cfg.model)["params_total"]
    tokens_per_step = cfg.train.batch_size * cfg.train.seq_len
    assert tokens_per_step == 524288
    assert cfg.train.steps == 20 * params // tokens_per_step
    assert cfg.train.steps == {"small": 4848, "paper": 12127, "paper,12": 12127}[arg]


def test_the_stability_sweep_trains_2000_steps():
    runs = plan(load_sweep("sweeps/flt_stability.py:small")).runs
    assert len(runs) == 15
    assert {r.config.train.steps for r in runs} == {2000}
    assert {r.config.model.n_loops for r in runs} == {6, 9, 12}
    assert {r.config.train.muon_momentum_warmup for r in runs} == {300}


def test_optax_adamw_gets_the_configured_eps():
    """The embedding and head AdamW use train.eps: a first step of a tiny gradient is
    lr * g / (|g| + eps), so eps 1e-10 against 1e-8 shows at |g| = 1e-9."""
    cfg = tiny_model_config()
    params = {"embedding": jnp.ones((4, 4)), "unembed": jnp.ones((4, 4))}
    grads = jax.tree.map(lambda x: jnp.full_like(x, 1e-9), params)
    out = {}
    for eps in (1e-10, 1e-8):
        train = flt("small", f"--config.train.eps={eps}", "--config.train.grad_clip=0").train
        tx, lr_factor = build_optimizer(train, cfg)
        updates, _ = scheduled_update(tx, grads, tx.init(params), params, lr_factor(0))
        out[eps] = float(updates["embedding"][0, 0]) / -train.embed_lr
    assert out[1e-10] == pytest.approx(1e-9 / (1e-9 + 1e-10), rel=1e-3)
    assert out[1e-8] == pytest.approx(1e-9 / (1e-9 + 1e-8), rel=1e-3)


@pytest.mark.parametrize("loops, remat", [(6, "none"), (12, "none"), (16, "none"), (18, "dots")])
def test_the_paper_preset_rematerialises_only_beyond_16_loops(loops, remat):
    """With the splash kernel the step without remat fits in 80% of a v5p chip up to 16 loops
    (78.5 GB at 16, 86.5 at 18: experiments/flt.py, docs/compile.md); beyond, remat=dots (35.8
    GB and 0.511 s at 18, against remat=layer's 14.1 GB and 0.573 s)."""
    config = parse(load_config(f"experiments/flt.py:paper,{loops}", []))
    assert config.model.remat.value == remat
