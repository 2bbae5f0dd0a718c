"""Learning-rate schedules (optax schedules, joined): warmup + cosine, warmup-stable-decay with a
linear or square-root cooldown, and constant. Each maps the step to the peak LR's multiple
times the peak."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from loopscale.config.schema import Cooldown, Schedule, TrainConfig


def _cooldown(kind: Cooldown, peak: float, floor: float, steps: int) -> optax.Schedule:
    if kind is Cooldown.LINEAR:
        return optax.linear_schedule(peak, floor, max(steps, 1))

    def sqrt_decay(count):  # peak -> floor as 1 - sqrt(progress): fast drop, then a long tail
        progress = jnp.clip(count / max(steps, 1), 0.0, 1.0)
        return floor + (peak - floor) * (1.0 - jnp.sqrt(progress))

    return sqrt_decay


def stable_end(steps: int, decay_frac: float, warmup: int) -> int:
    """The step where WSD's cooldown starts: before it, the LR is that of warmup then constant,
    so a constant-LR trunk checkpointed there is where a cooldown branch starts (sweep/plan.py)."""
    return max(steps - int(round(decay_frac * steps)), warmup)


def learning_rate(train: TrainConfig, peak: float | None = None) -> optax.Schedule:
    peak = train.lr if peak is None else peak
    floor = peak * train.min_lr_frac
    warmup = min(train.warmup_steps, train.steps)
    if train.schedule is Schedule.COSINE:
        if warmup == 0:
            return optax.cosine_decay_schedule(peak, max(train.steps, 1), alpha=train.min_lr_frac)
        # decay_steps counts the warmup too; keep it past the warmup when the run is all warmup.
        return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(train.steps, warmup + 1),
                                                  end_value=floor)
    pieces, boundaries = [], []
    if warmup:
        pieces.append(optax.linear_schedule(0.0, peak, warmup))
        boundaries.append(warmup)
    if train.schedule is Schedule.CONSTANT:
        pieces.append(optax.constant_schedule(peak))
    else:  # WSD: stable until the last decay_frac of the steps, then cool down
        decay_start = stable_end(train.steps, train.decay_frac, warmup)
        if decay_start > warmup:
            pieces.append(optax.constant_schedule(peak))
            boundaries.append(decay_start)
        pieces.append(_cooldown(train.cooldown, peak, floor, train.steps - decay_start))
    if len(pieces) == 1:
        return pieces[0]
    return optax.join_schedules(pieces, boundaries)
