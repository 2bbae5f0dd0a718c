"""Learning-rate schedules (train/schedules.py), checked against their closed forms."""

import math

import numpy as np
import pytest

from loopscale.config import load_config, parse
from loopscale.train.schedules import learning_rate

PEAK, STEPS, WARMUP, FLOOR_FRAC = 0.5, 100, 10, 0.1
FLOOR = PEAK * FLOOR_FRAC


def train_config(**fields):
    base = {"train.lr": PEAK, "train.steps": STEPS, "train.warmup_steps": WARMUP,
            "train.min_lr_frac": FLOOR_FRAC, "train.decay_frac": 0.2}
    base.update(fields)
    overrides = [f"--config.{k}={v}" for k, v in base.items()]
    return parse(load_config("experiments/base.py:tiny", overrides)).train


def lr_at(schedule, *steps):
    return np.array([float(schedule(s)) for s in steps])


def test_warmup_cosine():
    s = learning_rate(train_config(**{"train.schedule": "cosine"}))
    assert float(s(0)) == 0.0
    assert float(s(WARMUP // 2)) == pytest.approx(PEAK / 2)
    assert float(s(WARMUP)) == pytest.approx(PEAK)
    mid = (WARMUP + STEPS) // 2  # half-way through the decay: cos(pi/2) = 0
    assert float(s(mid)) == pytest.approx(FLOOR + (PEAK - FLOOR) / 2, rel=1e-6)
    quarter = WARMUP + (STEPS - WARMUP) // 4
    progress = (quarter - WARMUP) / (STEPS - WARMUP)
    want = FLOOR + (PEAK - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))
    assert float(s(quarter)) == pytest.approx(want, rel=1e-6)
    assert float(s(STEPS)) == pytest.approx(FLOOR, rel=1e-6)
    decay = lr_at(s, *range(WARMUP, STEPS + 1))
    assert np.all(np.diff(decay) <= 1e-9)  # never goes back up after the warmup


def test_cosine_without_warmup_starts_at_peak():
    s = learning_rate(train_config(**{"train.schedule": "cosine", "train.warmup_steps": 0}))
    assert float(s(0)) == pytest.approx(PEAK)
    assert float(s(STEPS // 2)) == pytest.approx(FLOOR + (PEAK - FLOOR) / 2, rel=1e-6)
    assert float(s(STEPS)) == pytest.approx(FLOOR, rel=1e-6)


@pytest.mark.parametrize("cooldown", ["linear", "sqrt"])
def test_wsd_stable_then_cooldown(cooldown):
    s = learning_rate(train_config(**{"train.schedule": "wsd", "train.cooldown": cooldown}))
    stable_end = int(STEPS * (1 - 0.2))  # 80
    assert float(s(0)) == 0.0
    assert float(s(WARMUP // 2)) == pytest.approx(PEAK / 2)
    np.testing.assert_allclose(lr_at(s, *range(WARMUP, stable_end + 1)), PEAK, rtol=1e-7)
    assert float(s(STEPS)) == pytest.approx(FLOOR, rel=1e-6)
    assert float(s(STEPS + 50)) == pytest.approx(FLOOR, rel=1e-6)  # holds the floor past the end
    for step in range(stable_end, STEPS + 1):
        progress = (step - stable_end) / (STEPS - stable_end)
        shape = progress if cooldown == "linear" else math.sqrt(progress)
        assert float(s(step)) == pytest.approx(FLOOR + (PEAK - FLOOR) * (1 - shape), rel=1e-6), step
    assert np.all(np.diff(lr_at(s, *range(stable_end, STEPS + 1))) < 0)  # strictly cooling


def test_sqrt_cooldown_drops_faster_than_linear():
    """1 - sqrt(progress) falls below 1 - progress everywhere inside the cooldown: a fast first
    drop, then a long tail (a quarter of the way in, sqrt has already lost half the range)."""
    lin = learning_rate(train_config(**{"train.schedule": "wsd", "train.cooldown": "linear"}))
    sqrt = learning_rate(train_config(**{"train.schedule": "wsd", "train.cooldown": "sqrt"}))
    quarter = 80 + 5
    assert float(sqrt(quarter)) == pytest.approx(FLOOR + 0.5 * (PEAK - FLOOR), rel=1e-6)
    assert float(lin(quarter)) == pytest.approx(FLOOR + 0.75 * (PEAK - FLOOR), rel=1e-6)
    inside = range(81, STEPS)
    assert np.all(lr_at(sqrt, *inside) < lr_at(lin, *inside))


def test_wsd_without_warmup_starts_at_peak():
    s = learning_rate(train_config(**{"train.schedule": "wsd", "train.warmup_steps": 0}))
    assert float(s(0)) == pytest.approx(PEAK)
    assert float(s(80)) == pytest.approx(PEAK)
    assert float(s(STEPS)) == pytest.approx(FLOOR, rel=1e-6)


def test_constant_with_warmup():
    s = learning_rate(train_config(**{"train.schedule": "constant"}))
    assert float(s(0)) == 0.0
    assert float(s(WARMUP // 2)) == pytest.approx(PEAK / 2)
    np.testing.assert_allclose(lr_at(s, *range(WARMUP, STEPS + 20, 7)), PEAK, rtol=1e-7)
    assert float(s(STEPS)) == pytest.approx(PEAK)  # min_lr_frac plays no part


def test_constant_without_warmup_and_explicit_peak():
    t = train_config(**{"train.schedule": "constant", "train.warmup_steps": 0})
    s = learning_rate(t, peak=0.2)
    np.testing.assert_allclose(lr_at(s, 0, 1, 50, STEPS), 0.2, rtol=1e-7)


def test_explicit_peak_scales_the_whole_shape():
    """The Muon recipe gives each parameter group its own peak on one shared schedule shape."""
    t = train_config(**{"train.schedule": "wsd", "train.cooldown": "sqrt"})
    a, b = learning_rate(t), learning_rate(t, peak=PEAK * 3)
    steps = range(0, STEPS + 1, 3)
    np.testing.assert_allclose(lr_at(b, *steps), 3 * lr_at(a, *steps), rtol=1e-6)


@pytest.mark.parametrize("schedule", ["wsd", "constant"])
def test_warmup_longer_than_the_run_ramps_up(schedule):
    s = learning_rate(train_config(**{"train.schedule": schedule, "train.steps": 5}))
    assert float(s(0)) == 0.0 and 0.0 < float(s(4)) <= PEAK


@pytest.mark.parametrize("steps", [5, WARMUP])
def test_cosine_with_warmup_at_least_the_run(steps):
    """A short run (train.steps <= train.warmup_steps, e.g. the permutation preset's warmup of 10
    with --config.train.steps=5) must still get a schedule, not a traceback."""
    s = learning_rate(train_config(**{"train.schedule": "cosine", "train.steps": steps}))
    assert float(s(0)) == 0.0 and 0.0 < float(s(steps - 1)) <= PEAK
