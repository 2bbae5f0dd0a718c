"""`loopscale eval --what=mc`: downstream multiple-choice accuracy, OLMES-style (Gu et al.
2024): every task (mc_tasks.py) in both formulations, cloze (CF) and lettered multiple-choice
(MCF), each choice scored by its continuation's log-likelihood (mc_score.py) and the highest
score taken as the model's answer.

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
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import numpy as np
import scipy.stats

from loopscale.evaluate.mc_score import Request, Scores, loglikelihoods, run_tokenizer
from loopscale.evaluate.mc_tasks import Formulation, Task, context, continuations, load_tasks

if TYPE_CHECKING:
    from loopscale.evaluate.loaded import Loaded

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0


class Normalisation(str, enum.Enum):
    NONE = "none"
    TOKEN = "token"
    CHAR = "char"
    PMI = "pmi"


NORMALISATIONS = {Formulation.CF: tuple(Normalisation), Formulation.MCF: (Normalisation.NONE,)}


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


def plan(tasks: tuple[Task, ...]) -> tuple[list[Request], list]:
    """Every (context, continuation) the tasks need, once each, and per (task, formulation)
    the request indices of each question's choices: (cond, uncond or None)."""
    index: dict[Request, int] = {}

    def ask(ctx: str, conts: tuple[str, ...]) -> np.ndarray:
        return np.array([index.setdefault(Request(ctx, c), len(index)) for c in conts])

    plans = []
    for task in tasks:
        for f in Formulation:
            rows = []
            for i, example in enumerate(task.examples):
                conts = continuations(example, f)
                uncond = (ask(task.unconditional, conts)
                          if Normalisation.PMI in NORMALISATIONS[f] else None)
                rows.append((ask(context(task, i, f), conts), uncond))
            plans.append((task, f, rows))
    return list(index), plans


def score_tasks(tasks: tuple[Task, ...], requests: list[Request], plans: list, scores: Scores
                ) -> dict:
    """The figures of mc.json from the requests' scores (`requests, plans = plan(tasks)`)."""
    chars = np.array([len(r.continuation) for r in requests])
    out: dict = {"confidence": CONFIDENCE, "requests": len(requests), "results": [],
                 "tasks": [{"name": t.name, "path": t.path, "sha256": t.sha256,
                            "examples": len(t.examples), "num_fewshot": t.num_fewshot,
                            "chance": t.chance} for t in tasks]}
    for t in tasks:
        out[f"{t.name}_chance"] = t.chance
    for task, f, rows in plans:
        out[f"{task.name}_{f.value}_truncated"] = float(np.mean(
            [scores.truncated[cond].any() for cond, _ in rows]))
        gold = np.array([e.gold for e in task.examples])
        for norm in NORMALISATIONS[f]:
            picked = np.array([np.argmax(normalised(norm, scores, chars[cond], cond, uncond))
                               for cond, uncond in rows])
            correct = picked == gold
            low, high = accuracy_interval(correct)
            key = f"{task.name}_{f.value}_{norm.value}"
            out[f"{key}_accuracy"], out[f"{key}_low"], out[f"{key}_high"] = (
                float(correct.mean()), low, high)
            out["results"].append({"task": task.name, "formulation": f.value,
                                   "normalisation": norm.value, "accuracy": float(correct.mean()),
                                   "low": low, "high": high, "examples": int(correct.size),
                                   "chance": task.chance})
    return out


def mc(run: Loaded) -> dict:
    tasks = load_tasks(run.tasks)
    tok = run_tokenizer(run.config)
    requests, plans = plan(tasks)
    scores = loglikelihoods(run.config, run.params, run.mesh, tok, requests)
    return {"n_loops": run.config.model.n_loops, **score_tasks(tasks, requests, plans, scores)}


def plot_mc(result: dict, title: str):
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["task"], r["formulation"]) for r in result["results"]))
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
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    return fig
