"""The muP coordinate check (issue #2): widths 128 and 512, 3 Adam steps, four families.

What is asserted (loopscale/evaluate/coordcheck.py says how it is measured): for every recorded
coordinate -- embedding output, each layer's attention and FFN outputs and residual stream per
loop iteration, every loop boundary, logits -- and every step 0..3, mean |x| at width 512
divided by mean |x| at width 128 lies in (1/1.2, 1.2) under `mup`, and does not under `sp` at
the same learning rate. The muP runs use a zero-initialised readout, so the logits are exactly
0 at both widths at init (ratio 1) and Theta(1) afterwards; with microsoft/mup's non-zero
readout init the logits at init shrink like 1/sqrt(width) by design, checked separately.
"""

import dataclasses
import functools
import json
import math

import pytest

from loopscale.cli import main
from loopscale.config import load_config, parse
from loopscale.evaluate import coordcheck

FAMILIES = ["base", "looped", "moe", "looped_moe"]
WIDTHS = (128, 512)
# lr 5e-4 is a plausible peak LR for these models at the base width 128 (sp's hidden updates
# grow like the width at any LR; at this one they dominate by step 3). Eight seeds because
# at width 128 (two heads, experts of width 192) one seed's sub-layer outputs wander by ~5-10%.
# b1/b2/eps are the families' own (sparse_study preset). The MoE auxiliary losses are off here
# and on in test_mup_moe_with_the_studys_auxiliary_losses: with a zero readout they are the only
# gradient reaching the blocks on step 1 (through the routers), and Adam's sign-like first step
# on that weak signal leaves the step-1 logits at width 128 below the wider widths'.
SETTINGS = coordcheck.Settings(steps=3, lr=5e-4, seeds=8, batch_size=4, seq_len=16,
                               alphabet=16, b1=0.9, b2=0.999, eps=1e-8, lb_loss_weight=0.0,
                               router_z_weight=0.0)
# The sparse-layers study's auxiliary-loss weights (the experiments' defaults).
AUX_SETTINGS = dataclasses.replace(SETTINGS, lb_loss_weight=0.01, router_z_weight=0.001)


# sp misses the criterion by ~10x, so two seeds show it as well as eight.
SP_SETTINGS = dataclasses.replace(SETTINGS, seeds=2)


def family_model(family: str, param: str, zero_init_readout: bool):
    # MoE: the capacity path with ample capacity (E/top_k: nothing dropped) computes exactly what
    # the dropless path does (tests/test_moe.py), and on a CPU it is several times cheaper.
    overrides = [f"--config.model.param={param}",
                 f"--config.model.zero_init_readout={str(zero_init_readout).lower()}",
                 "--config.model.moe_dispatch=capacity", "--config.model.capacity_factor=4.0"]
    return parse(load_config(f"experiments/{family}.py:tiny", overrides)).model


@functools.cache
def check(family: str, param: str, zero_init_readout: bool = True) -> dict:
    settings = SP_SETTINGS if param == "sp" else SETTINGS
    return coordcheck.run(family_model(family, param, zero_init_readout), WIDTHS, settings)


def expected_names(family: str) -> set:
    cfg = family_model(family, "mup", True)
    ffn = "moe" if cfg.ffn.value == "moe" else "mlp"
    names = {"embedding", "logits"}
    for t in range(cfg.n_loops):
        names.add(f"loop{t}/out")
        for layer in range(cfg.n_unique):
            names |= {f"loop{t}/layer{layer}{s}" for s in ("", "/attn", f"/{ffn}")}
    return names


def describe(result: dict) -> str:
    worst = sorted(result["max_ratio"].items(), key=lambda kv: -kv[1])[:4]
    return f"{result['param']}: worst {worst}; violations (name: steps) {result['violations']}"


@pytest.mark.parametrize("family", FAMILIES)
def test_mup_keeps_every_coordinate_width_independent(family):
    result = check(family, "mup")
    assert set(result["values"]) == expected_names(family)
    assert result["steps"] == [0, 1, 2, 3] and result["widths"] == list(WIDTHS)
    # Zero-initialised readout: logits exactly 0 at init at both widths, then they move.
    assert result["values"]["logits"][0] == [0.0, 0.0]
    assert all(v > 0 for v in result["values"]["logits"][1])
    # The activations do change over the steps (the check is not of a frozen model).
    last = f"loop{family_model(family, 'mup', True).n_loops - 1}/out"
    assert result["values"][last][3][0] > 1.5 * result["values"][last][0][0]
    assert result["passed"], describe(result)
    assert max(result["max_ratio"].values()) < 1.2


def test_mup_moe_with_the_studys_auxiliary_losses():
    """Looped-MoE with load balancing 0.01 and router z 0.001: every coordinate at every step
    within 1.2x between widths 128 and 512 except the step-1 logits, which sit ~1.3x higher at
    512. Measured (README): 0.0153, 0.0165, 0.0200, 0.0200 at widths 128, 256, 512, 1024, a
    deficit of the narrow widths rather than a width exponent; within 1.2x again from step 2."""
    result = coordcheck.run(family_model("looped_moe", "mup", True), WIDTHS, AUX_SETTINGS)
    assert set(result["violations"]) <= {"logits"}, describe(result)
    assert result["violations"].get("logits", [1]) == [1], describe(result)
    step1, later = result["ratios"]["logits"][1], result["ratios"]["logits"][2:]
    assert 1.0 < step1 < 1.5, describe(result)
    assert all(coordcheck.spread(r) < 1.2 for r in later), describe(result)


@pytest.mark.parametrize("family", FAMILIES)
def test_sp_fails_the_same_check(family):
    result = check(family, "sp")
    assert not result["passed"]
    # Not a marginal miss: hidden-weight updates grow like the width (x4 here) under sp.
    assert max(result["max_ratio"].values()) > 3.0, describe(result)
    assert result["max_ratio"]["logits"] > 3.0, describe(result)


def test_mup_nonzero_readout_logits_vanish_at_init_like_inverse_sqrt_width():
    result = check("looped", "mup", zero_init_readout=False)
    at_init = result["ratios"]["logits"][0]
    assert at_init == pytest.approx(math.sqrt(WIDTHS[0] / WIDTHS[1]), rel=0.1)
    # Everything before the readout is unaffected by the readout's init.
    others = {k: v for k, v in result["max_ratio"].items() if k != "logits"}
    assert max(others.values()) < 1.2, describe(result)


def test_ratio_rules_for_exact_zeros():
    assert coordcheck.ratio(0.0, 0.0) == 1.0
    assert coordcheck.ratio(1.0, 0.0) == math.inf
    assert coordcheck.spread(0.5) == coordcheck.spread(2.0) == 2.0
    assert coordcheck.spread(0.0) == math.inf
    summary = coordcheck.summarize({"a": [[0.0, 0.0], [1.0, 1.1]], "b": [[0.0, 1.0], [2.0, 1.0]]},
                                   [64, 256], tol=1.2)
    assert summary["max_ratio"]["a"] == pytest.approx(1.1)
    assert summary["violations"] == {"b": [0, 1]}


def test_width_config_keeps_head_size():
    cfg = family_model("looped_moe", "mup", True)
    wide = coordcheck.width_config(cfg, 512)
    assert (wide.d_model, wide.d_head, wide.n_heads) == (512, cfg.d_head, 512 // cfg.d_head)
    assert not wide.scan and wide.n_unique == cfg.n_unique and wide.n_loops == cfg.n_loops


def test_command_writes_json_and_plot(tmp_path, capsys):
    out = tmp_path / "cc"
    rc = main(["coordcheck", "--config=experiments/looped.py:tiny", f"--out={out}",
               "--widths=64,128", "--steps=1", "--seeds=1", "--batch-size=2", "--seq-len=8",
               "--lr=1e-3"])
    assert rc == 0
    result = json.loads((out / "coordcheck.json").read_text())
    assert result["widths"] == [64, 128] and result["steps"] == [0, 1]
    assert result["param"] == "mup_sparse"  # the family's own preset
    assert "loop1/layer1" in result["values"] and "loop1/out" in result["values"]
    assert (out / "coordcheck.png").stat().st_size > 1000
    assert "coordcheck mup_sparse" in capsys.readouterr().out


def test_command_rejects_bad_widths(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["coordcheck", "--config=experiments/looped.py:tiny", f"--out={tmp_path}",
              "--widths=128"])
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
