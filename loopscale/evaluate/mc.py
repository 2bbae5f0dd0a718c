"""`loopscale eval --what=mc`: downstream multiple-choice accuracy, OLMES-style (Gu et al.
2024): every task in both formulations, cloze (CF) and lettered multiple-choice (MCF), each
choice scored by its continuation's log-likelihood (mc_score.py) and the highest score taken as
the model's answer. The tasks, `--tasks` entries (comma-separated):

    FILE.jsonl     a local task file, prompts built from it (mc_tasks.py; docs/mc_tasks.md)
    olmes          OLMES's core nine from its own request files (olmes.py): ARC-Challenge,
                   ARC-Easy, BoolQ, CommonsenseQA, HellaSwag, OpenBookQA, PIQA, Social IQa,
                   WinoGrande, their prompts and shots as OLMES wrote them
    olmes:TASK     one of those (olmes.TASKS)
    (none)         the shipped KJV verse task

and `mc_limit=N`, which eval.py's `--mc_limit=N` adds: only the first N questions of every task
are scored (a tiny model on a CPU, or a quick look). The entries, limit included, are the
result's identity (`fingerprint`).

Normalisations of a choice's score (CF; MCF letters are all alike, so only `none`):

    none    sum of the continuation's token log-probabilities
    token   that sum / the continuation's tokens
    char    that sum / the continuation's characters (leading space included)
    pmi     log P(continuation | prompt) - log P(continuation | task.unconditional, "Answer:")

Accuracy comes with a 95% percentile bootstrap interval over the questions
(`scipy.stats.bootstrap`, seeded). mc.json holds, for each task T, formulation F and
normalisation N, the top-level figures `T_F_N_accuracy`, `T_F_N_low`, `T_F_N_high` (collect's
columns `mc_T_F_N_accuracy`, ...), `T_chance` (a uniform guess's expected accuracy) and
`T_F_truncated` (the share of questions whose prompt was cut on the left to fit the model's
sequence length: few-shot prompts of a short-context model lose their first shots); and the
same as a list under `results`.

An OLMES task is named `olmes_T` (T as olmes.TASKS spells it) and scored as OLMES does: its CF
figures in `none`, `token`, `char` and, where its files hold the unconditional requests, `pmi`;
each formulation's score `olmes_T_F_score` the accuracy under the normalisation its config.json
names as primary (PRIMARY); the task's score `olmes_T_score` the better of the two (the paper's
max over CF and MCF); and, when all nine are scored, `olmes_average`, their mean: the headline.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import scipy.stats

from loopscale.errors import UsageError
from loopscale.evaluate import olmes
from loopscale.evaluate.mc_score import Request, Scores, loglikelihoods, run_tokenizer
from loopscale.evaluate.mc_tasks import Formulation, Question, Task, chance, load_tasks, questions

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
LIMIT = "mc_limit="  # the --tasks entry of --mc_limit=N


class Normalisation(str, enum.Enum):
    NONE = "none"
    TOKEN = "token"
    CHAR = "char"
    PMI = "pmi"


NORMALISATIONS = {Formulation.CF: tuple(Normalisation), Formulation.MCF: (Normalisation.NONE,)}
# OLMES's primary metrics are these normalisations' accuracies (oe-eval's MCAccuracy divides by
# max(tokens, 1) and max(characters, 1) of the continuation as given, leading space included).
PRIMARY = {olmes.Metric.ACC_RAW: Normalisation.NONE,
           olmes.Metric.ACC_PER_TOKEN: Normalisation.TOKEN,
           olmes.Metric.ACC_PER_CHAR: Normalisation.CHAR,
           olmes.Metric.ACC_UNCOND: Normalisation.PMI}
OLMES_PREFIX = "olmes_"  # an OLMES task's name in results: olmes_arc_easy, ...


@dataclasses.dataclass(frozen=True)
class Selection:
    """The --tasks entries, sorted out."""

    files: tuple[str, ...]  # task files (none, and no OLMES task: the shipped one)
    olmes_names: tuple[str, ...]  # OLMES tasks (olmes.TASKS)
    limit: int | None = None  # questions scored per task (None: all)


@dataclasses.dataclass(frozen=True)
class Part:
    """One task in one formulation, as it is scored."""

    task: str  # its name in results
    formulation: Formulation
    questions: tuple[Question, ...]
    norms: tuple[Normalisation, ...]


def with_limit(entries: Sequence[str], limit: int | None) -> tuple[str, ...]:
    """The --tasks entries with --mc_limit's among them (so it travels with them, into the
    result's identity and to the measurement)."""
    if limit is None:
        return tuple(entries)
    if limit < 1:
        raise UsageError(f"--mc_limit must be at least 1, got {limit}")
    return (*entries, f"{LIMIT}{limit}")


def select(entries: Sequence[str]) -> Selection:
    files, names, limit = [], [], None
    for entry in entries:
        if entry.startswith(LIMIT):
            value = entry.removeprefix(LIMIT)
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"--mc_limit must be a whole number of at least 1, got {value!r}")
            limit = int(value)
        elif olmes.is_entry(entry):
            names.extend(olmes.names(entry))
        else:
            files.append(entry)
    return Selection(tuple(files), tuple(dict.fromkeys(names)), limit)


def _file_tasks(selection: Selection) -> tuple[Task, ...]:
    return load_tasks(selection.files) if selection.files or not selection.olmes_names else ()


def _unique(names: Sequence[str]) -> None:
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"--tasks: two tasks are named {name!r} (set a header 'task')")


def fingerprint(entries: Sequence[str]) -> dict:
    """What an mc result depends on besides the checkpoint: each task's content hash (the
    files' validity checked too: a bad file is refused here, before a checkpoint is loaded),
    the OLMES package's version, the question limit."""
    selection = select(entries)
    tasks = {t.name: t.sha256 for t in _file_tasks(selection)}
    out: dict = {"tasks": tasks}
    if selection.olmes_names:
        read = olmes.fingerprint(selection.olmes_names)
        _unique([*tasks, *(OLMES_PREFIX + n for n in read["tasks"])])
        tasks.update({OLMES_PREFIX + n: h for n, h in read["tasks"].items()})
        out["olmes"] = read["package"]
    if selection.limit is not None:
        out["limit"] = selection.limit
    return out


def file_parts(task: Task, limit: int | None = None) -> tuple[Part, ...]:
    return tuple(Part(task.name, f, questions(task, f, limit), NORMALISATIONS[f])
                 for f in Formulation)


def olmes_parts(task: olmes.OlmesTask) -> tuple[Part, ...]:
    """CF in every normalisation its requests allow, MCF in `none` (and its primary one)."""
    out = []
    for form in task.formulated:
        has_pmi = all(q.uncond for q in form.questions)
        norms = NORMALISATIONS[form.formulation] + (PRIMARY[form.metric],)
        norms = tuple(n for n in dict.fromkeys(norms) if n is not Normalisation.PMI or has_pmi)
        out.append(Part(OLMES_PREFIX + task.name, form.formulation, form.questions, norms))
    return tuple(out)


def normalised(norm: Normalisation, scores: Scores, chars: np.ndarray, cond: np.ndarray,
               uncond: np.ndarray | None) -> np.ndarray:
    """One question's choice scores under `norm`, from the request indices of its choices
    (`cond`: after the prompt; `uncond`: after the unconditional prompt, for PMI) and the
    continuations' lengths in characters."""
    logprob = scores.logprob[cond]
    if norm is Normalisation.TOKEN:
        return logprob / np.maximum(scores.tokens[cond], 1)
    if norm is Normalisation.CHAR:
        return logprob / np.maximum(chars, 1)
    if norm is Normalisation.PMI:
        return logprob - scores.logprob[uncond]
    return logprob


def accuracy_interval(correct: np.ndarray) -> tuple[float, float]:
    """The bootstrap interval of the mean of 0/1 outcomes."""
    if correct.min() == correct.max():  # every resample has the same mean (scipy: degenerate)
        return float(correct[0]), float(correct[0])
    res = scipy.stats.bootstrap((correct.astype(float),), np.mean, confidence_level=CONFIDENCE,
                                n_resamples=RESAMPLES, method="percentile",
                                rng=np.random.default_rng(SEED))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def plan(parts: Sequence[Part]) -> tuple[list[Request], list]:
    """Every (context, continuation) the parts need, once each, and per part the request
    indices of each question's choices: (cond, uncond or None)."""
    index: dict[Request, int] = {}

    def ask(requests: tuple[Request, ...]) -> np.ndarray:
        return np.array([index.setdefault(r, len(index)) for r in requests])

    rows = [[(ask(q.choices), ask(q.uncond) if Normalisation.PMI in part.norms else None)
             for q in part.questions] for part in parts]
    return list(index), rows


def score(parts: Sequence[Part], requests: list[Request], rows: list, scores: Scores) -> dict:
    """mc.json's accuracy figures from the requests' scores (`requests, rows = plan(parts)`)."""
    chars = np.array([len(r.continuation) for r in requests])
    out: dict = {"confidence": CONFIDENCE, "requests": len(requests), "results": []}
    for part in parts:
        out[f"{part.task}_chance"] = chance(part.questions)
    for part, part_rows in zip(parts, rows):
        key = f"{part.task}_{part.formulation.value}"
        out[f"{key}_truncated"] = float(np.mean(
            [scores.truncated[cond].any() for cond, _ in part_rows]))
        gold = np.array([q.gold for q in part.questions])
        for norm in part.norms:
            picked = np.array([np.argmax(normalised(norm, scores, chars[cond], cond, uncond))
                               for cond, uncond in part_rows])
            correct = picked == gold
            figure = dict(zip(("accuracy", "low", "high"),
                              (float(correct.mean()), *accuracy_interval(correct))))
            out.update({f"{key}_{norm.value}_{name}": v for name, v in figure.items()})
            out["results"].append({"task": part.task, "formulation": part.formulation.value,
                                   "normalisation": norm.value, **figure,
                                   "examples": int(correct.size),
                                   "chance": out[f"{part.task}_chance"]})
    return out


def olmes_scores(tasks: Sequence[olmes.OlmesTask], figures: dict) -> dict:
    """OLMES's figures from the accuracies (`score`'s): per task and formulation the primary
    normalisation's accuracy, the task's score the better formulation's, the nine's mean."""
    out: dict = {}
    for task in tasks:
        name = OLMES_PREFIX + task.name
        by = {}
        for form in task.formulated:
            norm = PRIMARY[form.metric]
            by[form.formulation] = figures[f"{name}_{form.formulation.value}_{norm.value}_accuracy"]
            out[f"{name}_{form.formulation.value}_score"] = by[form.formulation]
        out[f"{name}_score"] = max(by.values())
    if {t.name for t in tasks} == set(olmes.TASKS):  # a mean of fewer is not OLMES's
        out[f"{OLMES_PREFIX}average"] = float(np.mean([out[f"{OLMES_PREFIX}{n}_score"]
                                                       for n in olmes.TASKS]))
    return out


def _describe_file(task: Task, limit: int | None, chance_accuracy: float) -> dict:
    return {"name": task.name, "path": task.path, "sha256": task.sha256,
            "examples": len(task.examples[:limit]), "num_fewshot": task.num_fewshot,
            "chance": chance_accuracy}


def _describe_olmes(task: olmes.OlmesTask) -> dict:
    return {"name": OLMES_PREFIX + task.name, "path": f"{olmes.DISTRIBUTION} {task.version}: "
            f"{olmes.ROOT}/{task.name}/{{{','.join(olmes.FOLDERS.values())}}}",
            "sha256": task.sha256, "examples": len(task.cf.questions),
            "num_fewshot": task.cf.num_fewshot, "chance": chance(task.cf.questions),
            "primary": {f.formulation.value: f.metric.value for f in task.formulated}}


def mc(run: Loaded) -> dict:
    selection = select(run.tasks)
    tok = run_tokenizer(run.config)  # first: a run without text is refused before any reading
    tasks = _file_tasks(selection)
    olmes_tasks = olmes.load(selection.olmes_names, selection.limit)
    parts = [p for t in tasks for p in file_parts(t, selection.limit)]
    parts += [p for t in olmes_tasks for p in olmes_parts(t)]
    _unique([t.name for t in tasks] + [OLMES_PREFIX + t.name for t in olmes_tasks])
    requests, rows = plan(parts)
    scores = loglikelihoods(run.config, run.params, run.mesh, tok, requests)
    figures = score(parts, requests, rows, scores)
    described = [_describe_file(t, selection.limit, figures[f"{t.name}_chance"]) for t in tasks]
    described += [_describe_olmes(t) for t in olmes_tasks]
    return {"n_loops": run.config.model.n_loops, **figures, "tasks": described,
            **olmes_scores(olmes_tasks, figures)}


def plot_mc(result: dict, title: str):
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["task"], r["formulation"]) for r in result["results"]))
    if f"{OLMES_PREFIX}average" in result:  # the headline, where there is one
        title += f"; OLMES average {result[f'{OLMES_PREFIX}average']:.3f}"
    colours = {n.value: f"C{j}" for j, n in enumerate(Normalisation)}
    width = 0.8 / len(Normalisation)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(groups) + 2), 3.5))
    labelled = set()
    for g, (task, formulation) in enumerate(groups):
        rows = [r for r in result["results"]
                if (r["task"], r["formulation"]) == (task, formulation)]
        for j, r in enumerate(rows):  # each group's bars centred on it
            norm = r["normalisation"]
            ax.bar(g + (j - (len(rows) - 1) / 2) * width, r["accuracy"], width,
                   yerr=[[r["accuracy"] - r["low"]], [r["high"] - r["accuracy"]]], capsize=2,
                   color=colours[norm], label=None if norm in labelled else norm)
            labelled.add(norm)
        ax.hlines(result[f"{task}_chance"], g - 0.45, g + 0.45, colors="grey", linestyles=":",
                  label="chance" if g == 0 else None)
    ax.set(xticks=range(len(groups)), xticklabels=[f"{t}\n{f}" for t, f in groups],
           ylabel=f"accuracy ({round(100 * result['confidence'])}% interval)", ylim=(0, 1),
           title=title)
    ax.tick_params(axis="x", labelsize="small" if len(groups) <= 8 else "x-small")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    return fig
