"""The loop count of each training step (`train.loop_dist`), and its mean, which the sweep
planner spends budgets by.

- `fixed`: model.n_loops every step.
- `uniform`: uniformly from train.loop_choices.
- `poisson_lognormal` (Huginn, Geiping et al. 2025): tau ~ LogNormal(mu, sigma) with
  mu = log(loop_mean) - sigma^2 / 2 (so E[tau] = loop_mean) and sigma = loop_sigma, then
  r = Poisson(tau) + 1, so E[r] = loop_mean + 1; capped at train.loop_max when it is set.

Each step's draw is a function of (seed, step) alone (numpy's generator seeded with both), so a
resumed run draws what the interrupted one would have, and the FLOPs spent so far are
recomputed from the steps (train/step_log.py).

Compiled steps. The loop scan's length is static, so each distinct count compiles its own
train step, unless the schedule backpropagates through a fixed number of loops (Huginn's):
then the loops before them run without a gradient in one while loop whose trip count is an
argument (model/transformer.py `frozen_loops`), and one compiled step serves every count from
bptt_loops to the schedule's largest (`shared_frozen_slots`); a count below bptt_loops compiles
its own. Where that does not hold (no cap on the count, an MoE core, whose auxiliary losses
average over every loop's use, a loss at several loops, intermediate supervision), each count
compiles its own step.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.stats

from loopscale import flops as flops_lib
from loopscale.config.schema import (Config, FFNKind, FlopConvention, LoopDist, LossLoops,
                                     TrainConfig)


def loops_for_step(train: TrainConfig, n_loops: int, seed: int, step: int) -> int:
    """The loop count of step `step` (0-based) of a run with this train config and seed;
    `n_loops` is the model's (the fixed count)."""
    if train.loop_dist is LoopDist.FIXED:
        return n_loops
    rng = np.random.default_rng([seed, step])
    if train.loop_dist is LoopDist.UNIFORM:
        return int(rng.choice(train.loop_choices))
    sigma = train.loop_sigma
    tau = rng.lognormal(math.log(train.loop_mean) - sigma ** 2 / 2, sigma)
    r = int(rng.poisson(tau)) + 1
    return min(r, train.loop_max) if train.loop_max else r


def shared_frozen_slots(config: Config) -> int:
    """The frozen loops one shared train step makes room for (the largest count less
    bptt_loops), or 0 where every count compiles its own step (module docstring)."""
    t, m = config.train, config.model
    if not t.bptt_loops or t.loop_dist is LoopDist.FIXED or t.intermediate_supervision:
        return 0
    if m.ffn is FFNKind.MOE or m.loss_loops is not LossLoops.LAST:
        return 0
    largest = max(t.loop_choices) if t.loop_dist is LoopDist.UNIFORM else t.loop_max
    return max(largest - t.bptt_loops, 0)


def mean_loops(train: TrainConfig, n_loops: int) -> float:
    """The expected loop count of a step: n_loops, the mean of loop_choices, or for Huginn's
    schedule loop_mean + 1, less what loop_max cuts off (E[min(r, M)] integrated over tau by
    Gauss-Hermite quadrature)."""
    if train.loop_dist is LoopDist.FIXED:
        return float(n_loops)
    if train.loop_dist is LoopDist.UNIFORM:
        return float(np.mean(train.loop_choices))
    if not train.loop_max:
        return train.loop_mean + 1.0
    # E[min(N + 1, M)] = 1 + sum_{j < M-1} P(N > j) for N ~ Poisson(tau), tau log-normal.
    sigma = train.loop_sigma
    z, w = np.polynomial.hermite_e.hermegauss(64)  # nodes of exp(-z^2 / 2)
    tau = np.exp(math.log(train.loop_mean) - sigma ** 2 / 2 + sigma * z)
    tails = scipy.stats.poisson.sf(np.arange(train.loop_max - 1)[:, None], tau[None, :])
    return 1.0 + float(np.sum(tails.sum(axis=0) * w) / math.sqrt(2 * math.pi))


def planned_flops_per_token(config: Config, convention: FlopConvention | None = None) -> float:
    """Training FLOPs per token a budget is spent by (the sweep planner's): a step's
    (flops.step_flops_per_token, truncated backpropagation included) at the schedule's mean
    loop count, interpolated between the counts around it (the cost is linear in the count).
    With model.n_loops every step and full backpropagation: flops.flops_per_token's."""
    convention = convention or config.flop_convention
    mean = mean_loops(config.train, config.model.n_loops)

    def at(loops: int) -> float:
        model = dataclasses.replace(config.model, n_loops=loops)
        return flops_lib.step_flops_per_token(model, config.train.seq_len, convention,
                                              config.train.bptt_loops)

    low = max(1, math.floor(mean))
    share = mean - low
    return at(low) + share * (at(low + 1) - at(low)) if share else at(low)
