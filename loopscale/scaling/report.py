"""report.md and index.html of `loopscale report`, both from one outline of the fit.

The numbers come from the fit.json document (fit.to_json), so the report says exactly what
fit.json says. `outline` turns it into sections of plain-text blocks (paragraphs, tables,
bullet lists, figure references); `to_markdown` and `to_html` only render that outline, each
escaping every piece of text for its format (family names, run ids and statuses come from the
user's table and may hold `|`, `<` or `&`). The HTML page is static: inline CSS, relative links
to the figures, no script.
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Sequence
from typing import Any

# Figures shown per approach (fit.json key, column header); the laws are in the notes.
ISOFLOP_COLUMNS = (("a", "a"), ("b", "b"), ("alpha", "α"), ("alpha_N", "α_N"), ("E", "E"),
                   ("alpha_E", "α_E"), ("alpha_U", "α_U"), ("u", "u"))
ISOFLOP_NOTE = ("IsoFLOP (Chinchilla approach 2), power laws through the per-budget minima: "
                "N_opt ∝ C^a, D_opt ∝ C^b, L_opt = A·C^-α, L_opt = A_N·N_opt^-α_N (the "
                "sparse-layers study's form), L_opt = E + A_E·C^-α_E, and with unique "
                "parameters U: L_opt = A_U·U_opt^-α_U, U_opt ∝ C^u.")
PARAMETRIC_COLUMNS = (("E", "E"), ("A", "A"), ("B", "B"), ("alpha", "α"), ("beta", "β"),
                      ("a", "a"), ("b", "b"), ("residual_sd", "residual SD (nats)"),
                      ("lack_of_fit_90_halfwidth", "90% lack of fit ±"))
PARAMETRIC_NOTE = ("Parametric (Chinchilla approach 3): L = E + A/N^α + B/D^β fitted to every "
                   "run; its compute-optimal allocation under C = 6ND is N_opt ∝ C^a, "
                   "D_opt ∝ C^b. Goodness of fit: the residual SD of L − L̂ in nats, and "
                   "Marin's "
                   "90% lack-of-fit half-width (Student t at n − p degrees of freedom).")
PAIR_COLUMNS = (("compute_multiplier", "compute × (pure law)"),
                ("compute_multiplier_saturating", "compute × (saturating)"),
                ("compute_multiplier_parametric", "compute × (parametric)"),
                ("unique_params_ratio", "unique params ratio"),
                ("unique_params_ratio_saturating", "unique params ratio (saturating)"))
# The short table the command prints: (approach, figure).
PRINTED = (("isoflop", "a"), ("isoflop", "b"), ("isoflop", "alpha"), ("isoflop", "alpha_N"),
           ("parametric", "alpha"), ("parametric", "beta"))


@dataclasses.dataclass(frozen=True)
class Num:
    """A table cell holding a figure and its interval, so HTML can set the interval apart."""

    value: str
    ci: str = ""

    def __str__(self) -> str:
        return f"{self.value} {self.ci}".rstrip()


@dataclasses.dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str | Num, ...], ...]


@dataclasses.dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FigureRef:
    stem: str  # STEM.png is shown, STEM.svg linked
    title: str
    caption: str


@dataclasses.dataclass(frozen=True)
class Section:
    title: str
    anchor: str
    blocks: tuple[Any, ...]  # str (a paragraph) | Table | Bullets | FigureRef


def num(v: Any) -> str:
    return "–" if v is None else f"{v:.4g}"


def with_ci(v: Any, ci: Any, why: str | None = None) -> Num:
    """A figure and its interval; `why` (e.g. "not identified (26% of refits failed)") stands
    in for an interval the bootstrap could not give."""
    if v is not None and why:
        return Num(num(v), why)
    return Num(num(v), "" if v is None or ci is None else f"[{num(ci[0])}, {num(ci[1])}]")


def fig_ci(fit: dict[str, Any], key: str) -> Num:
    """with_ci of fit.json's figure `key` of one fit object (its X, X_ci, not_identified)."""
    return with_ci(fit.get(key), fit.get(f"{key}_ci"), fit.get("not_identified", {}).get(key))


# --- the outline --------------------------------------------------------------------------

def outline(doc: dict[str, Any], figures: Sequence[FigureRef]) -> list[Section]:
    t, o = doc["table"], doc["options"]
    intervals = (f"{100 * o['level']:g}% percentile cluster-bootstrap intervals over "
                 f"{o['bootstrap']} resamples (seed {o['seed']}): {_resampling(doc)}; a figure "
                 "whose refits failed on more than 10% of the resamples has no interval and "
                 "is marked 'not identified', since an interval over the survivors would be "
                 "too narrow" if o["bootstrap"] else "no bootstrap, so no intervals")
    summary = (f"{t['source']}: {t['rows']} rows, {t['fitted']} runs fitted, {t['excluded']} "
               f"excluded, {len(doc['families'])} famil{'y' if len(doc['families']) == 1 else 'ies'}"
               f" ({', '.join(doc['families'])}). N = {t['params_column']}, D = "
               f"{t['tokens_column']}, L = {t['loss_column']}, C = {t['flops']}; budgets: "
               f"{t['budgets']}. Per-budget minima by {'smoothing spline' if o['spline'] else 'parabola'}"
               f" in ln N; {intervals}.")
    warnings = doc["warnings"]
    sections = [
        Section("Summary", "summary", (summary,)),
        Section("Warnings", "warnings",
                (Bullets(tuple(warnings)),) if warnings else ("None.",)),
        Section("Exponents", "exponents", (
            _counts_note(doc), ISOFLOP_NOTE, _family_table(doc, "isoflop", ISOFLOP_COLUMNS),
            _failures(doc, "isoflop"),
            PARAMETRIC_NOTE, _family_table(doc, "parametric", PARAMETRIC_COLUMNS),
            _failures(doc, "parametric"), *_attn(doc))),
        Section("IsoFLOP estimators", "estimators", _estimators(doc)),
        Section("Family comparison", "comparison", _comparison(doc)),
    ]
    if "holdout" in doc:
        sections.append(Section("Held-out prediction", "holdout", _holdout(doc)))
    if "recurrence" in doc:
        from loopscale.scaling.recurrence import report_lines

        sections.append(Section("Recurrence law", "recurrence", (
            RECURRENCE_NOTE, Bullets(tuple(report_lines(doc["recurrence"]))))))
    return sections + [
        Section("Figures", "figures", tuple(figures)),
        Section("IsoFLOP minima", "minima", _minima(doc)),
        Section("Excluded runs", "excluded", _excluded(doc)),
    ]


RECURRENCE_NOTE = ("The iso-depth law (Schwethelm et al. 2026) fitted across the runs that share "
                   "a backbone: L = E + A·(N_once + r^φ·N_rec)^-α + B·D^-β, N_rec the looped "
                   "block's parameters, N_once the rest, r the loop count; φ = 0: a loop pass "
                   "adds nothing, φ = 1: it is worth new parameters (the paper: φ = 0.46).")


def _resampling(doc: dict[str, Any]) -> str:
    units = {f[k]["bootstrap"]["resampling"] for f in doc["families"].values()
             for k in ("isoflop", "parametric") if f[k].get("bootstrap")}
    return "; ".join(sorted(units)) or "no bootstrap ran"


def _counts_note(doc: dict[str, Any]) -> str:
    c = next(iter(doc["families"].values()))["isoflop"]["counts"]
    conv = ", ".join(c["flop_convention"]) if c["flop_convention"] else "not stated by the table"
    return (f"Every exponent below is relative to N = {c['params']} ({c['params_meaning']}) and "
            f"C = {c['flops']} (FLOP convention: {conv}).")


def _failures(doc: dict[str, Any], approach: str) -> str:
    parts = []
    for name, fam in doc["families"].items():
        b = fam[approach].get("bootstrap")
        if b:
            parts.append(f"{name} {b['failed']}/{b['resamples']} ({100 * b['failed_share']:.0f}%)"
                         f" over {b['clusters']} clusters")
    return ("Failed bootstrap refits: " + "; ".join(parts) + ".") if parts else ""


def _attn(doc: dict[str, Any]) -> tuple[Any, ...]:
    fams = doc["families"]
    if all(f["isoflop"]["under_6n_attn"].get("a") is None for f in fams.values()):
        return ()
    keys = (("a", "a"), ("b", "b"), ("alpha", "α"), ("alpha_N", "α_N"))
    rows = tuple((name, *(num(f["isoflop"]["under_6n_attn"].get(k)) for k, _ in keys),
                  *(num(f["isoflop"].get(k)) for k, _ in keys)) for name, f in fams.items())
    return ("The headline IsoFLOP exponents with each budget's compute counted as 6N plus the "
            "T×T attention matmuls (6n_attn; small models are where 6N undercounts), beside "
            "the table's own convention (point values; no bootstrap).",
            Table(("family", *(f"{label} (6n_attn)" for _, label in keys),
                   *(label for _, label in keys)), rows))


def _estimators(doc: dict[str, Any]) -> tuple[Any, ...]:
    rows = []
    for name, fam in doc["families"].items():
        iso, alt = fam["isoflop"], fam["isoflop"]["alternative"]
        est = iso["estimator"]
        rows.append((name, est["headline"], num(iso.get("a")), str(iso["budgets_used"]),
                     alt["method"], num(alt.get("a")), str(alt["budgets_used"]),
                     est["warning"] or est["reason"]))
    return ("Approach 2 is biased by the width of the size grid and by where the minimum falls "
            "in it (arXiv 2603.22339): each budget's centring (0 = smallest size, 1 = largest) "
            "is in the minima table, and the exponent a (N_opt ∝ C^a) is shown under both "
            "estimators. The headline uses the one named first.",
            Table(("family", "headline", "a", "budgets", "other", "a (other)", "budgets",
                   "why / warning"), tuple(rows)))


def _holdout(doc: dict[str, Any]) -> tuple[Any, ...]:
    h = doc["holdout"]
    rows = []
    for name, f in h["families"].items():
        if "train_budgets" not in f:  # no runs at the held-out budget
            rows.append((name, f"skipped: {f['skipped']}") + ("",) * 6)
            continue
        trained = ", ".join(num(b) for b in f["train_budgets"]) or "–"
        if f["skipped"]:  # no IsoFLOP law; the parametric fit may still predict
            trained += f" (IsoFLOP: {f['skipped']})"
        rows.append((name, trained,
                     fig_ci(f, "predicted_loss"), fig_ci(f, "observed_loss"), fig_ci(f, "error"),
                     fig_ci(f, "error_saturating"), num(f.get("error_parametric")),
                     fig_ci(f, "error_log_n_opt")))
    return (f"Leave-future-out check: every fit refitted on the budgets below C = "
            f"{num(h['budget'])} ({h['spec']}), its prediction of that budget's loss-optimal "
            "loss and size against the budget's own minimum. Errors are predicted − observed "
            "(nats; ln N_opt), intervals from one cluster bootstrap of training and held-out "
            "runs together.",
            Table(("family", "trained on C", "predicted L_opt", "observed L_opt",
                   "error (pure law)", "error (saturating)", "error (parametric)",
                   "error ln N_opt"), tuple(rows)))


def _family_table(doc: dict[str, Any], approach: str, columns) -> Table:
    fams = doc["families"]
    # Columns no family has (alpha_U without params_unique) are dropped, not shown empty.
    columns = [(k, label) for k, label in columns
               if any(f[approach].get(k) is not None for f in fams.values())]
    header = ("family", "runs", "budgets used") if approach == "isoflop" else ("family", "runs")
    rows = []
    for name, fam in fams.items():
        fit = fam[approach]
        lead = (name, str(fam["runs"])) + ((str(fit["budgets_used"]),)
                                           if approach == "isoflop" else ())
        if fit.get("skipped") and all(fit.get(k) is None for k, _ in columns):
            rows.append(lead + (f"skipped: {fit['skipped']}",) + ("",) * (len(columns) - 1))
        else:
            rows.append(lead + tuple(fig_ci(fit, k) for k, _ in columns))
    if not columns:  # no family has this fit: one column saying why for each
        return Table(header + ("fit",), tuple(
            r[:len(header)] + (f"skipped: {fam[approach].get('skipped') or 'no figures'}",)
            for r, fam in zip(rows, fams.values())))
    return Table(header + tuple(label for _, label in columns), tuple(rows))


def _comparison(doc: dict[str, Any]) -> tuple[Any, ...]:
    pairs = doc["comparison"]["pairs"]
    if not pairs:
        return ("One family: nothing to compare.",)
    columns = [(k, label) for k, label in PAIR_COLUMNS if any(p[k] is not None for p in pairs)]
    rows = []
    for p in pairs:
        at = (f"C = {num(p['target_compute'])} (L = {num(p['target_loss'])})"
              if p["target"] == "compute" else f"L = {num(p['target_loss'])}")
        rows.append((f"{p['other']} vs {p['reference']}", at)
                    + tuple(fig_ci(p, k) for k, _ in columns)
                    + (p.get("extrapolation") or "within the fitted budgets",))
    note = ("Compute multiplier: how many times the reference's compute the other family needs "
            "for the same loss (> 1: the other is less compute-efficient), on each frontier. "
            "Unique params ratio: the other's stored parameters over the reference's at that loss.")
    return (note, Table(("pair", "at") + tuple(label for _, label in columns)
                        + ("fitted range",), tuple(rows)))


def _minima(doc: dict[str, Any]) -> tuple[Any, ...]:
    rows, hidden = [], 0
    for name, fam in doc["families"].items():
        for m in fam["isoflop"]["minima"]:
            if m["sizes"] < 3:
                hidden += 1  # a table not from an IsoFLOP sweep has many; the warnings count them
                continue
            rows.append((name, num(m["budget"]), str(m["sizes"]), str(m["runs"]),
                         fig_ci(m, "params_opt"), fig_ci(m, "tokens_opt"), fig_ci(m, "loss_opt"),
                         num(m.get("centring")), num(m.get("grid_dex")),
                         f"{m.get('alt_method') or '–'}: {num(m.get('alt_params_opt'))}",
                         "yes" if m["used"] else "no", m["reason"] or ""))
    blocks: list[Any] = []
    if rows:
        blocks.append(Table(("family", "budget C", "sizes", "runs", "N_opt", "D_opt", "L_opt",
                             "centring", "grid (dex)", "other estimator's N_opt", "used",
                             "why not used"), tuple(rows)))
    if hidden or not rows:
        blocks.append(f"{hidden} budget(s) with under 3 model sizes have no minimum and are "
                      "not listed.")
    return tuple(blocks)


def _excluded(doc: dict[str, Any]) -> tuple[Any, ...]:
    rows = tuple((str(e["row"]), e["run"] or "", e["family"] or "", e["status"] or "",
                  e["reason"]) for e in doc["excluded"])
    if not rows:
        return ("None: every row was fitted.",)
    return (f"{len(rows)} row(s) of the table were not fitted (row: 0-based data row).",
            Table(("row", "run", "family", "status", "reason"), rows))


# --- Markdown -----------------------------------------------------------------------------

def _md(text: str) -> str:
    # Enough for table cells and paragraphs: `|` would split a cell, `<` open raw HTML.
    text = " ".join(str(text).split())
    for raw, escaped in (("\\", "\\\\"), ("|", "\\|"), ("<", "&lt;"), (">", "&gt;")):
        text = text.replace(raw, escaped)
    return text


def to_markdown(title: str, sections: Sequence[Section]) -> str:
    out = [f"# {_md(title)}", ""]
    for s in sections:
        out += [f"## {_md(s.title)}", ""]
        for block in s.blocks:
            if isinstance(block, Table):
                out.append("| " + " | ".join(_md(h) for h in block.header) + " |")
                out.append("|" + "---|" * len(block.header))
                out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in block.rows]
            elif isinstance(block, Bullets):
                out += [f"- {_md(item)}" for item in block.items]
            elif isinstance(block, FigureRef):
                out += [f"### {_md(block.title)}", "",
                        f"![{_md(block.title)}]({block.stem}.png)", "",
                        f"{_md(block.caption)} ([SVG]({block.stem}.svg))"]
            else:
                out.append(_md(block))
            out.append("")
    return "\n".join(out)


# --- HTML ---------------------------------------------------------------------------------

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1180px; padding: 1.5em 2em 4em; color: #1d1d1f; line-height: 1.45; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em;
     margin-top: 1.8em; }
nav a { margin-right: 1em; }
.wrap { overflow-x: auto; margin: .6em 0 1em; }
table { border-collapse: collapse; font-size: .84em; }
th, td { border: 1px solid #d0d0d7; padding: .3em .45em; text-align: left; vertical-align: top; }
th { background: #f1f1f5; } tr:nth-child(even) td { background: #fafafc; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.ci { display: block; color: #666; font-size: .88em; }
figure { margin: 1.2em 0 2em; } figure img { max-width: 100%; height: auto;
     border: 1px solid #e4e4ea; }
figcaption { font-size: .9em; color: #444; margin-top: .3em; }
li { margin: .2em 0; }
"""


def _h(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _html_cell(cell: str | Num) -> str:
    if isinstance(cell, Num) and cell.ci:
        return f'<td class="num">{_h(cell.value)}<span class="ci">{_h(cell.ci)}</span></td>'
    return f'<td class="num">{_h(cell)}</td>' if isinstance(cell, Num) else f"<td>{_h(cell)}</td>"


def to_html(title: str, sections: Sequence[Section]) -> str:
    nav = " ".join(f'<a href="#{_h(s.anchor)}">{_h(s.title)}</a>' for s in sections)
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{_h(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
           f"<h1>{_h(title)}</h1>", f"<nav>{nav}</nav>"]
    for s in sections:
        out.append(f'<section id="{_h(s.anchor)}">')
        out.append(f"<h2>{_h(s.title)}</h2>")
        for block in s.blocks:
            if isinstance(block, Table):
                head = "".join(f"<th>{_h(c)}</th>" for c in block.header)
                body = "\n".join("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>"
                                 for row in block.rows)
                out.append(f'<div class="wrap"><table><thead><tr>{head}</tr></thead>'
                           f"<tbody>\n{body}\n</tbody></table></div>")
            elif isinstance(block, Bullets):
                out.append("<ul>" + "".join(f"<li>{_h(i)}</li>" for i in block.items) + "</ul>")
            elif isinstance(block, FigureRef):
                png, svg = _h(f"{block.stem}.png"), _h(f"{block.stem}.svg")
                out.append(f'<figure id="fig-{_h(block.stem)}"><h3>{_h(block.title)}</h3>'
                           f'<a href="{svg}"><img src="{png}" alt="{_h(block.title)}"></a>'
                           f'<figcaption>{_h(block.caption)} Vector version: '
                           f'<a href="{svg}">{svg}</a>.</figcaption></figure>')
            else:
                out.append(f"<p>{_h(block)}</p>")
        out.append("</section>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


# --- the printed table and files ------------------------------------------------------------

def exponents_text(doc: dict[str, Any]) -> str:
    """Families as columns, the main exponents as rows, each value with its interval."""
    names = list(doc["families"])
    cells = [["", *names]]
    for approach, figure in PRINTED:
        row = doc["comparison"]["exponents"].get(approach, {}).get(figure, {})
        cells.append([f"{approach} {figure}",
                      *(str(with_ci(row.get(n), row.get(f"{n}_ci"))) for n in names)])
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)
