"""muP coordinate check: do activations keep their size as the model gets wider?

For each width d_model in a list (head size fixed, so n_heads = d_model // d_head grows with
it; explicit FFN widths scale with it, the families' rounded SwiGLU rule is kept), the model is
initialised at fixed seeds and trained for a few Adam steps at a constant LR, with the
parametrisation's per-parameter LR multipliers (train/optimizer.py), on one fixed batch of
`walks` (short sequences over a few symbols, see there for why not uniform random tokens).
Before the first step and after each step it records mean |x| over batch, positions and
features of:

- `embedding`: the embedding output (times its forward multiplier);
- `loop{t}/layer{l}/attn` and `loop{t}/layer{l}/{mlp|moe}`: each layer's attention and FFN
  outputs, separately for every loop t;
- `loop{t}/layer{l}`: each layer's output (the residual stream), for every loop t -- mup's own
  check hooks modules, so it only sees a reused module's last use;
- `loop{t}/out`: the stream at every loop boundary (before the final norm);
- `logits`.
Indices are 0-based. Each value is the mean over seeds of the per-seed mean |x|.

Step s (0..steps) means "after s Adam updates": step 0 is the initialisation. Under a correct
width parametrisation every coordinate stays Theta(1) as the width grows, so its values at two
widths keep a ratio near 1; under `sp` the updates of hidden weights grow like the width and so
does the ratio. The criterion compares the narrowest and widest width: for every coordinate
and every step, ratio = value(widest) / value(narrowest) must lie in (1/tol, tol);
`max_ratio[name]` is the worst max(ratio, 1/ratio) over the steps, `violations` lists the
(name, steps) outside, `passed` is true when there are none. A coordinate exactly zero at both
widths (a zero-initialised readout or output projection before it first moves) has ratio 1:
both widths agree exactly. Zero at one width only is an infinite ratio (null in the JSON).

Two properties of muP matter when reading the logits (measured in tests/test_coordcheck.py):
- with a non-zero readout init (microsoft/mup's default) mean |logits| at init shrinks like
  1/sqrt(width) -- the output is meant to vanish at init -- and for the first steps keeps a
  term W_0 dx / width of that order: at widths 128 and 512 the logits ratio is 0.50 at init and
  ~0.55-0.65 over steps 1-3. This fails the criterion by design, not because of a bug;
- with `model.zero_init_readout=True` (mup's `readout_zero_init`) the logits are exactly 0 at
  init and Theta(1) from the first step, so every coordinate, logits included, is comparable.
  The language-model loss then gives the hidden weights no gradient on step 1 (it flows
  through the zero readout), so they first move with it on step 2. In an MoE the auxiliary
  losses (load balancing, router z) do reach them on step 1, through the routers: every weight
  upstream of a router (embedding, attention, earlier layers) takes Adam's first, sign-like
  step on that weak signal alone. Its noise shows at small widths: the step-1 logits of the
  MoE families at width 128 are 1.24-1.31x below width 512's (Looped-MoE 0.0153, 0.0165,
  0.0200, 0.0200 at 128, 256, 512, 1024; MoE 0.0134, 0.0151, 0.0166, 0.0188), and the gap is
  within 1.1x by step 2: a deficit fading roughly like 1/sqrt(width), not the constant factor
  per doubling of a width exponent (README).

Finite width shows too. At width 128 (two heads of 64) single seeds differ by 5-10% in the
sub-layer outputs, hence several seeds. At a large LR without warmup (1e-2 at base width 128)
the narrow models drift from the wide ones by 20-40% within three steps even under muP,
so check at an LR the model would take in its first steps (after warmup that is the peak LR).

The check runs the Python-loop form of the model (`scan=False`; the same computation as the
scans, tests/test_model.py) so that flax's `capture_intermediates` sees every use of every
layer. The loss it differentiates is the train step's (train/step.py `objective`), at the loss
weights of `Settings`, which the command takes from the experiment's train config.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Sequence

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax

from loopscale.config import base_config, parse
from loopscale.config.schema import ModelConfig, Param, Remat, TrainConfig
from loopscale.errors import UsageError
from loopscale.files import write_atomic
from loopscale.model import mup
from loopscale.model.attention import Attention
from loopscale.model.ffn import MLP
from loopscale.model.moe import MoE
from loopscale.model.transformer import LoopedLM
from loopscale.train.optimizer import adam_with_mup
from loopscale.train.step import objective


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the check trains on and how: the check's own knobs, not a training recipe."""

    steps: int = 3
    lr: float = 5e-4  # constant, no warmup: the first steps of training
    seeds: int = 8
    batch_size: int = 4
    seq_len: int = 16
    alphabet: int = 16  # symbols in the walks the check trains on (see `walks`)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    # The training objective's weights (train/step.py `objective`); the command takes them
    # from the experiment's train config, so the check differentiates what training does.
    z_loss_weight: float = 0.0
    lb_loss_weight: float = 0.0
    router_z_weight: float = 0.0


def objective_config(settings: Settings) -> TrainConfig:
    """The train config whose objective the check differentiates: the base defaults with the
    check's batch and loss weights, the logits projected at once (its sequences are short)."""
    return dataclasses.replace(
        parse(base_config()).train, batch_size=settings.batch_size, seq_len=settings.seq_len,
        ce_chunk=0, z_loss_weight=settings.z_loss_weight, lb_loss_weight=settings.lb_loss_weight,
        router_z_weight=settings.router_z_weight)


def width_config(cfg: ModelConfig, d_model: int) -> ModelConfig:
    """`cfg` at another width: head size fixed, so n_heads scales with d_model; explicit FFN
    widths scale with d_model too (0 keeps the model's own rule); everything else as given."""
    d_head = cfg.d_head
    if d_model % d_head:
        raise UsageError(f"width {d_model} is not a multiple of the head size {d_head}")

    def scaled(width: int) -> int:
        return max(1, round(width * d_model / cfg.d_model)) if width else 0

    return dataclasses.replace(
        cfg, d_model=d_model, n_heads=d_model // d_head, head_dim=d_head, d_ff=scaled(cfg.d_ff),
        expert_d_ff=scaled(cfg.expert_d_ff), scan=False, remat=Remat.NONE,
    )


def walks(key: jax.Array, batch_size: int, length: int, alphabet: int, vocab_size: int) -> jax.Array:
    """The check's data: each sequence walks a fixed random permutation of `alphabet` random
    vocabulary symbols from a random start (next token = perm(token), learnable as a bigram).

    Why not uniform random tokens: their first gradients carry almost no shared signal, so the
    first Adam steps (sign-like) are mostly noise whose 1/sqrt(width) residue dominates small
    widths (measured: mean |logits| at width 512 vs 128 after one step, 0.85x under muP). A few
    symbols repeated, like the frequent tokens of text, give a coherent signal."""
    k_symbols, k_perm, k_start = jax.random.split(key, 3)
    alphabet = min(alphabet, vocab_size)
    symbols = jax.random.choice(k_symbols, vocab_size, (alphabet,), replace=False)
    perm = jax.random.permutation(k_perm, alphabet)
    start = jax.random.randint(k_start, (batch_size,), 0, alphabet)
    _, idx_LxB = jax.lax.scan(lambda i, _: (perm[i], i), start, None, length=length)
    return symbols[idx_LxB.T]


def _is_sublayer_call(module: nn.Module, method_name: str) -> bool:
    return method_name == "__call__" and isinstance(module, (Attention, MLP, MoE))


def _mean_abs(x: jax.Array) -> jax.Array:
    return jnp.mean(jnp.abs(x.astype(jnp.float32)))


def _coordinates(cfg: ModelConfig, params, tokens_BxT, outputs, intermediates) -> dict:
    """name -> mean |x| of every recorded coordinate."""
    emb_mult = mup.scaling(mup.Role.EMBEDDING, cfg).forward_mult
    coords = {"embedding": _mean_abs(jnp.take(params["embedding"], tokens_BxT, axis=0) * emb_mult)}
    # ('loop', 'stack', 'layer_<l>', '<attn|mlp|moe>', '__call__') -> one output per loop
    sub = {}
    for path, per_loop in flax.traverse_util.flatten_dict(intermediates).items():
        layer = int(path[-3].removeprefix("layer_"))
        for t, out in enumerate(per_loop):
            out = out[0] if isinstance(out, tuple) else out  # MoE returns (y, router stats)
            sub.setdefault((t, layer), {})[path[-2]] = _mean_abs(out)
    K, L = outputs.layer_hidden.shape[:2]
    for t in range(K):
        for layer in range(L):
            for name, value in sorted(sub.get((t, layer), {}).items()):
                coords[f"loop{t}/layer{layer}/{name}"] = value
            coords[f"loop{t}/layer{layer}"] = _mean_abs(outputs.layer_hidden[t, layer])
        coords[f"loop{t}/out"] = _mean_abs(outputs.loop_hidden[t])
    coords["logits"] = _mean_abs(outputs.logits)
    return coords


# The MoE auxiliary losses' weights are arguments of the compiled check, not constants in it:
# checks that differ only in them (the study's weights beside none) share one compile.
TRACED_WEIGHTS = ("lb_loss_weight", "router_z_weight")


def _compiled_check(cfg: ModelConfig, settings: Settings):
    """The check of one width: seeds -> {name: (seeds, steps + 1)}, compiled once per model and
    settings but for the traced loss weights (`_check_program`)."""
    program = _check_program(cfg, dataclasses.replace(settings, **dict.fromkeys(TRACED_WEIGHTS,
                                                                                 0.0)))
    weights = jnp.asarray([getattr(settings, w) for w in TRACED_WEIGHTS], jnp.float32)
    return lambda seeds: program(seeds, weights)


@functools.lru_cache(maxsize=16)
def _check_program(cfg: ModelConfig, settings: Settings):
    """The jitted check: (seeds, TRACED_WEIGHTS' values) -> coordinates. Cached, so repeated
    checks of the same model and settings (tests, a second command in one process) reuse it."""
    model = LoopedLM(cfg, collect_layers=True)
    tx = adam_with_mup(settings.lr, cfg, b1=settings.b1, b2=settings.b2, eps=settings.eps)
    B, T = settings.batch_size, settings.seq_len
    static_train = objective_config(settings)

    def key(seed, stream):
        # XLA's RngBitGenerator: same numbers for a seed at every width, and it compiles in
        # about half the time of threefry, which dominates compiling a model's init.
        return jax.random.fold_in(jax.random.key(seed, impl="rbg"), stream)

    def batch(seed):  # the same tokens at every width: they depend on the seed only
        return walks(key(seed, 1), B, T + 1, settings.alphabet, cfg.vocab_size)

    def init(seed, tokens):
        params = nn.unbox(model.init(key(seed, 0), tokens[:, :-1])["params"])
        return params, tx.init(params)

    def step(params, opt_state, tokens, train):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        batch = {"inputs": inputs, "targets": targets, "mask": jnp.ones_like(targets)}

        def loss_fn(p):
            # The train step's objective, on a forward pass that also records the sub-layers.
            out, state = model.apply({"params": p}, inputs, capture_intermediates=_is_sublayer_call,
                                     mutable=["intermediates"])
            loss, _ = objective(p, out, batch, model, train)
            return loss, _coordinates(cfg, p, inputs, out, state["intermediates"])

        (_, coords), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, coords

    def check(seed, weights):
        tokens = batch(seed)
        params, opt_state = init(seed, tokens)
        # objective() multiplies the auxiliary losses by these weights: a traced scalar is as good
        train = dataclasses.replace(static_train, **dict(zip(TRACED_WEIGHTS, weights)))

        def body(state, _):
            params, opt_state, coords = step(*state, tokens, train)
            return (params, opt_state), coords

        # Step s records the forward pass of the params after s updates; the update computed
        # on the last pass is never used.
        _, coords = jax.lax.scan(body, (params, opt_state), length=settings.steps + 1)
        return coords

    # One program per width (init and steps together, so each width compiles once); seeds one
    # after another inside it, so memory holds one model and its Adam state at a time.
    return jax.jit(lambda seeds, weights: jax.lax.map(lambda seed: check(seed, weights), seeds))


def _depth_order(name: str) -> tuple:
    """Sort key: embedding, then by loop and layer (attention, FFN, layer output), each loop's
    boundary after its layers, logits last. (jit returns dicts with sorted keys: loop10 < loop2.)"""
    if name == "embedding":
        return (0,)
    if name == "logits":
        return (2,)
    loop, _, rest = name.partition("/")
    if rest == "out":
        return (1, int(loop.removeprefix("loop")), 1)
    layer, _, sub = rest.partition("/")
    return (1, int(loop.removeprefix("loop")), 0, int(layer.removeprefix("layer")), sub == "", sub)


def measure_width(cfg: ModelConfig, settings: Settings) -> dict[str, list[float]]:
    """name -> mean |x| at steps 0..settings.steps for one width, averaged over seeds."""
    coords = _compiled_check(cfg, settings)(jnp.arange(settings.seeds))
    return {name: np.mean(np.asarray(coords[name]), axis=0).tolist()
            for name in sorted(coords, key=_depth_order)}


def ratio(wide: float, narrow: float) -> float:
    """wide / narrow, with 0/0 = 1 (both exactly zero agree) and x/0 = inf."""
    if narrow == 0.0:
        return 1.0 if wide == 0.0 else math.inf
    return wide / narrow


def spread(r: float) -> float:
    """How far a ratio is from 1 either way: max(r, 1/r) (inf for 0 or inf)."""
    if r == 0.0 or math.isinf(r):
        return math.inf
    return max(r, 1.0 / r)


def summarize(values: dict[str, list[list[float]]], widths: Sequence[int], tol: float) -> dict:
    """Per coordinate: the ratio widest/narrowest at each step and its worst spread; and the
    coordinates (with their steps) whose ratio leaves (1/tol, tol)."""
    lo, hi = int(np.argmin(widths)), int(np.argmax(widths))
    ratios = {name: [ratio(per_step[hi], per_step[lo]) for per_step in series]
              for name, series in values.items()}
    max_ratio = {name: max(spread(r) for r in rs) for name, rs in ratios.items()}
    violations = {name: [s for s, r in enumerate(rs) if not spread(r) < tol]
                  for name, rs in ratios.items()}
    return {"ratios": ratios, "max_ratio": max_ratio,
            "violations": {name: steps for name, steps in violations.items() if steps}}


def run(cfg: ModelConfig, widths: Sequence[int], settings: Settings, tol: float = 1.2) -> dict:
    """The coordinate check across `widths`; a JSON-ready dict (see the module docstring).

    values[name][step][i] is mean |x| of coordinate `name` after `step` updates at widths[i]."""
    if len(set(widths)) < 2:
        raise UsageError("the coordinate check needs at least two different widths")
    per_width = [measure_width(width_config(cfg, w), settings) for w in widths]
    names = list(per_width[0])
    values = {n: [[h[n][s] for h in per_width] for s in range(settings.steps + 1)] for n in names}
    summary = summarize(values, widths, tol)
    notes = []
    if cfg.param is Param.MUP and not cfg.zero_init_readout:
        notes.append("mup with a non-zero readout init: logits shrink like 1/sqrt(width) at init "
                     "by design; set model.zero_init_readout=True to compare them")
    return {
        "param": cfg.param.value,
        "base_d_model": cfg.base_d_model,
        "d_head": cfg.d_head,
        "zero_init_readout": cfg.zero_init_readout,
        "widths": list(widths),
        "steps": list(range(settings.steps + 1)),
        "settings": dataclasses.asdict(settings),
        "statistic": "mean over seeds of mean |x| over batch, positions and features",
        "compared_widths": [min(widths), max(widths)],
        "tol": tol,
        "values": values,
        **summary,
        "passed": not summary["violations"],
        "notes": notes,
    }


def plot(result: dict, path: str) -> None:
    """mup-style figure: one panel per step, mean |x| against width (log-log), a line per
    coordinate. Exact zeros are left out (a log axis cannot show them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, widths, values = result["steps"], result["widths"], result["values"]
    fig, axes = plt.subplots(1, len(steps), figsize=(3.6 * len(steps), 3.6), sharey=True,
                             squeeze=False)
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.95, len(values)))
    for s, ax in zip(steps, axes[0]):
        for colour, (name, series) in zip(colours, values.items()):
            y = np.array(series[s], dtype=float)
            y[y <= 0] = np.nan
            style = {"linewidth": 2.0, "color": "black"} if name == "logits" else {"color": colour}
            ax.plot(widths, y, marker="o", markersize=3, label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("d_model")
        ax.set_title(f"step {s}")
    axes[0][0].set_ylabel("mean |x|")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=6)
    fig.suptitle(f"coordinate check: {result['param']}, lr {result['settings']['lr']:g}, "
                 f"max ratio {max(result['max_ratio'].values()):.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _finite(tree):
    """JSON has no infinity: an infinite ratio (zero at one width only) is written as null."""
    if isinstance(tree, dict):
        return {k: _finite(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_finite(v) for v in tree]
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    return tree


def write(result: dict, out_dir: str) -> tuple[str, str]:
    """Writes coordcheck.json and coordcheck.png into `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "coordcheck.json")
    png_path = os.path.join(out_dir, "coordcheck.png")
    write_atomic(json_path, json.dumps(_finite(result), indent=1, allow_nan=False))
    plot(result, png_path)
    return json_path, png_path
