"""Prelude, recurrent core, coda (model.n_prelude, model.n_coda; issue #24): the model against
the hand-written equations of tests/reference.py, the scanned and unrolled paths against each
other, the coda at every exit, and a model that loops once against the plain stack it is."""

import dataclasses
import functools
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from helpers import init_params, tiny_model_config, tokens, unrolled

from loopscale.aot import compile as aot
from loopscale.cli import main
from loopscale.config import Injection, LossLoops, load_config, parse
from loopscale.model import LoopedLM, stack_layers, unstack_layers

TOKENS = tokens()


# Jitted (cfg static): run op by op, the tiny models took most of this file's time.
@functools.partial(jax.jit, static_argnums=0, static_argnames=("exit_logits",))
def apply(cfg, params, exit_logits=False):
    return LoopedLM(cfg).apply({"params": params}, TOKENS, exit_logits=exit_logits)


@functools.partial(jax.jit, static_argnums=(0, 2))
def hand_written(cfg, flat_params, n_loops=None):
    return reference.forward(flat_params, TOKENS, cfg, n_loops=n_loops)


@pytest.fixture(scope="module")
def parts():
    """A 1-3-2 model (prelude 1, core of 2 layers looped 3 times, coda 2) and its params; all
    injection modes share shapes."""
    cfg = tiny_model_config(n_prelude=1, n_coda=2)
    return cfg, init_params(cfg, TOKENS, jit=True)


@pytest.mark.parametrize("mode", ["none", "input", "flt"])
def test_prelude_and_coda_match_hand_written_equations(parts, mode):
    """The prelude's output is the signal every injection mode feeds back (input adds it, flt
    restarts from its norm); the coda runs once after the last loop."""
    cfg, params = parts
    cfg = dataclasses.replace(cfg, injection=Injection(mode), embed_norm=True)
    out = apply(cfg, params)
    want = hand_written(cfg, unstack_layers(params, cfg.n_unique))
    np.testing.assert_allclose(out.logits, want, atol=2e-5, rtol=2e-5)


def test_scan_and_python_loops_agree_with_a_prelude_and_coda(parts):
    cfg, params = parts
    flat = unstack_layers(params, cfg.n_unique)
    assert set(flat["prelude"]) == {"layer_0"} and set(flat["coda"]) == {"layer_0", "layer_1"}
    back = stack_layers(flat, cfg.n_unique)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    scanned = apply(cfg, params, exit_logits=True)
    looped = apply(unrolled(cfg), flat, exit_logits=True)
    np.testing.assert_allclose(scanned.exit_logits, looped.exit_logits, atol=1e-5, rtol=1e-5)


def test_every_exit_is_the_model_stopped_there(parts):
    """Exit t reads the coda's output on loop t's stream: the whole model run for t + 1 loops
    (what an early exit or a test-time loop count means for Huginn's shape). Without asking for
    every exit only the last loop's coda runs."""
    cfg, params = parts
    out = apply(cfg, params, exit_logits=True)
    assert out.exit_hidden.shape[0] == cfg.n_loops
    flat = unstack_layers(params, cfg.n_unique)
    for t in range(cfg.n_loops):
        want = hand_written(cfg, flat, t + 1)
        np.testing.assert_allclose(out.exit_logits[t], want, atol=2e-5, rtol=2e-5)
    last = apply(cfg, params)
    assert last.exit_hidden.shape[0] == 1
    np.testing.assert_allclose(last.logits, out.exit_logits[-1], atol=1e-6)
    np.testing.assert_allclose(last.exit_hidden[0], out.exit_hidden[-1], atol=1e-6)
    # A loss at every loop reads every exit, so the model runs the coda at each of them.
    every = dataclasses.replace(cfg, loss_loops=LossLoops.ALL)
    assert jax.eval_shape(apply, every, params).exit_hidden.shape[0] == 3


def test_one_loop_of_prelude_core_coda_is_the_plain_stack(parts):
    """Prelude 1 + core 2 (one loop) + coda 2 is a 5-layer Base model with those layers in
    order: each part has its own parameters and they run prelude, core, coda."""
    cfg, params = parts
    cfg = dataclasses.replace(cfg, n_loops=1)
    stacked = jax.tree.map(lambda *p: jnp.concatenate(p), params["prelude"]["layers"],
                           params["loop"]["stack"]["layers"], params["coda"]["layers"])
    plain = {"embedding": params["embedding"], "unembed": params["unembed"],
             "loop": {"stack": {"layers": stacked}}}
    base = dataclasses.replace(cfg, n_prelude=0, n_coda=0, n_unique=5)
    np.testing.assert_array_equal(apply(cfg, params).logits, apply(base, plain).logits)


def test_moe_prelude_and_coda_join_the_auxiliary_losses():
    """The load-balancing and router z-losses average over every MoE layer use, the prelude's
    and coda's included: prelude 1 + core 2 (one loop) + coda 1 has the losses of the 4-layer
    stack of those layers (a mean over the core's 2 uses alone would not)."""
    cfg = tiny_model_config(ffn="moe", n_prelude=1, n_coda=1, n_loops=1,
                            moe_dispatch="capacity")
    params = init_params(cfg, TOKENS, jit=True)
    stacked = jax.tree.map(lambda *p: jnp.concatenate(p), params["prelude"]["layers"],
                           params["loop"]["stack"]["layers"], params["coda"]["layers"])
    plain = {"embedding": params["embedding"], "unembed": params["unembed"],
             "loop": {"stack": {"layers": stacked}}}
    out = apply(cfg, params)
    stack = apply(dataclasses.replace(cfg, n_prelude=0, n_coda=0, n_unique=4), plain)
    assert out.moe["lb_loss"].shape == (1, 2)  # the core's per loop and layer
    for name in ("lb_loss", "router_z"):
        np.testing.assert_allclose(getattr(out, name), getattr(stack, name), rtol=1e-5)
        assert float(getattr(out, name)) != pytest.approx(float(jnp.mean(out.moe[name])))



# sha256 (first 16 hex digits) of each family's tiny train step as lowered on one device
# (StableHLO text), recorded at daa5c95, before the prelude and coda existed. A model without
# them must trace exactly as before; a change meant to alter a preset's step updates its entry.
TRACES_BEFORE_PARTS = {
    "base": "85b7a382b3b3517b",
    "looped": "64ab9003ff8bab87",
    "moe": "68c0eac12fc1f10c",
    "looped_moe": "90d0a4728b38840e",
    "flt": "fe8b70829c8e0b4c",
    "permutation": "d3bebe9a1ed7b979",
}


@pytest.mark.parametrize("family", sorted(TRACES_BEFORE_PARTS))
def test_models_without_prelude_or_coda_trace_as_before(family):
    config = parse(load_config(f"experiments/{family}.py:tiny", []))
    lowered, _ = aot.lower(config, jax.devices()[:1])
    digest = hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]
    assert digest == TRACES_BEFORE_PARTS[family], f"{family}'s train step traces differently"


def test_a_run_with_a_prelude_and_coda_trains_and_is_evaluated(tmp_path):
    """Trained by `loopscale train` (sharded over the test's 8 devices) and measured: held-out
    loss at every exit, early exit with the prelude and coda in each exit's layer uses, the
    JSD at every core depth, and routing on the core's layers numbered after the prelude's."""
    run = tmp_path / "run"
    assert main(["train", "--config=experiments/looped_moe.py:tiny", f"--workdir={run}",
                 "--config.model.n_prelude=1", "--config.model.n_coda=2",
                 "--config.model.moe_dispatch=capacity",
                 "--config.train.steps=3", "--config.train.eval_every=0"]) == 0
    assert main(["eval", f"--workdir={run}", "--what=ppl,early_exit,jsd,routing",
                 "--batches=2"]) == 0
    ppl, exits, jsd, routing = (json.loads((run / "eval" / f"{m}.json").read_text())
                                for m in ("ppl", "early_exit", "jsd", "routing"))
    assert len(ppl["loss_per_exit"]) == 2 and 3.0 < ppl["loss"] < 7.0
    assert exits["candidate_uses"] == [1 + 2 + 2, 1 + 4 + 2]  # prelude + t x core + coda
    assert len(jsd["depth_mean"]) == 2 * 2  # the core's loops x layers
    assert routing["layers"] == [2, 3] and routing["n_prelude"] == 1
    assert len(routing["identical"]) == 2
    parts = routing["parts"]  # one pass each: each layer's share of assignments per expert
    assert parts["prelude"]["layers"] == [1] and parts["coda"]["layers"] == [4, 5]
    for part in parts.values():
        load = np.asarray(part["load"])
        assert load.shape == (len(part["layers"]), 8) and np.allclose(load.sum(-1), 1.0)


def test_every_core_layer_is_read_out_through_the_coda(parts):
    """`through_coda` is what an exit reads: on the loop boundaries it gives `exit_hidden` of
    all exits, so the last layer of the last loop read out is the model's logits; the lens
    decodes each layer's stream this way and the JSD's depths are the exits' distributions
    (one layer per loop: every depth is a loop boundary, JSD against the last exit)."""
    from loopscale.evaluate import divergence, ladder
    from loopscale.train.step import readout_fn

    cfg, params = parts
    cfg = dataclasses.replace(cfg, n_unique=1)
    params = init_params(cfg, TOKENS, jit=True)
    model = LoopedLM(cfg, collect_layers=True)
    out = model.apply({"params": params}, TOKENS, exit_logits=True, all_exits=True)
    decoded = model.apply({"params": params}, out.layer_hidden, method=LoopedLM.through_coda)
    np.testing.assert_allclose(decoded[:, -1], out.exit_hidden, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(readout_fn(model, params)(decoded[-1, -1]), out.logits,
                               rtol=1e-5, atol=1e-5)
    pos = jnp.array([3, 7])  # the lens's answer positions, one per row
    np.testing.assert_allclose(
        ladder.answer_stream(params, TOKENS, pos, LoopedLM(cfg), cfg.n_loops, through_coda=True),
        decoded[:, :, jnp.arange(2), pos], rtol=1e-5, atol=1e-5)
    batch = {"inputs": TOKENS, "targets": TOKENS, "mask": jnp.ones(TOKENS.shape, bool)}
    train = parse(load_config("experiments/looped.py:tiny", [])).train
    sums = divergence.jsd_step(params, batch, model=LoopedLM(cfg), train=train,
                               n_loops=cfg.n_loops)
    logp = jax.nn.log_softmax(out.exit_logits, -1)
    want = [float(jnp.sum(divergence._js_bits(logp[k], logp[-1])))
            for k in range(cfg.n_loops - 1)]
    # atol: a JSD of a few 1e-6 bits is at float32's resolution of the log-probabilities it
    # subtracts (one machine measured 3.45e-6 against 3.43e-6 here).
    np.testing.assert_allclose(sums["js_sum"], want, rtol=1e-4, atol=1e-7)
