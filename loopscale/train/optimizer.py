"""Optimisers with the width parametrisation's per-parameter learning-rate multipliers.

muP for Adam (model/mup.py) gives every weight an LR factor that depends only on its role and
the width ratio of its fan-in (d_model/base_d_model, or the FFN width's for w_down). Adam's
update is invariant to the gradient's scale, so the factor must multiply the *update*: after
`scale_by_adam`, before the (scheduled) learning rate.
The factors come from `mup.scaling_of` (role and fan-in by name), the same table the init
and the forward multipliers read, so the three cannot disagree.

The trainer's optimiser (`build_optimizer`) runs at the peak learning rate and the schedule is
applied outside it, as a per-step multiplier (`scheduled_update`): every recipe's update is
linear in the learning rate (Adam and Muon directions, coupled decay before the LR, independent
decay scaled by lr_t/peak), so this is exact, and it keeps the schedule's step counts out of the
compiled step: runs of one model at different budgets share one executable (and the persistent
compilation cache).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, muon

from loopscale.config.schema import ModelConfig, Optimizer, TrainConfig, WeightDecay
from loopscale.model import mup
from loopscale.train.schedules import learning_rate


def _is_box(x) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def role_labels(params):
    """Role names ("embedding", "hidden", "readout", "router", "norm") shaped like `params`.

    Works on plain and on boxed (`nn.Partitioned`) parameters; for boxed ones each label sits
    where the box is, which optax accepts as a prefix of the parameter tree."""
    names = jax.tree.map(lambda role: role.value, mup.param_roles(nn.unbox(params)),
                         is_leaf=lambda x: isinstance(x, mup.Role))
    return jax.tree.map(lambda _, name: name, params, names, is_leaf=_is_box)


def _per_leaf(factor) -> optax.GradientTransformation:
    """Stateless: multiplies each update by factor(its leaf name) (boxed or plain trees)."""
    def scale(updates, params=None):
        del params
        return jax.tree_util.tree_map_with_path(
            lambda path, u: u * factor(mup._leaf_name(path)), updates)
    return optax.stateless(scale)


def mup_lr_scaling(cfg: ModelConfig) -> optax.GradientTransformation:
    """Multiplies each parameter's update by its LR factor, `mup.scaling_of(name, cfg).lr_mult`
    (per weight, not per role: w_down's fan-in multiplier is the FFN width's).

    Stateless. Chain it after the update direction (`scale_by_adam`) and before the learning
    rate. Under `sp`, and at width_mult 1 under every preset, every factor is 1. The split by
    role is kept only so that the optimiser state keeps the shape runs were saved with."""
    def lr_mult(name: str) -> float:
        return mup.scaling_of(name, cfg).lr_mult
    return optax.multi_transform({role.value: _per_leaf(lr_mult) for role in mup.Role},
                                 role_labels)


def adam_with_mup(learning_rate: optax.ScalarOrSchedule, cfg: ModelConfig, b1: float = 0.9,
                  b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """Adam whose step for each parameter is lr * lr_mult(role) * Adam's direction."""
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        mup_lr_scaling(cfg),
        optax.scale_by_learning_rate(learning_rate),
    )


# --- The trainer's optimiser: one recipe per train.optimizer, from the typed config. ---

DECAYED_ROLES = ("hidden", "readout", "router")  # matrices; never embeddings or norm gains


def _decay_mask(params):
    return jax.tree.map(lambda label: label in DECAYED_ROLES, role_labels(params))


def _independent_decay(train: TrainConfig) -> optax.GradientTransformation:
    """Independent decay (applied after the LR): p -= wd * (lr_t / peak) * p, so the decay rate
    follows the schedule's shape (the multiplier `scheduled_update` applies) but not its peak;
    coupled decay is added before the LR."""
    return optax.add_decayed_weights(-train.weight_decay, mask=_decay_mask)


def _coupled_decay(train: TrainConfig, cfg: ModelConfig) -> optax.GradientTransformation:
    """Coupled decay (multiplied by the LR), added before the muP factor at wd / lr_mult, so
    the step decays p by lr * wd whatever the width: microsoft/mup's MuAdamW divides a matrix's
    LR by its width multiplier and multiplies its weight_decay by the same, keeping lr x wd the
    base width's (a decay tied to lr / w would fade away as the model widens)."""
    def decay(path, u, p):
        return u + train.weight_decay / mup.scaling_of(mup._leaf_name(path), cfg).lr_mult * p

    def add_decay(updates, params):
        return jax.tree_util.tree_map_with_path(decay, updates, params)
    # masked(stateless): the same state as optax.add_decayed_weights(mask=...) had.
    return optax.masked(optax.stateless(add_decay), _decay_mask)


def adamw_with_mup(train: TrainConfig, cfg: ModelConfig) -> optax.GradientTransformation:
    coupled = train.weight_decay and train.weight_decay_mode is WeightDecay.COUPLED
    independent = train.weight_decay and train.weight_decay_mode is WeightDecay.INDEPENDENT
    return optax.chain(
        optax.scale_by_adam(b1=train.b1, b2=train.b2, eps=train.eps),
        _coupled_decay(train, cfg) if coupled else optax.identity(),
        mup_lr_scaling(cfg),
        optax.scale_by_learning_rate(train.lr),
        _independent_decay(train) if independent else optax.identity(),
    )


def _muon_dimensions(params):
    """Which axes Muon orthogonalises: (fan-in, fan-out) of each block matrix; leading axes
    (stacked layers, experts) are batch axes, each matrix orthogonalised on its own."""
    def dims(path, x):
        name = mup._leaf_name(path)
        n = x.ndim
        if name in ("wq", "wk", "wv"):  # (..., D, H, K): D -> H*K
            return MuonDimensionNumbers(reduction_axis=(n - 3,), output_axis=(n - 2, n - 1))
        if name == "wo":  # (..., H, K, D): H*K -> D
            return MuonDimensionNumbers(reduction_axis=(n - 3, n - 2), output_axis=(n - 1,))
        return MuonDimensionNumbers(reduction_axis=(n - 2,), output_axis=(n - 1,))
    return jax.tree_util.tree_map_with_path(dims, params)


def muon_momentum(train: TrainConfig) -> optax.ScalarOrSchedule:
    """Muon's momentum: from train.muon_momentum_start to train.muon_momentum linearly over the
    first train.muon_momentum_warmup updates (the FLT code: 0.85 -> 0.95 over 300 steps, the
    momentum at update t being the schedule at t, t = 0, 1, ...), then constant."""
    if not train.muon_momentum_warmup:
        return train.muon_momentum
    return optax.linear_schedule(train.muon_momentum_start, train.muon_momentum,
                                 train.muon_momentum_warmup)


def _block_muon(train: TrainConfig) -> optax.GradientTransformation:
    """optax's Muon on the block matrices. A momentum ramp enters through inject_hyperparams,
    which evaluates it at the update count kept in its state; without a ramp the plain
    transformation keeps the optimiser state of runs written before the ramp existed."""
    beta = muon_momentum(train)
    kwargs = {"weight_decay": train.weight_decay,
              "muon_weight_dimension_numbers": _muon_dimensions}
    if not callable(beta):
        return muon(train.lr, beta=beta, **kwargs)
    return optax.inject_hyperparams(muon, static_args=("muon_weight_dimension_numbers",
                                                       "ns_steps"))(train.lr, beta=beta, **kwargs)


def muon_recipe(train: TrainConfig, cfg: ModelConfig) -> optax.GradientTransformation:
    """The FLT study's recipe: Muon (train.lr, momentum `muon_momentum`) on every block matrix,
    AdamW on the embedding (train.embed_lr) and the output head (train.head_lr), and on norm
    gains and routers at train.lr; each group at its own peak, all under the one schedule
    multiplier."""
    def adamw(peak: float) -> optax.GradientTransformation:
        return optax.adamw(peak or train.lr, b1=train.b1, b2=train.b2, eps=train.eps,
                           weight_decay=0.0)

    return optax.multi_transform({
        "hidden": _block_muon(train),
        "embedding": adamw(train.embed_lr),
        "readout": adamw(train.head_lr),
        "router": adamw(train.lr),
        "norm": adamw(train.lr),
    }, role_labels)


class GradCosineState(NamedTuple):
    previous: Any  # the last step's raw gradient (zeros before the first step)
    grad_cosine: jax.Array  # cosine between this step's raw gradient and the previous one


def track_grad_cosine() -> optax.GradientTransformation:
    """Passes the gradient through unchanged and records its cosine with the previous step's
    (the FLT study's oscillation diagnostic: consecutive gradients pointing against each other
    give a negative cosine). It keeps one gradient-sized buffer in the optimiser state, so it is
    only in the chain when `train.log_grad_cosine`; the train step reads `grad_cosine` from the
    state by name. 0 on the first step (no previous gradient)."""
    def init(params):
        return GradCosineState(optax.tree.zeros_like(params), jnp.zeros((), jnp.float32))

    def update(updates, state, params=None):
        del params
        norms = optax.tree.norm(updates) * optax.tree.norm(state.previous)
        dot = optax.tree.vdot(updates, state.previous)
        cosine = jnp.where(norms > 0, dot / jnp.where(norms > 0, norms, 1.0), 0.0)
        return updates, GradCosineState(updates, cosine.astype(jnp.float32))

    return optax.GradientTransformation(init, update)


def build_optimizer(train: TrainConfig, cfg: ModelConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The full optimiser of a run at its peak LR (clipping first, on the raw gradient) and the
    schedule's multiplier, step -> lr_t / peak, to pass to `scheduled_update`."""
    if train.optimizer is Optimizer.MUON:
        body = muon_recipe(train, cfg)
    else:
        body = adamw_with_mup(train, cfg)
    clip = optax.clip_by_global_norm(train.grad_clip) if train.grad_clip else optax.identity()
    parts = (track_grad_cosine(),) if train.log_grad_cosine else ()
    return optax.chain(*parts, clip, body), learning_rate(train, peak=1.0)


def scheduled_update(tx: optax.GradientTransformation, grads, opt_state, params,
                     lr_factor: jax.Array):
    """`tx.update` at the peak LR, scaled by this step's schedule multiplier."""
    updates, opt_state = tx.update(grads, opt_state, params)
    return jax.tree.map(lambda u: lr_factor * u, updates), opt_state
