"""`loopscale report` end to end: a synthetic four-family sweep and the Chinchilla table.

Checks the files, not the pixels: every figure is a valid PNG and SVG, index.html parses and
links every figure, report.md carries the exponents and the excluded runs with their reasons,
and user text is escaped. (The page was looked at in headless Chromium by hand; the tests do
not need a browser.)
"""

import json
import struct
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from loopscale import checkout
from loopscale.cli import main
from loopscale.scaling import plots

CHINCHILLA = checkout.reference_table(checkout.CHINCHILLA)
STEMS = [stem for stem, *_ in plots.FIGURES]
ALPHA, BETA, E, A, B = 0.34, 0.30, 1.7, 400.0, 1500.0
# family -> (S: needs S x params and S x tokens for the same loss, stored/active params)
FAMILIES = {"Base": (1.0, 1.0), "Looped": (1.4, 0.5), "MoE": (0.8, 4.0),
            "Looped-MoE": (0.9, 2.0)}
ODD_STATUS = 'failed: OOM <rank 3> & "retry" | later'


def synthetic_table(path):
    """L(N, D) = E + A (N/S)^-alpha + B (D/S)^-beta with 0.2% noise, four budgets, 5-7 sizes
    around each optimum (MoE's largest budget shifted so its minimum is on the grid's edge),
    plus a diverged, a failed and a running run."""
    rng = np.random.default_rng(0)
    G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    rows = []
    for family, (s, stored) in FAMILIES.items():
        for j, c in enumerate(np.logspace(18, 20, 4)):
            n_opt = s * G * (c / (6 * s * s)) ** (BETA / (ALPHA + BETA))
            k = 5 + (j % 3)
            shift = 0.6 if family == "MoE" and j == 3 else 0.0
            for i, n in enumerate(n_opt * np.logspace(-.5 + shift, .5 + shift, k)):
                d = c / (6 * n)
                loss = (E + A * (n / s) ** -ALPHA + B * (d / s) ** -BETA) * np.exp(
                    rng.normal(0, 0.002))
                rows.append({"run_id": f"{family}-{c:.0e}-{i}", "family": family,
                             "params": n, "params_unique": stored * n, "tokens": d,
                             "flops": 6 * n * d, "loss": loss, "status": "completed"})
    first = {r["family"]: r for r in reversed(rows)}
    rows.append(dict(first["Base"], run_id="Base-diverged", status="diverged", loss=11.0))
    rows.append(dict(first["Looped"], run_id="Looped&co-failed", status=ODD_STATUS,
                     loss=np.nan))
    rows.append(dict(first["MoE"], run_id="MoE-running", status="running", loss=np.nan))
    pd.DataFrame(rows).to_csv(path, index=False)


def chinchilla_table(path):
    df = pd.read_csv(CHINCHILLA)
    n, c = df["Model Size"], df["Training FLOP"]
    pd.DataFrame({"params": n, "tokens": c / (6 * n), "flops": c, "loss": df["loss"]}).to_csv(
        path, index=False)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    synthetic_table(folder / "results.csv")
    out = folder / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # an unrelated file the report must leave alone
    assert main(["report", str(folder), f"--out={out}", "--grid=small", "--bootstrap=30",
                 "--seed=1"]) == 0
    return out


@pytest.fixture(scope="module")
def chinchilla(tmp_path_factory):
    if not CHINCHILLA.exists():
        pytest.skip(f"{CHINCHILLA} not present")
    folder = tmp_path_factory.mktemp("chinchilla")
    chinchilla_table(folder / "chinchilla.csv")
    out = folder / "report"
    assert main(["report", str(folder / "chinchilla.csv"), f"--out={out}", "--grid=small",
                 "--bootstrap=20"]) == 0
    return out


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.text = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[k] for k in ("src", "href") if k in attrs]

    def handle_data(self, data):
        self.text.append(data)


def parsed(out):
    page = Links()
    page.feed((out / "index.html").read_text())
    page.close()
    return page


@pytest.mark.parametrize("which", ["synthetic", "chinchilla"])
def test_files_figures_and_page(which, request):
    out = request.getfixturevalue(which)
    for stem in STEMS:
        width, height = png_size(out / f"{stem}.png")
        assert width > 300 and height > 200
        assert ET.parse(out / f"{stem}.svg").getroot().tag.endswith("svg")
    page = parsed(out)
    for stem in STEMS:
        assert f"{stem}.png" in page.links and f"{stem}.svg" in page.links
    assert all(not link.startswith(("http:", "https:", "/")) for link in page.links
               if not link.startswith("#"))
    doc = json.loads((out / "fit.json").read_text())
    assert doc["schema_version"] == 2
    md = (out / "report.md").read_text()
    for stem in STEMS:
        assert f"({stem}.png)" in md


def test_report_lists_exponents_and_excluded_runs(synthetic):
    doc = json.loads((synthetic / "fit.json").read_text())
    md = (synthetic / "report.md").read_text()
    assert list(doc["families"]) == list(FAMILIES)
    for name in FAMILIES:
        fam = doc["families"][name]
        alpha, ci = fam["parametric"]["alpha"], fam["parametric"]["alpha_ci"]
        assert alpha == pytest.approx(ALPHA, abs=0.03)
        assert f"{alpha:.4g} [{ci[0]:.4g}, {ci[1]:.4g}]" in md
        assert f"{fam['isoflop']['a']:.4g} [" in md
    assert "| Base-diverged | Base | diverged | status diverged |" in md
    assert "| MoE-running | MoE | running | status running |" in md
    # `|` and `<` in user text are escaped so the table keeps its columns
    assert "OOM &lt;rank 3&gt; & \"retry\" \\| later" in md
    assert "Looped-MoE vs Base" in md and "compute × (pure law)" in md
    assert "minimum on the edge" in md  # MoE's shifted budget, in the warnings


def test_html_escapes_user_text(synthetic):
    raw = (synthetic / "index.html").read_text()
    assert "OOM &lt;rank 3&gt; &amp; &quot;retry&quot; | later" in raw
    assert "<rank 3>" not in raw
    text = "".join(parsed(synthetic).text)
    assert ODD_STATUS in text and "Looped&co-failed" in text


def test_unrelated_files_kept_and_nothing_half_written(synthetic):
    assert (synthetic / "notes.txt").read_text() == "mine"
    assert not [p.name for p in synthetic.iterdir() if p.name.startswith(".")]


def test_chinchilla_exponents(chinchilla):
    doc = json.loads((chinchilla / "fit.json").read_text())
    fam = doc["families"]["all"]
    assert 0.4 < fam["isoflop"]["a"] < 0.65  # Hoffmann et al.: a ~ 0.5
    assert "under 3 model sizes" in (chinchilla / "report.md").read_text()


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    (tmp_path / "runs" / "r0").mkdir(parents=True)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"params": [1.0, 2.0], "loss": [3.0, 2.0]}).to_csv(bad, index=False)
    for source, words in ((tmp_path, "holds no runs"), (tmp_path / "runs", "results.csv"),
                          (bad, "missing column 'tokens'"), (tmp_path / "nope.csv", "no such")):
        assert main(["report", str(source), f"--out={tmp_path / 'out'}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("loopscale report: error:")
        assert words in err
    assert not (tmp_path / "out").exists()


def test_a_family_with_too_little_data_is_reported_with_why(tmp_path, capsys):
    """A family with no IsoFLOP minimum and no parametric fit, beside one that fits: its
    plots are empty and say so, the tables say why. (A table where no family fits at all is
    bad input: tests/test_bad_input.py.)"""
    name = "A<b>|x"
    weak = pd.DataFrame({"params": [1e6, 2e6, 4e6], "tokens": [1e9, 1e9, 2e9],
                         "loss": [3.0, 2.9, 2.8], "family": [name] * 3})
    n = np.array([1e6, 2e6, 4e6, 8e6] * 2)
    c = np.repeat([1e15, 4e15], 4)
    ok = pd.DataFrame({"params": n, "tokens": c / (6 * n), "family": "ok",
                       "loss": 1.7 + 400 / n ** 0.34 + 400 / (c / (6 * n)) ** 0.28})
    pd.concat([weak, ok]).to_csv(tmp_path / "results.csv", index=False)
    assert main(["report", str(tmp_path / "results.csv"), f"--out={tmp_path / 'r'}",
                 "--bootstrap=0", "--grid=small"]) == 0
    for stem in STEMS:
        png_size(tmp_path / "r" / f"{stem}.png")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "skipped: 3 runs; the parametric fit needs at least 6" in md
    assert "A&lt;b&gt;\\|x" in md
    assert name in "".join(parsed(tmp_path / "r").text)
    assert "A&lt;b&gt;|x" in (tmp_path / "r" / "index.html").read_text()
    assert "index.html" in capsys.readouterr().out
