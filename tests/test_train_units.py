"""The trainer's pieces one at a time (issue #3): optimiser recipes (clipping, weight decay and
its mask, Muon), gradient accumulation, per-loop gradient norms, variable-loop training,
intermediate supervision, the diagnostics' rules, and the run directory's files.
The schedules have their own file (test_schedules.py)."""

import dataclasses
import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import trainkit
from etils import epath
from helpers import tiny_model_config, tokens

from loopscale.config import load_config, parse
from loopscale.data import permutation
from loopscale.flops import flops_per_token
from loopscale.model import LoopedLM
from loopscale.train import diagnostics, sharded_state
from loopscale.train.optimizer import build_optimizer, scheduled_update
from loopscale.files import write_json
from loopscale.rundir.run import RunDirectory
from loopscale.train.step import (
    TrainState,
    gradients,
    loop_grad_norms,
    loop_supervision_loss,
    loss_fn,
    train_step,
)
from loopscale.train.trainer import _loops_for_step, _lr_factors, train


def train_config(*model_overrides, **fields):
    """A TrainConfig from the base tiny experiment with `--config.train.KEY=VALUE` overrides
    (and `--config.model...` ones, for what parse checks against the model)."""
    return parse(load_config("experiments/base.py:tiny", [
        *model_overrides, *(f"--config.train.{k}={v}" for k, v in fields.items())])).train


def leaf(tree, *path):
    for key in path:
        tree = tree[key]
    return np.asarray(tree)


def tree_allclose(a, b, **tol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol), a, b)


def find_adam_states(state):
    def is_adam(x):
        return isinstance(x, optax.ScaleByAdamState)

    return [s for s in jax.tree.leaves(state, is_leaf=is_adam) if is_adam(s)]


# --- Optimiser recipes, on parameter trees shaped like a real model's (no forward pass). ---

# muP at width 1/2 of the base: hidden LR factor 1/w = 2, readout and router factor 1, so
# where muP multiplies a term, it shows. MoE (a router) and norm gains: every role is present.
OPT_MODEL = tiny_model_config(param="mup", base_d_model=64, norm_gain=True, ffn="moe",
                              n_experts=4, top_k=2)
ROLE_PATHS = {  # one parameter of every role
    "embedding": ("embedding",),
    "readout": ("unembed",),
    "hidden": ("loop", "stack", "layers", "attn", "wq"),
    "hidden_expert": ("loop", "stack", "layers", "moe", "w_up"),
    "router": ("loop", "stack", "layers", "moe", "router"),
    "norm": ("final_norm", "scale"),
    "layer_norm": ("loop", "stack", "layers", "attn_norm", "scale"),
}


def _random_tree(shapes, seed, scale=1.0):
    leaves, treedef = jax.tree.flatten(shapes)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return treedef.unflatten([scale * jax.random.normal(k, s.shape) for k, s in zip(keys, leaves)])


@pytest.fixture(scope="module")
def opt_params():
    def init():
        return LoopedLM(OPT_MODEL).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))

    shapes = nn.unbox(jax.eval_shape(init)["params"])
    params = _random_tree(shapes, 0)
    for path in ROLE_PATHS.values():  # every role really is in the tree
        leaf(params, *path)
    return params, shapes


def one_step(train, params, grads_list):
    tx, lr_factor = build_optimizer(train, OPT_MODEL)
    state, out = tx.init(params), []
    for i, grads in enumerate(grads_list):
        updates, state = scheduled_update(tx, grads, state, params, lr_factor(i))
        out.append(updates)
    return out, state


def test_clipping_happens_before_adam(opt_params):
    """Adam's first step is scale-free, so clipping shows in its state and in the second step:
    clipped optimiser fed (huge G, small g) == unclipped optimiser fed (G scaled to norm c, g)."""
    params, shapes = opt_params
    c = 0.5
    big = _random_tree(shapes, 1)
    big = jax.tree.map(lambda g: g * (100.0 / optax.tree.norm(big)), big)  # norm 100
    small = _random_tree(shapes, 2, scale=1e-3)
    assert float(optax.tree.norm(small)) < c
    common = dict(optimizer="adamw", weight_decay=0.0, schedule="constant", warmup_steps=0, lr=0.01)
    clipped, state = one_step(train_config(grad_clip=c, **common), params, [big, small])
    by_hand = jax.tree.map(lambda g: g * (c / 100.0), big)
    reference, _ = one_step(train_config(grad_clip=0.0, **common), params, [by_hand, small])
    tree_allclose(clipped, reference, rtol=1e-4, atol=1e-7)
    # Adam's first moment holds the clipped gradient: b1 (1 - b1) clip(G) + (1 - b1) g.
    (adam,) = find_adam_states(state)
    b1 = train_config(**common).b1
    mu = jax.tree.map(lambda a, b: b1 * (1 - b1) * a + (1 - b1) * b, by_hand, small)
    tree_allclose(adam.mu, mu, rtol=1e-5, atol=1e-9)
    # The test can fail: without clipping, step 2 sees Adam's state of the huge gradient.
    unclipped, _ = one_step(train_config(grad_clip=0.0, **common), params, [big, small])
    hidden = ROLE_PATHS["hidden"]
    assert not np.allclose(leaf(unclipped[1], *hidden), leaf(clipped[1], *hidden), rtol=1e-3)


@pytest.mark.parametrize("lr", [0.5, 2.0])
def test_coupled_weight_decay(opt_params, lr):
    """Zero gradients: Adam's direction is 0, so the step is the decay alone: p1 = p - lr * wd * p
    for every decayed role whatever its muP LR factor (hidden: 2 here), as microsoft/mup's
    MuAdamW keeps lr x wd at the base width's (its weight_decay times what the LR is divided
    by); embedding and norm gains kept."""
    params, shapes = opt_params
    wd = 0.01
    train = train_config(weight_decay=wd, weight_decay_mode="coupled", schedule="constant",
                         warmup_steps=0, lr=lr, grad_clip=0.0)
    (updates,), _ = one_step(train, params, [jax.tree.map(jnp.zeros_like, params)])
    new = optax.apply_updates(params, updates)
    decayed = {"hidden", "hidden_expert", "readout", "router"}
    for role, path in ROLE_PATHS.items():  # embedding and norm gains: no decay at all
        want = leaf(params, *path) * (1 - lr * wd * (role in decayed))
        np.testing.assert_allclose(leaf(new, *path), want, rtol=1e-6, err_msg=role)


@pytest.mark.parametrize("lr", [0.5, 2.0])
def test_independent_weight_decay(opt_params, lr):
    """p -= wd * (lr_t / peak) * p: follows the schedule's shape (warmup of 4 steps: factors 0,
    1/4, 1/2) but not its peak and not the muP factor; embedding and norm gains never decay."""
    params, shapes = opt_params
    wd = 0.1
    train = train_config(weight_decay=wd, weight_decay_mode="independent", schedule="constant",
                         warmup_steps=4, lr=lr, grad_clip=0.0)
    zeros = jax.tree.map(jnp.zeros_like, params)
    tx, lr_factor = build_optimizer(train, OPT_MODEL)
    state, p = tx.init(params), params
    for i in range(3):  # the parameters move, so each step decays the new ones
        updates, state = scheduled_update(tx, zeros, state, p, lr_factor(i))
        p = optax.apply_updates(p, updates)
    factor = (1 - wd * 0.0) * (1 - wd * 0.25) * (1 - wd * 0.5)
    for role, path in ROLE_PATHS.items():
        decayed = role not in ("embedding", "norm", "layer_norm")
        want = leaf(params, *path) * (factor if decayed else 1.0)
        np.testing.assert_allclose(leaf(p, *path), want, rtol=1e-6, err_msg=role)


def test_muon_recipe(opt_params):
    """Muon orthogonalises each block matrix (per layer, per expert); embedding, head, norm
    gains and router take AdamW at their own LRs (Adam's first step is lr * sign(g))."""
    params, shapes = opt_params
    lr, embed_lr, head_lr = 0.02, 0.2, 0.004
    train = train_config("--config.model.param=sp", optimizer="muon", lr=lr, embed_lr=embed_lr,
                         head_lr=head_lr, weight_decay=0.0, schedule="constant", warmup_steps=0,
                         grad_clip=0.0)
    grads = _random_tree(shapes, 3)
    # Block matrices get gradients of a known spread of singular values (1 down to 1/20);
    # Muon must return them nearly orthogonal. Paths and (fan_in, fan_out) reshapes:
    D, (L, _, H, K) = OPT_MODEL.d_model, leaf(grads, *ROLE_PATHS["hidden"]).shape
    E, F = OPT_MODEL.n_experts, leaf(grads, *ROLE_PATHS["hidden_expert"]).shape[-1]
    layers = ("loop", "stack", "layers")
    matrices = {"wq": (layers + ("attn", "wq"), (L, D, H * K)),
                "wo": (layers + ("attn", "wo"), (L, H * K, D)),
                "w_up": (layers + ("moe", "w_up"), (L * E, D, F)),
                "w_down": (layers + ("moe", "w_down"), (L * E, F, D))}
    rng = np.random.default_rng(0)
    for path, (n, fan_in, fan_out) in matrices.values():
        r = min(fan_in, fan_out)
        u = np.linalg.qr(rng.normal(size=(n, fan_in, r)))[0]
        v = np.linalg.qr(rng.normal(size=(n, fan_out, r)))[0]
        g = np.einsum("nir,r,nor->nio", u, np.logspace(0, -np.log10(20), r), v)
        parent = grads
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = jnp.asarray(g.reshape(parent[path[-1]].shape), jnp.float32)
    (u,), _ = one_step(train, params, [grads])
    for role, want in [("embedding", embed_lr), ("readout", head_lr), ("norm", lr),
                       ("layer_norm", lr), ("router", lr)]:
        update, grad = leaf(u, *ROLE_PATHS[role]), leaf(grads, *ROLE_PATHS[role])
        np.testing.assert_allclose(np.abs(update), want, rtol=1e-3, err_msg=role)
        assert np.all(np.sign(update) == -np.sign(grad)), role
    for name, (path, (n, fan_in, fan_out)) in matrices.items():
        g_sv = np.linalg.svd(leaf(grads, *path).reshape(n, fan_in, fan_out), compute_uv=False)
        assert np.allclose(g_sv.max(axis=-1) / g_sv.min(axis=-1), 20, rtol=1e-3)
        width = math.sqrt(max(1.0, fan_out / fan_in))  # optax muon's shape factor
        sv = np.linalg.svd(leaf(u, *path).reshape(n, fan_in, fan_out), compute_uv=False)
        sv = sv / (lr * width)
        # Newton-Schulz (5 quintic steps) leaves every singular value in about [0.7, 1.2].
        assert sv.min() > 0.6 and sv.max() < 1.3, (name, sv.min(), sv.max())
        assert np.all(sv.max(axis=-1) / sv.min(axis=-1) < 2.0), name
    # Every other block matrix (wk, wv, w_gate) is also Muon's: at most lr * width per direction.
    for name in ("wk", "wv"):
        sv = np.linalg.svd(leaf(u, *layers, "attn", name).reshape(L, D, H * K), compute_uv=False)
        assert sv.max() / lr < 1.3, name


# --- Steps of a real tiny model: one fixture, each function compiled once. ---

B, T = 4, 8


@pytest.fixture(scope="module")
def tiny():
    cfg = tiny_model_config(norm_gain=True)  # vocab 32, d 32, 2 unique layers x 3 loops
    model = LoopedLM(cfg)
    params = nn.unbox(jax.jit(lambda: model.init(jax.random.PRNGKey(0), tokens(B, T)))()["params"])
    mask = np.ones((B, T), bool)
    batch = {"inputs": tokens(B, T), "targets": tokens(B, T, seed=2), "mask": jnp.asarray(mask)}
    train = train_config(grad_accum=1)
    grad_fn = jax.jit(functools.partial(gradients, model=model, train=train, n_loops=cfg.n_loops))
    loss, aux, grads = grad_fn(params, batch)
    # The same gradients in two micro-batches, compiled (on first use) once for both tests
    # that read them: each jax.jit of a new partial traces and compiles again.
    accum2_fn = jax.jit(functools.partial(gradients, model=model, n_loops=cfg.n_loops,
                                          train=dataclasses.replace(train, grad_accum=2)))

    @functools.cache
    def step_fn(train):
        """(tx, lr_factor, jitted train step) of `train` on this model, built and compiled once
        for every test that steps with that train config (a new jax.jit compiles again)."""
        tx, lr_factor = build_optimizer(train, cfg)
        return tx, lr_factor, jax.jit(functools.partial(train_step, model=model, tx=tx,
                                                        train=train, n_loops=cfg.n_loops))

    return dict(cfg=cfg, model=model, params=params, batch=batch, train=train, loss=loss, aux=aux,
                grads=grads, grad_fn=grad_fn, accum2_fn=accum2_fn, step_fn=step_fn)


# The clip of the two tests that step the fixture's model through the train step (one
# compiled step for both, tiny["step_fn"]): far under the fixture's gradient norm (about 1.6),
# so the clip is active.
CLIP = 1e-4


def test_grad_accumulation_matches_one_batch(tiny):
    loss, aux, grads = tiny["accum2_fn"](tiny["params"], tiny["batch"])
    assert float(loss) == pytest.approx(float(tiny["loss"]), rel=1e-6)
    tree_allclose(grads, tiny["grads"], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(aux["residual_norm"], tiny["aux"]["residual_norm"], rtol=1e-5)
    assert float(optax.tree.norm(tiny["grads"])) > 0


def test_grad_accumulation_weights_micro_batches_by_their_tokens(tiny):
    """Micro-batches with different numbers of supervised tokens still add up to the whole
    batch's token mean (micro-batch 1 = rows 1 and 3, which lose most of their mask here)."""
    mask = np.ones((B, T), bool)
    mask[1, 1:] = False
    mask[3, 2:] = False
    batch = {**tiny["batch"], "mask": jnp.asarray(mask)}
    assert tiny["train"].grad_accum == 1  # so grad_fn is the one-batch gradient
    fns = {1: tiny["grad_fn"], 2: tiny["accum2_fn"]}
    (loss1, _, grads1), (loss2, _, grads2) = (fns[k](tiny["params"], batch) for k in (1, 2))
    assert float(loss2) == pytest.approx(float(loss1), rel=1e-6)
    tree_allclose(grads2, grads1, rtol=1e-4, atol=1e-7)


def test_train_step_reports_the_gradient_norm_before_clipping(tiny):
    c = CLIP
    # (Weight decay at the fixture's default: no assertion here reads the parameters' update,
    # and so this step is the one test_grad_cosine_... compiles for its untracked run.)
    train = dataclasses.replace(tiny["train"], grad_clip=c)
    tx, _, step = tiny["step_fn"](train)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=tiny["params"],
                       opt_state=tx.init(tiny["params"]))
    new, metrics = step(state, tiny["batch"], jnp.float32(1.0))
    norm = float(optax.tree.norm(tiny["grads"]))
    assert norm > 100 * c
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=1e-5)
    assert float(metrics["loss"]) == pytest.approx(float(tiny["loss"]), rel=1e-6)
    assert int(new.step) == 1
    (adam,) = find_adam_states(new.opt_state)  # Adam saw the clipped gradient
    assert float(optax.tree.norm(adam.mu)) == pytest.approx((1 - train.b1) * c, rel=1e-4)
    assert float(metrics["grad_norm_embedding"]) == pytest.approx(
        float(optax.tree.norm(tiny["grads"]["embedding"])), rel=1e-5)
    assert np.asarray(metrics["grad_norm_block"]).shape == (tiny["cfg"].n_unique,)
    np.testing.assert_allclose(
        np.sum(np.square(metrics["grad_norm_block"])),
        float(optax.tree.norm(tiny["grads"]["loop"])) ** 2, rtol=1e-4)


def test_the_compiled_step_does_not_depend_on_the_schedule(tiny):
    """The schedule enters as the lr_factor argument, so runs of one model at different
    budgets (steps, warmup) lower to the same program and share a compilation."""
    texts = []
    for steps, warmup in ((50, 5), (400, 40)):
        train = dataclasses.replace(tiny["train"], steps=steps, warmup_steps=warmup)
        tx, _ = build_optimizer(train, tiny["cfg"])
        state = TrainState(step=jnp.zeros((), jnp.int32), params=tiny["params"],
                           opt_state=tx.init(tiny["params"]))
        step = jax.jit(functools.partial(train_step, model=tiny["model"], tx=tx, train=train,
                                         n_loops=tiny["cfg"].n_loops))
        texts.append(step.lower(state, tiny["batch"], jnp.float32(0.5)).as_text())
    assert texts[0] == texts[1]


def test_per_loop_gradients_sum_to_the_shared_gradient(tiny):
    model, params, batch, train = tiny["model"], tiny["params"], tiny["batch"], tiny["train"]
    K = tiny["cfg"].n_loops
    per_loop = model.clone(per_loop_params=True)
    tiled = {**params, "loop": jax.tree.map(lambda p: jnp.broadcast_to(p, (K, *p.shape)),
                                            params["loop"])}

    @jax.jit
    def per_loop_grads(tiled):
        return jax.grad(lambda p: loss_fn(p, batch, per_loop, train, K)[0])(tiled)["loop"]

    grads = per_loop_grads(tiled)
    summed = jax.tree.map(lambda g: jnp.sum(g, axis=0), grads)
    tree_allclose(summed, tiny["grads"]["loop"], atol=1e-5, rtol=1e-4)
    norms_fn = jax.jit(functools.partial(loop_grad_norms, model=model, train=train, n_loops=K))
    norms = np.asarray(norms_fn(params, batch))
    assert norms.shape == (K,)
    want = np.sqrt(sum(np.sum(np.square(np.asarray(g)), axis=tuple(range(1, g.ndim)))
                       for g in jax.tree.leaves(grads)))
    np.testing.assert_allclose(norms, want, rtol=1e-5)
    assert np.all(norms > 0)
    # Loop shares are not the shared gradient split evenly: the norms see each loop apart.
    assert np.sum(norms) > float(optax.tree.norm(tiny["grads"]["loop"])) * (1 + 1e-3)


def _ce(logits_V, label):
    z = np.asarray(logits_V, np.float64)
    return float(np.log(np.sum(np.exp(z - z.max()))) + z.max() - z[label])


def test_loop_supervision_loss_by_hand():
    K, Bh, Th, V = 4, 3, 5, 7
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(K, Bh, Th, V)).astype(np.float32)
    labels = rng.integers(0, V, size=(Bh, K)).astype(np.int32)
    pos = np.array([4, 1, 3], np.int32)
    identity = lambda h: h  # noqa: E731  (the "hidden states" are the logits here)
    got = float(loop_supervision_loss(identity, jnp.asarray(logits),
                                      {"loop_labels": labels, "answer_pos": pos}))
    want = np.mean([_ce(logits[j, b, pos[b]], labels[b, j])
                    for j in range(K - 1) for b in range(Bh)])
    assert got == pytest.approx(want, rel=1e-5)
    # One loop: the last boundary is the main loss's, so nothing is added.
    one = loop_supervision_loss(identity, jnp.asarray(logits[:1]),
                                {"loop_labels": labels[:, :1], "answer_pos": pos})
    assert float(one) == 0.0


def test_intermediate_supervision_is_added_to_the_loss(tiny):
    model, params, K = tiny["model"], tiny["params"], tiny["cfg"].n_loops
    pos = np.array([7, 3, 5, 6], np.int32)
    labels = np.asarray(tokens(B, K, seed=5), np.int32)
    mask = np.zeros((B, T), bool)
    mask[np.arange(B), pos] = True
    batch = {**tiny["batch"], "mask": jnp.asarray(mask), "loop_labels": labels, "answer_pos": pos}
    train = dataclasses.replace(tiny["train"], intermediate_supervision=True)

    @jax.jit
    def run(params, batch):
        total, aux = loss_fn(params, batch, model, train, K)
        out = model.apply({"params": params}, batch["inputs"], n_loops=K, exit_logits=True)
        return total, aux, out.exit_logits

    total, aux, exits = run(params, batch)
    want = np.mean([_ce(exits[j, b, pos[b]], labels[b, j]) for j in range(K - 1) for b in range(B)])
    assert float(aux["loop_supervision_loss"]) == pytest.approx(want, rel=1e-5)
    assert float(total) == pytest.approx(float(aux["ce"]) + want, rel=1e-5)
    main = np.mean([_ce(exits[K - 1, b, pos[b]], batch["targets"][b, pos[b]]) for b in range(B)])
    assert float(aux["ce"]) == pytest.approx(main, rel=1e-5)


# --- Through the trainer: variable loop counts and intermediate supervision. ---

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    return trainkit.write_corpus(str(root / "text")), str(root / "cache")


metric_rows = trainkit.metric_rows


ONE = jax.devices()[:1]  # one device: the cheapest compile on a shared CPU
SMALL = {"train.steps": 8, "train.batch_size": 4, "train.seq_len": 16, "train.eval_every": 0,
         "train.checkpoint_every": 0, "train.eval_batches": 1, "model.d_model": 32,
         "model.head_dim": 16, "model.base_d_model": 32, "model.n_unique": 1,
         "train.peak_flops": 1e12}


def test_variable_loop_training(corpus, tmp_path):
    # Seed 6 draws [2, 1, 2, 1, 1, 2]: two loop counts, one of them a single loop, and one
    # compiled step for both (loop_schedule.shared_frozen_slots: room for 3 - 1 frozen loops).
    # Truncated backpropagation through the last loop: 2-loop steps run their first forward only.
    cfg = trainkit.config("looped", *corpus, **{**SMALL, "train.loop_choices": "(1,2,3)", "seed": 6,
                                                "train.loop_dist": "uniform",
                                                "train.bptt_loops": 1, "train.steps": 6})
    assert train(cfg, str(tmp_path / "a"), devices=ONE) == 0
    rows = [r for r in metric_rows(tmp_path / "a") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 7))
    loops = [r["n_loops"] for r in rows]
    assert set(loops) <= {1, 2, 3} and len(set(loops)) > 1, loops
    for r in rows:
        assert len(r["residual_norm"]) == r["n_loops"]
        assert math.isfinite(r["loss"])
    # Each step's FLOPs are the analytic count at the loop count it ran (embedding and
    # unembedding once, the looped block once per loop, a frozen loop forward only).
    flops = np.diff([0.0] + [r["flops"] for r in rows])
    tokens = cfg.train.batch_size * cfg.train.seq_len
    per_step = {k: flops_per_token(dataclasses.replace(cfg.model, n_loops=k), cfg.train.seq_len,
                                   cfg.flop_convention) for k in (1, 2)}
    frozen_loop = (per_step[2] - per_step[1]) * 2 / 3
    want = [tokens * (per_step[k] - (frozen_loop if k == 2 else 0.0)) for k in loops]
    np.testing.assert_allclose(flops, want, rtol=1e-9)
    assert flops[loops.index(2)] > flops[loops.index(1)]
    # Deterministic: the logged counts are a pure function of (seed, step), so a second run (or
    # a resumed one) draws the same; a new seed draws others. (A second full run would only
    # repeat the compiles: the trainer holds no other source of randomness for this choice.)
    assert loops == [_loops_for_step(cfg, s) for s in range(6)] == [2, 1, 2, 1, 1, 2]
    assert set(sharded_state.setup(cfg, ONE).compiled["train"]) == {("shared", 2)}
    reseeded = dataclasses.replace(cfg, seed=cfg.seed + 1)
    assert [_loops_for_step(reseeded, s) for s in range(32)] != \
        [_loops_for_step(cfg, s) for s in range(32)]
    # The final evaluation runs at the model's configured loop count.
    final = [r for r in metric_rows(tmp_path / "a") if "eval_loss_per_loop" in r][-1]
    assert len(final["eval_loss_per_loop"]) == cfg.model.n_loops


def supervised_permutation(steps: int, *extra: str):
    """A few steps of the tiny permutation task with intermediate supervision."""
    overrides = ["--config.train.intermediate_supervision=true", f"--config.train.steps={steps}",
                 "--config.train.batch_size=4", "--config.train.eval_every=0",
                 "--config.train.checkpoint_every=0", "--config.train.eval_batches=1",
                 "--config.train.warmup_steps=1", "--config.train.peak_flops=1e12",
                 "--config.model.d_model=32", *extra]
    return parse(load_config("experiments/permutation.py:tiny", overrides))


def test_intermediate_supervision_trains_on_the_permutation_task(tmp_path):
    cfg = supervised_permutation(3, "--config.model.n_unique=1", "--config.model.n_loops=3")
    assert train(cfg, str(tmp_path / "run"), devices=ONE) == 0
    rows = [r for r in metric_rows(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert math.isfinite(r["loop_supervision_loss"]) and r["loop_supervision_loss"] > 0
        assert r["loss"] == pytest.approx(r["ce"] + r["loop_supervision_loss"], rel=1e-5)


def test_unshared_model_is_supervised_at_layer_boundaries(tmp_path):
    """One loop of 4 layers on 4 hops: the boundaries after layers 1, 2, 3 carry hops 1, 2, 3."""
    cfg = supervised_permutation(2, "--config.model.n_unique=4", "--config.model.n_loops=1",
                                 "--config.data.hops_min=4", "--config.data.hops_max=4")
    assert train(cfg, str(tmp_path / "run"), devices=ONE) == 0
    rows = [r for r in metric_rows(tmp_path / "run") if "loss" in r]
    for r in rows:
        assert r["layer_supervision_loss"] > 0 and "loop_supervision_loss" not in r
        assert r["loss"] == pytest.approx(r["ce"] + r["layer_supervision_loss"], rel=1e-5)


def test_layer_labels_space_the_hops_over_the_depth():
    batch = {"hop_labels": np.array([[5, 6, 7, 8, 9, 10, 11, 12], [3, 4, 0, 0, 0, 0, 0, 0]]),
             "hops": np.array([8, 2])}
    labels, mask = permutation.layer_labels(batch, 32)
    assert labels.shape == mask.shape == (2, 31)
    assert list(np.nonzero(mask[0])[0] + 1) == [4, 8, 12, 16, 20, 24, 28]
    assert list(labels[0][mask[0]]) == [5, 6, 7, 8, 9, 10, 11]
    assert list(np.nonzero(mask[1])[0] + 1) == [16] and list(labels[1][mask[1]]) == [3]


def test_loop_labels_feed_the_supervision():
    """The trainer builds `loop_labels` from the batch (data/permutation.py)."""
    task = permutation.PermutationTask(8, 2, 4, seed=0, split="train",
                                       length=permutation.seq_len(8))
    examples = [task(i) for i in range(6)]
    batch = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
    labels = permutation.loop_labels(batch, 3)
    assert labels.shape == (6, 3)
    for b, e in enumerate(examples):
        walk = e["hop_labels"][: e["hops"]]
        assert labels[b, 0] == walk[0] and labels[b, 1] == walk[min(2, e["hops"]) - 1]
        assert labels[b, 2] == e["answer"] == batch["targets"][b, e["answer_pos"]]


# --- Diagnostics on the host. ---

def test_routing_overlap_shares():
    # (K=2, L=1, B=1, T=4, k=2): identical (order aside), partial, disjoint, identical.
    first = [[0, 1], [0, 1], [0, 1], [2, 3]]
    second = [[1, 0], [1, 2], [2, 3], [2, 3]]
    experts = jnp.asarray(np.array([first, second])[:, None, None])
    out = {k: float(v) for k, v in diagnostics.routing_overlap(experts).items()}
    assert out == pytest.approx({"route_identical": 0.5, "route_partial": 0.25,
                                 "route_disjoint": 0.25})
    # Three passes: averaged over the two consecutive pairs; pair (2, 3) is all identical.
    three = jnp.asarray(np.array([first, second, second])[:, None, None])
    out = {k: float(v) for k, v in diagnostics.routing_overlap(three).items()}
    assert out == pytest.approx({"route_identical": 0.75, "route_partial": 0.125,
                                 "route_disjoint": 0.125})


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_divergence_on_non_finite_loss(bad):
    rule = diagnostics.DivergenceRule()
    assert rule.check(3.0) is None
    reason = rule.check(bad)
    assert reason and str(bad) in reason


def test_divergence_needs_patience_strikes():
    rule = diagnostics.DivergenceRule(margin=2.0, patience=5)
    for _ in range(10):
        assert rule.check(3.0) is None
    results = []
    for _ in range(40):  # a sustained blow-up
        results.append(rule.check(10.0))
        if results[-1]:
            break
    assert results[-1] is not None and "5 steps" in results[-1]
    # The EMA first clears best + margin at 10 - 7 * 0.9^n > 5, n = 4; then 5 strikes.
    assert len(results) == 4 + 5 - 1
    assert rule.strikes == 5


def test_divergence_rule_resumes_from_its_saved_state():
    """What a checkpoint keeps of the rule (state(), through JSON) resumes it mid-way: a rule
    cut two strikes into a blow-up and resumed stops at the step the uncut one does; a rule
    saved before any step (best still infinite) resumes as new."""
    losses = [3.0] * 10 + [10.0] * 30
    whole = diagnostics.DivergenceRule(margin=2.0, patience=5)
    stop = next(i for i, x in enumerate(losses) if whole.check(x))
    cut = diagnostics.DivergenceRule(margin=2.0, patience=5)
    assert not any(cut.check(x) for x in losses[:15])
    resumed = diagnostics.DivergenceRule(margin=2.0, patience=5)
    resumed.resume(json.loads(json.dumps(cut.state())))
    assert resumed.strikes == cut.strikes > 0
    assert next(15 + i for i, x in enumerate(losses[15:]) if resumed.check(x)) == stop
    fresh = diagnostics.DivergenceRule()
    fresh.resume(json.loads(json.dumps(diagnostics.DivergenceRule().state())))
    assert fresh == diagnostics.DivergenceRule()


def test_divergence_ignores_a_single_spike():
    rule = diagnostics.DivergenceRule()  # margin 2, patience 20
    losses = [3.0] * 10 + [50.0] + [3.0] * 60
    assert all(rule.check(x) is None for x in losses)
    assert rule.strikes == 0


def test_divergence_counts_consecutive_strikes_only():
    """Two spikes, each over the margin for 4 steps: 8 strikes in all, never 5 in a row."""
    rule = diagnostics.DivergenceRule(margin=2.0, patience=5)
    for spike in range(2):
        for _ in range(80):  # long enough for the EMA to settle back on 1
            assert rule.check(1.0) is None
        assert rule.strikes == 0
        assert rule.check(30.0) is None  # EMA about 3.9 > 1 + 2
        struck = [rule.strikes]
        while rule.strikes:
            assert rule.check(1.0) is None
            struck.append(rule.strikes)
        assert struck == [1, 2, 3, 4, 0], spike


def test_divergence_over_the_ceiling_stops_at_once():
    rule = diagnostics.DivergenceRule(ceiling=diagnostics.DivergenceRule.ceiling_for(256))
    assert rule.ceiling == pytest.approx(10 * math.log(256))
    assert rule.check(5.5) is None
    assert rule.check(50.0) is None  # a spike under 55.45 nats: the patience rule's business
    reason = rule.check(5e5)
    assert reason and "ceiling" in reason


def test_divergence_at_the_end_of_a_short_run():
    """Rule (d): a run that ends with its smoothed loss more than `margin` over its first loss
    diverged, however short; one that learns, or spiked and recovered, did not."""
    worse = diagnostics.DivergenceRule()
    for loss in [5.5, 9.0, 12.0, 15.0, 15.0, 15.0]:  # 5 steps: never 20 strikes
        assert worse.check(loss) is None
    assert "first loss 5.500" in worse.check_end()
    learns = diagnostics.DivergenceRule()
    for loss in [5.5, 5.0, 4.0, 3.5, 3.0]:
        assert learns.check(loss) is None
    assert learns.check_end() is None
    recovered = diagnostics.DivergenceRule()
    for loss in [5.5, 5.0, 30.0] + [3.0] * 30:
        assert recovered.check(loss) is None
    assert recovered.check_end() is None
    assert diagnostics.DivergenceRule().check_end() is None  # no step at all


def _history(plateau, residual_growth, steps=300):
    steps_ = list(range(1, steps + 1))
    rng = np.random.default_rng(0)
    losses = [plateau + 0.01 * rng.standard_normal() if s >= 100 else 5.0 - s / 50 for s in steps_]
    ramp = [max(0, s - 100) / max(1, steps - 100) for s in steps_]  # 0 until step 100, then 1
    residual = [100.0 * (1 + (residual_growth - 1) * r) for r in ramp]
    return steps_, losses, residual


def test_collapse_rule():
    H = 3.06
    assert diagnostics.collapsed(*_history(H, 4.0), unigram_entropy=H)
    assert not diagnostics.collapsed(*_history(H - 0.5, 4.0), unigram_entropy=H)  # it learns
    assert not diagnostics.collapsed(*_history(H, 1.0), unigram_entropy=H)  # residual flat
    assert not diagnostics.collapsed(*_history(H, 1.4), unigram_entropy=H)  # under 1.5x
    assert not diagnostics.collapsed(*_history(H, 4.0, steps=100), unigram_entropy=H)  # too early
    # Only the last 50 logged steps count: a plateau that the model then leaves is no collapse.
    steps, losses, residual = _history(H, 4.0)
    losses[-50:] = [1.0] * 50
    assert not diagnostics.collapsed(steps, losses, residual, unigram_entropy=H)


def test_the_trainer_rules_read_the_cross_entropy():
    """The rows the trainer logs carry the total objective (`loss`) and the LM cross-entropy
    (`ce`); collapse and divergence are stated on the cross-entropy. A run on the unigram
    plateau whose total sits 0.3 nats higher (auxiliary terms) collapsed; one whose total sits
    on the plateau while its cross-entropy learns did not."""
    H = 3.06
    steps, ces, residual = _history(H, 4.0)
    rows = [{"step": s, "ce": c, "loss": c + 0.3, "residual_norm": [50.0, r]}
            for s, c, r in zip(steps, ces, residual)]
    assert diagnostics.collapsed_run(rows, unigram_entropy=H)
    assert not diagnostics.collapsed([r["step"] for r in rows], [r["loss"] for r in rows],
                                     [r["residual_norm"][-1] for r in rows], H)
    learning = [dict(r, ce=r["ce"] - 0.3, loss=r["ce"]) for r in rows]
    assert not diagnostics.collapsed_run(learning, unigram_entropy=H)
    # Eight supervised loops of a 27-token task: a total of 8 CEs is over 10 ln 27 at the start
    # while the cross-entropy is not; a NaN in the total still stops the run.
    rule = diagnostics.DivergenceRule(ceiling=diagnostics.DivergenceRule.ceiling_for(27))
    assert rule.check(diagnostics.watched_loss({"ce": 4.2, "loss": 8 * 4.2})) is None
    assert 8 * 4.2 > rule.ceiling
    nan = diagnostics.watched_loss({"ce": 3.0, "loss": float("nan")})
    assert "nan" in rule.check(nan)


def test_unigram_entropy_by_hand():
    u = diagnostics.UnigramEntropy(vocab_size=5)
    assert u.value() == 0.0
    u.update(np.array([[0, 0, 1, 2]]), np.array([[1, 1, 1, 0]]))  # 2 is masked off
    p = np.array([2, 1]) / 3
    assert u.value() == pytest.approx(float(-(p * np.log(p)).sum()))
    u.update(np.array([[3, 3, 3, 4]]), np.ones((1, 4), bool))
    p = np.array([2, 1, 3, 1]) / 7
    assert u.value() == pytest.approx(float(-(p * np.log(p)).sum()))


def test_gradient_oscillation_window():
    osc = diagnostics.GradientOscillation(window=3)
    assert osc.update(2.0) == {"grad_norm_std": 0.0, "grad_norm_cv": 0.0}
    osc.update(4.0)
    out = osc.update(6.0)
    assert out["grad_norm_std"] == pytest.approx(np.std([2, 4, 6]))
    assert out["grad_norm_cv"] == pytest.approx(np.std([2, 4, 6]) / 4)
    out = osc.update(12.0)  # 2.0 leaves the window
    assert out["grad_norm_std"] == pytest.approx(np.std([4, 6, 12]))
    assert out["grad_norm_cv"] == pytest.approx(np.std([4, 6, 12]) / np.mean([4, 6, 12]))
    flat = diagnostics.GradientOscillation(window=4)
    for _ in range(4):
        out = flat.update(1.5)
    assert out == {"grad_norm_std": 0.0, "grad_norm_cv": 0.0}


# --- The run directory. ---

def test_open_metrics_drops_rows_past_the_step_and_a_cut_line(tmp_path):
    rows = [{"step": s, "loss": 5.0 - s} for s in range(1, 6)]
    rows.insert(3, {"step": 3, "eval_loss": 2.5})
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "lo'  # killed mid-write
    (tmp_path / "metrics.jsonl").write_text(text)
    run = RunDirectory(tmp_path)
    kept = run.open_metrics(3)
    assert kept == [r for r in rows if r["step"] <= 3]
    run.log({"step": 4, "loss": 0.5})
    run.close()
    on_disk = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert on_disk == kept + [{"step": 4, "loss": 0.5}]


def test_open_metrics_tolerates_a_cut_line_when_nothing_is_dropped(tmp_path):
    rows = [{"step": s, "loss": 1.0} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"st')
    run = RunDirectory(tmp_path)
    assert run.open_metrics(10) == rows
    run.close()
    assert (tmp_path / "metrics.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in rows)


def test_open_metrics_on_a_fresh_directory_and_a_reader(tmp_path):
    run = RunDirectory(tmp_path / "new")
    assert run.open_metrics(0) == []
    run.close()
    assert (tmp_path / "new" / "metrics.jsonl").read_text() == ""
    (tmp_path / "new" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    reader = RunDirectory(tmp_path / "new", write=False)  # other processes never write
    assert reader.open_metrics(1) == [{"step": 1}]
    assert (tmp_path / "new" / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


def test_write_json_atomic_leaves_no_temporary_file(tmp_path):
    path = epath.Path(tmp_path) / "summary.json"
    write_json(path, {"status": "running", "loss": float("nan"), "per_loop": np.arange(3)})
    write_json(path, {"status": "completed", "loss": 1.5})  # replaces
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    assert json.loads(path.read_text()) == {"status": "completed", "loss": 1.5}
    write_json(path, {"loss": float("inf"), "per_loop": np.arange(3)})
    assert json.loads(path.read_text()) == {"loss": "inf", "per_loop": [0, 1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_grad_cosine_is_the_cosine_of_consecutive_raw_gradients(tiny):
    """train.log_grad_cosine: `grad_cosine` = cos(g_t, g_{t-1}) of the raw (unclipped)
    gradients, 0 on the first step, and the tracker leaves the update itself unchanged."""
    runs = {}
    for on in (False, True):
        # At CLIP, active as 0.05 was (the gradient norm is about 1.6): the untracked step is
        # test_train_step_reports_the_gradient_norm_before_clipping's, compiled once.
        train = dataclasses.replace(tiny["train"], log_grad_cosine=on, grad_clip=CLIP)
        tx, lr_factor, step = tiny["step_fn"](train)
        state = TrainState(step=jnp.zeros((), jnp.int32), params=tiny["params"],
                           opt_state=tx.init(tiny["params"]))
        states, metrics = [state], []
        for t in range(3):
            state, m = step(state, tiny["batch"] if t != 1 else {
                **tiny["batch"], "targets": tokens(B, T, seed=5)}, lr_factor(t))
            states.append(state)
            metrics.append(m)
        runs[on] = states, metrics
    (plain, plain_m), (tracked, tracked_m) = runs[False], runs[True]
    tree_allclose(tracked[-1].params, plain[-1].params, rtol=1e-6, atol=0)
    assert "grad_cosine" not in plain_m[0]
    grads = [jax.tree.leaves(tiny["grads"])]
    for t, params in ((1, plain[1].params), (2, plain[2].params)):
        batch = tiny["batch"] if t != 1 else {**tiny["batch"], "targets": tokens(B, T, seed=5)}
        # The fixture's compiled gradients (the same function, model and train config); run
        # eagerly, op by op, this 2 x 3 model's backward pass took most of the test's ~35 s.
        _, _, g = tiny["grad_fn"](params, batch)
        grads.append(jax.tree.leaves(g))
    flat = [np.concatenate([np.ravel(x) for x in g]).astype(np.float64) for g in grads]
    assert float(tracked_m[0]["grad_cosine"]) == 0.0
    for t in (1, 2):
        expect = flat[t] @ flat[t - 1] / np.linalg.norm(flat[t]) / np.linalg.norm(flat[t - 1])
        assert float(tracked_m[t]["grad_cosine"]) == pytest.approx(expect, abs=2e-5)
    assert plain_m[1]["grad_norm"] > CLIP  # the clip was active: the cosine reads raw gradients


@pytest.mark.parametrize("schedule, cooldown", [("cosine", "linear"), ("wsd", "sqrt"),
                                                ("constant", "linear")])
def test_the_lr_factors_evaluated_over_a_padded_length_are_the_same_bits(schedule, cooldown):
    """`_lr_factors` (trainer.py) pads the steps to a power of two so that runs of other lengths
    reuse the eager ops' programs; every factor must be what the unpadded evaluation gives."""
    for steps, warmup in ((554, 27), (1500, 0)):
        config = parse(load_config("experiments/base.py:tiny", [
            f"--config.train.schedule={schedule}", f"--config.train.cooldown={cooldown}",
            f"--config.train.steps={steps}", f"--config.train.warmup_steps={warmup}"]))
        _, lr_factor = build_optimizer(config.train, config.model)
        unpadded = np.asarray(jax.vmap(lr_factor)(jnp.arange(steps)), np.float32)
        padded = _lr_factors(lr_factor, steps)
        assert padded.shape == (steps,)
        assert np.array_equal(padded, unpadded), (schedule, steps)
