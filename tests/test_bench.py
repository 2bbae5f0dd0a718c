"""`loopscale bench`: its machinery end to end at a tiny shape, and the structure of what it
writes. Nothing here asserts a speed: the figures are measured by `make bench`, not tests."""

import dataclasses
import io
import json
import math

import jax
import pytest

from loopscale import cli
from loopscale.bench import result, sweep_share, timing
from loopscale.bench.figures import FIGURES

# The targets (issue 10, `make bench`).
TARGETS = {
    "base_vs_lean": ("<=", 1.0),
    "scan_vs_unrolled": ("<=", 1.05),
    "compile_loops": ("<=", 1.3),
    "looped_vs_base": ("<=", 1.05),
    "flt_vs_lt": ("<=", 1.05),
    "moe_vs_dense": ("<=", 1.3),
    "remat_memory": ("<=", 1 / 3),
    "data_vs_step": (">=", 10.0),
    "sweep_time_share": (">=", 0.70),
    "sweep_runs_share": (">=", 0.70),  # issue #21: train steps / the runs' own wall time
    "demo_vs_lean_flops": (">=", 0.5),  # issue #21: demo FLOP/s / lean FLOP/s, median width
    "jax_vs_torch": ("<=", 1.5),
    "fit_seconds": ("reported", None),  # seconds, no target
    "host_overhead": ("<=", 1.0),  # milliseconds
    "mfu_base": ("reported", None),  # XLA's estimate for the paper run on v5p-128
    "mfu_looped": ("reported", None),
}


# Every figure's machinery runs at the tiny scale: the cheaper half in the quick pass, the
# rest (two compiles or more each) with the slow tests; the table's plumbing is checked for
# every figure at once with the measurements stubbed. The bench keeps the train steps it
# compiled for the process (figures._STEPS), so when both tests run in one process the second
# times the steps the first compiled (Base, Looped and Looped with its loops in Python) rather
# than compiling them again; run alone, each compiles what it needs.
SWEEP_ROWS = ("sweep_time_share", "sweep_runs_share", "demo_vs_lean_flops")
QUICK = ("base_vs_lean", "looped_vs_base", "data_vs_step", *SWEEP_ROWS, "jax_vs_torch",
         "fit_seconds")
REST = tuple(k for k in TARGETS if k not in QUICK)


def run_bench(out, keys) -> tuple[dict, str]:
    cache = jax.config.jax_enable_compilation_cache
    try:
        code = cli.main(["bench", "--scale=tiny", f"--out={out}", f"--only={','.join(keys)}"])
    finally:  # the command turns the persistent cache off for its process
        jax.config.update("jax_enable_compilation_cache", cache)
    doc = json.loads((out / "results.json").read_text())
    assert code == 0, [f["note"] for f in doc["figures"] if f["status"] == "error"]
    return doc, (out / "results.md").read_text()


def check_figures(doc: dict, keys) -> None:
    figures = {f["key"]: f for f in doc["figures"]}
    assert list(figures) == list(keys)
    for key, f in figures.items():
        op, value = TARGETS[key]
        assert f["target"]["op"] == op and f["target"]["value"] == pytest.approx(value), key
        assert f["note"], key
        if f["status"] == "measured":
            assert f["ratio"] > 0 and math.isfinite(f["ratio"]), key
            met = {"<=": lambda r: r <= value, ">=": lambda r: r >= value,
                   "reported": lambda r: None}[op](f["ratio"])
            assert f["passed"] is met, key
            assert f["measured"], key  # the absolute times or bytes behind the ratio
        else:
            assert f["status"] == "skipped" and f["ratio"] is None and f["passed"] is None, key
            assert f["note"].startswith("skipped: "), key
    # The tiny scale runs no sweep; every other figure is measured (torch only if installed).
    skipped = {k for k, f in figures.items() if f["status"] != "measured"}
    assert skipped <= {*SWEEP_ROWS, "jax_vs_torch"}
    assert doc["machine"]["jax"] == jax.__version__ and doc["elapsed_s"] > 0


def check_markdown(doc: dict, md: str) -> None:
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[0] == "| figure | measured | target | result | how it was measured |"
    body = rows[2:]  # after the header and its rule
    assert len(body) == len(doc["figures"])
    for line, f in zip(body, doc["figures"]):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == f["figure"] and cells[2] == f["target"]["text"]
        unmeasured = "-" if f["status"] == "measured" else f["status"]  # reported figures: "-"
        verdict = {True: "pass", False: "fail", None: unmeasured}[f["passed"]]
        assert cells[3] == verdict


def test_quick_figures_at_tiny_scale(tmp_path, monkeypatch):
    # the fit row finds the Chinchilla table in the checkout's data/reference/ by itself
    monkeypatch.delenv("CHINCHILLA_CSV", raising=False)
    doc, md = run_bench(tmp_path, QUICK)
    check_figures(doc, QUICK)
    check_markdown(doc, md)
    fit = doc["figures"][QUICK.index("fit_seconds")]
    assert fit["status"] == "measured" and fit["measured"]["starts"] == 108  # the small grid
    assert fit["measured"]["fit"]["alpha"] == pytest.approx(0.3473, abs=2e-3)
    for key in SWEEP_ROWS:
        assert doc["figures"][QUICK.index(key)]["status"] == "skipped", key


@pytest.mark.slow
def test_other_figures_at_tiny_scale(tmp_path):
    doc, md = run_bench(tmp_path, REST)
    check_figures(doc, REST)
    check_markdown(doc, md)


def test_table_holds_every_figure(tmp_path, monkeypatch):
    """The suite and report with every measurement stubbed: one row per figure, in order,
    errors kept as rows, verdicts following ratio and target."""
    from loopscale.bench import figures, suite
    from loopscale.bench.scale import TINY

    ratios = iter([0.5, 2.0, 1.0, 1.06, 0.2, 1.3, 0.3, 12.0, 0.4, 0.75, 0.45, None, 70.0, 4.3,
                   0.3, 0.35])

    def fake(ctx, key, title, target):
        ratio = next(ratios)
        if ratio is None:
            raise RuntimeError("no torch here\nsecond line")
        return result.measured(key, title, target, ratio, "stub", {"x_s": 1.0})

    specs = [dataclasses.replace(spec, measure=fake) for spec in FIGURES]
    monkeypatch.setattr(figures, "FIGURES", tuple(specs))
    doc = suite.run(TINY, str(tmp_path), stream=io.StringIO())
    assert [f["key"] for f in doc["figures"]] == list(TARGETS)
    verdicts = [f["passed"] for f in doc["figures"]]
    assert verdicts == [True, False, True, False, True, True, True, True, False, True, False,
                        None, None, False, None, None]
    assert doc["figures"][11]["status"] == "error"
    assert doc["figures"][11]["note"] == "error: RuntimeError: no torch here"
    assert [f["status"] for f in doc["figures"][12:]] == ["measured"] * 4
    written = json.loads((tmp_path / "results.json").read_text())
    assert [f["key"] for f in written["figures"]] == list(TARGETS)
    check_markdown(written, (tmp_path / "results.md").read_text())
    md = (tmp_path / "results.md").read_text()
    assert "| 40% | >= 70% | fail |" in md and "| 75% | >= 70% | pass |" in md
    assert "| 0.45 | >= 0.50 | fail |" in md
    assert "| 70 s | reported | - |" in md and "| 35% | reported | - |" in md
    assert "| 4.3 ms | <= 1 ms | fail |" in md


def test_figures_are_listed_once():
    keys = [spec.key for spec in FIGURES]
    assert keys == list(TARGETS) and len(set(keys)) == len(keys)


def test_unknown_figure_is_bad_input(capsys):
    assert cli.main(["bench", "--only=no_such_figure"]) == 2
    assert "no_such_figure" in capsys.readouterr().err


def test_interleaved_runs_variants_in_turn():
    calls = []
    t = timing.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                           reps=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert all(len(v.samples) == 3 and v.median >= 0 for v in t.values())
    samples = timing.interleaved_samples({"x": iter([9.0, 1.0, 3.0, 2.0]).__next__}, reps=3)
    assert samples["x"].median == 2.0  # the warm-up's 9.0 is dropped


def test_a_ratio_that_is_no_number_is_refused():
    target = result.Target("<=", 1.0, "<= 1.00")
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            result.measured("k", "t", target, bad, "", {})


def test_sweep_share_from_run_directories(tmp_path):
    for name, times, summary in (
            ("a", [0.5, 0.5], {"steps": 2, "wall_time_s": 4.0, "compile_time_s": 1.0}),
            ("b", [1.0], {"steps": 3, "wall_time_s": 6.0, "compile_time_s": 2.0})):  # logged 1 of 3
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        rows = [{"step": i + 1, "loss": 1.0, "step_time_s": s} for i, s in enumerate(times)]
        rows.append({"step": len(times), "eval_loss": 1.0})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "summary.json").write_text(json.dumps({"status": "completed", **summary}))
    got = sweep_share.share(str(tmp_path), wall_s=5.0, concurrency=2)
    assert got["runs"] == 2 and got["steps"] == 5
    assert got["step_s"] == pytest.approx(1.0 + 3.0)
    assert got["share_of_sweep"] == pytest.approx(4.0 / 10.0)
    assert got["share_of_runs"] == pytest.approx(4.0 / 10.0)
    assert got["compile_share_of_sweep"] == pytest.approx(3.0 / 10.0)


def _fake_run(root, name, *, d_model, times, steps, per_token, computed, batch=2, seq=4,
              branch_step=0):
    """A finished run directory as the trainer writes it, with only the fields the bench reads."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    rows = [{"step": branch_step + i + 1, "loss": 1.0, "step_time_s": s}
            for i, s in enumerate(times)]
    rows.append({"step": steps, "eval_loss": 1.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = {"batch_size": batch, "seq_len": seq,
             "branch_from": "trunk" if branch_step else "", "branch_step": branch_step}
    (run / "config.json").write_text(json.dumps({"model": {"d_model": d_model}, "train": train}))
    (run / "summary.json").write_text(json.dumps(
        {"status": "completed", "steps": steps, "wall_time_s": 10.0, "compile_time_s": 1.0,
         "flop_convention": "6n_emb", "flops_per_token_train": per_token,
         "flops_per_token_computed": computed}))


def test_flop_rate_from_run_directories(tmp_path):
    # a: 3 steps of 2 x 4 tokens, every step logged; b: a cooldown branch from step 10 to 14,
    # 2 of its 4 steps logged (their mean stands for the other two; the trunk's 10 steps are
    # not its own); c: 2 steps
    _fake_run(tmp_path, "a", d_model=8, times=[0.5, 0.5, 0.5], steps=3, per_token=100.0,
              computed=150.0)
    _fake_run(tmp_path, "b", d_model=16, times=[1.0, 1.0], steps=14, per_token=200.0,
              computed=260.0, branch_step=10)
    _fake_run(tmp_path, "c", d_model=24, times=[0.25, 0.25], steps=2, per_token=300.0,
              computed=330.0)
    got = sweep_share.flop_rate(str(tmp_path))
    assert got["runs"] == 3 and got["median_d_model"] == 16
    assert [r["steps"] for r in got["per_run"]] == [3, 4, 2]
    assert got["tokens"] == 8 * (3 + 4 + 2)
    assert got["step_s"] == pytest.approx(1.5 + 4.0 + 0.5)
    assert got["flops"] == pytest.approx(24 * 100.0 + 32 * 200.0 + 16 * 300.0)  # 13,600
    assert got["flops_per_s"] == pytest.approx(13600 / 6.0)
    assert got["computed_flops_per_s"] == pytest.approx((24 * 150 + 32 * 260 + 16 * 330) / 6.0)
    assert got["flop_convention"] == "6n_emb"
    # the share rows read the same directories: the branch counts its own 4 steps only
    share = sweep_share.share(str(tmp_path), wall_s=6.0, concurrency=2)
    assert share["steps"] == 9 and share["step_s"] == pytest.approx(6.0)
    assert share["share_of_runs"] == pytest.approx(6.0 / 30.0)


def test_demo_vs_lean_flops_arithmetic(tmp_path, monkeypatch):
    """The figure's ratio from a synthetic sweep and a lean step of known time: demo FLOP/s
    (summed over runs) / (the median width's FLOPs per token x tokens / lean median)."""
    from loopscale import flops
    from loopscale.bench import figures, steps
    from loopscale.bench.scale import TINY

    _fake_run(tmp_path, "a", d_model=16, times=[0.002] * 4, steps=4, per_token=4e4,
              computed=7e4, batch=8, seq=64)
    _fake_run(tmp_path, "b", d_model=24, times=[0.004] * 2, steps=2, per_token=1.2e5,
              computed=1.7e5, batch=8, seq=64)
    config = steps.load("base.py:tiny", [
        "--config.model.d_model=16", "--config.model.n_heads=4", "--config.model.head_dim=4",
        "--config.model.d_ff=43", "--config.model.n_unique=4", "--config.train.batch_size=8",
        "--config.train.seq_len=64", "--config.flop_convention=6n_emb"])
    sub = sweep_share.Subsweep("sweeps/isoflop_cpu.py", ("--sweep.select=base",), 2, 30.0,
                               sweep_share.share(str(tmp_path), 30.0, 2),
                               sweep_share.flop_rate(str(tmp_path)), config)

    class FakeLean:  # no compile: the lean step's time is given below
        compile_s = 0.5

        def __init__(self, config, batch):
            assert batch["inputs"].shape == (8, 64)

    monkeypatch.setattr(figures.lean, "LeanStep", FakeLean)
    ctx = figures.Context(dataclasses.replace(TINY, sweep=("--sweep.select=base",)))
    monkeypatch.setattr(ctx, "subsweep", lambda: sub)
    monkeypatch.setattr(ctx, "time", lambda v: {"lean": timing.Timing((0.004, 0.001, 0.002))})
    target = result.Target(">=", 0.5, ">= 0.50")
    fig = figures.demo_vs_lean_flops(ctx, "demo_vs_lean_flops", "t", target)

    demo = (4 * 512 * 4e4 + 2 * 512 * 1.2e5) / (4 * 0.002 + 2 * 0.004)
    per_token = flops.flops_per_token(config.model, 64, config.flop_convention)
    assert per_token == 6 * flops.param_counts(config.model)["params_active"]
    lean_rate = per_token * 512 / 0.002  # the lean step's median
    assert fig.ratio == pytest.approx(demo / lean_rate)
    assert fig.measured["lean_flops_per_s"] == pytest.approx(lean_rate)
    computed = flops.computed_flops_per_token(config.model, 64) * 512 / 0.002
    demo_computed = (4 * 512 * 7e4 + 2 * 512 * 1.7e5) / 0.016
    assert fig.measured["ratio_computed"] == pytest.approx(demo_computed / computed)
    assert "d_model 16" in fig.note and "6n_emb" in fig.note
    runs = figures.sweep_runs_share(ctx, "sweep_runs_share", "t", target)
    assert runs.ratio == pytest.approx(0.016 / 20.0)  # step seconds / the runs' 2 x 10 s
