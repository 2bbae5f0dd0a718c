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
    "jax_vs_torch": ("<=", 1.5),
    "fit_seconds": ("reported", None),  # seconds, no target
    "mfu_base": ("reported", None),  # XLA's estimate for the paper run on v5p-128
    "mfu_looped": ("reported", None),
}


# Every figure's machinery runs at the tiny scale: the cheaper half in the quick pass, the
# rest (two compiles or more each) with the slow tests; the table's plumbing is checked for
# every figure at once with the measurements stubbed. The bench keeps the train steps it
# compiled for the process (figures._STEPS), so when both tests run in one process the second
# times the steps the first compiled (Base, Looped and Looped with its loops in Python) rather
# than compiling them again; run alone, each compiles what it needs.
QUICK = ("base_vs_lean", "looped_vs_base", "data_vs_step", "sweep_time_share", "jax_vs_torch",
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
    assert skipped <= {"sweep_time_share", "jax_vs_torch"}
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
    assert doc["figures"][QUICK.index("sweep_time_share")]["status"] == "skipped"


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

    ratios = iter([0.5, 2.0, 1.0, 1.06, 0.2, 1.3, 0.3, 12.0, 0.4, None, 70.0, 0.3, 0.35])

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
    assert verdicts == [True, False, True, False, True, True, True, True, False, None,
                        None, None, None]
    assert doc["figures"][9]["status"] == "error"
    assert doc["figures"][9]["note"] == "error: RuntimeError: no torch here"
    assert [f["status"] for f in doc["figures"][10:]] == ["measured"] * 3  # reported, no verdict
    written = json.loads((tmp_path / "results.json").read_text())
    assert [f["key"] for f in written["figures"]] == list(TARGETS)
    check_markdown(written, (tmp_path / "results.md").read_text())
    md = (tmp_path / "results.md").read_text()
    assert "| 40% | >= 70% | fail |" in md
    assert "| 70 s | reported | - |" in md and "| 35% | reported | - |" in md


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
