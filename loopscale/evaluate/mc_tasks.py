"""Multiple-choice tasks for `loopscale eval --what=mc`: the task file format, and the prompts
of the two formulations (OLMES, Gu et al. 2024) built from it.

A task is one local JSONL file (UTF-8, one JSON object a line; blank lines are skipped):

    {"task": "arc_easy", "num_fewshot": 5}                               optional header, first line
    {"question": "Which gas do plants take in?", "choices": ["oxygen", "carbon dioxide",
     "nitrogen"], "gold": 1}                                              one line per question
    {"question": "...", "choices": [...], "gold": 0, "fewshot": true}    a few-shot example

Example lines: `question` (string), `choices` (two or more strings), `gold` (the index of the
right choice), optional `fewshot` (true: shown in prompts, never scored) and `id` (ignored).
Header keys, all optional: `task` (the name in results and column names; default the file's
stem), `num_fewshot` (examples in each prompt; default 5), `instructions` (text opening every
prompt), `question_prefix` (default "Question: "), `answer_prefix` (default "\\nAnswer:"),
`unconditional` (the PMI normalisation's context; default "Answer:"). Anything else, or a
gold index out of range, is refused with the file and line. Few-shot examples are the file's
`fewshot` lines, the first `num_fewshot` of them in file order; a file with none draws them for
question i from its other questions, with a generator seeded by i (so every run and every
model sees the same prompts).

The prompts, for a question q with choices c_0 .. c_n and gold g:

    CF (cloze)   context  {question_prefix}{q}{answer_prefix}
                 scored   " " + c_j, each choice's own text
    MCF          context  {question_prefix}{q}\\n A. {c_0}\\n B. {c_1}\\n ...\\nAnswer:
                 scored   " A", " B", ... (the letters)

A prompt with k shots is `instructions`, then each shot's context followed by its gold
continuation, then the question's context, separated by blank lines. A cloze task such as
HellaSwag, or the shipped verse task, sets both prefixes to "" so the context is the bare text.
`questions` turns a task into what mc.py scores: per question, one (context, continuation)
request per choice, and for CF the PMI baselines (each continuation after `unconditional`);
OLMES's own request files (olmes.py) arrive in the same shape. Converting ARC, HellaSwag, PIQA
and others into this format: docs/mc_tasks.md.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import string
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from loopscale.errors import UsageError
from loopscale.evaluate.mc_score import Request

SHIPPED = "kjv_next_words.jsonl"  # the default task (evaluate/tasks/, made by mc_kjv.py)
FEWSHOT_SEED = 1234  # drawn few-shot examples: generator seeded by (FEWSHOT_SEED, question)
LETTERS = string.ascii_uppercase
SHOT_SEPARATOR = "\n\n"


class Formulation(str, enum.Enum):
    CF = "cf"  # cloze: each choice's text scored as the continuation
    MCF = "mcf"  # multiple-choice: the choices shown lettered, the letter scored


@dataclasses.dataclass(frozen=True)
class Example:
    question: str
    choices: tuple[str, ...]
    gold: int


@dataclasses.dataclass(frozen=True)
class Question:
    """One question as it is scored in one formulation, whatever wrote its prompts (this
    module, or OLMES's request files)."""

    choices: tuple[Request, ...]  # one (context, continuation) per choice, in choice order
    gold: int  # the index of the right one
    uncond: tuple[Request, ...] = ()  # the PMI baselines, one per choice (empty: no PMI)


def chance(scored: Sequence[Question]) -> float:
    """Expected accuracy of a uniform guess."""
    return float(np.mean([1.0 / len(q.choices) for q in scored]))


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    path: str
    sha256: str  # of the file's bytes: results are kept only while it is unchanged
    examples: tuple[Example, ...]  # scored
    fewshot: tuple[Example, ...]  # the file's own few-shot examples (may be empty)
    num_fewshot: int = 5
    instructions: str = ""
    question_prefix: str = "Question: "
    answer_prefix: str = "\nAnswer:"
    unconditional: str = "Answer:"

    @property
    def chance(self) -> float:
        """Expected accuracy of a uniform guess."""
        return float(np.mean([1.0 / len(e.choices) for e in self.examples]))


_HEADER = {"task": str, "num_fewshot": int, "instructions": str, "question_prefix": str,
           "answer_prefix": str, "unconditional": str}
_EXAMPLE = {"question", "choices", "gold", "fewshot", "id"}


def shipped_path() -> str:
    return str(resources.files("loopscale.evaluate") / "tasks" / SHIPPED)


def _sanitise(name: str) -> str:
    """A task name as it appears in column names: lower case, [a-z0-9_]."""
    out = "".join(ch if ch.isalnum() else "_" for ch in name.lower()).strip("_")
    return out or "task"


def _example(obj: dict, where: str) -> tuple[Example, bool]:
    unknown = sorted(set(obj) - _EXAMPLE)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (an example has: question, "
                         "choices, gold, fewshot, id)")
    for key in ("question", "choices", "gold"):
        if key not in obj:
            raise UsageError(f"{where}: missing {key!r}")
    question, choices, gold = obj["question"], obj["choices"], obj["gold"]
    if not isinstance(question, str):
        raise UsageError(f"{where}: question must be a string")
    if (not isinstance(choices, list) or len(choices) < 2
            or not all(isinstance(c, str) and c.strip() for c in choices)):
        raise UsageError(f"{where}: choices must be a list of two or more non-empty strings")
    if len(choices) > len(LETTERS):
        raise UsageError(f"{where}: {len(choices)} choices, more than the {len(LETTERS)} letters")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise UsageError(f"{where}: gold={gold!r} is not an index into its {len(choices)} choices")
    return Example(question.rstrip(), tuple(choices), gold), bool(obj.get("fewshot", False))


def load_task(path: str) -> Task:
    """The task in the JSONL file `path`; UsageError naming the file (and line) if it is not
    one."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"--tasks: cannot read {path}: {e.strerror or e}") from None
    header: dict = {}
    examples, fewshot = [], []
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UsageError(f"{where}: a line must be a JSON object")
        if "question" not in obj:
            if header or examples or fewshot:
                raise UsageError(f"{where}: no 'question' (only the first line may be a header)")
            header = _header(obj, where)
            continue
        example, is_shot = _example(obj, where)
        (fewshot if is_shot else examples).append(example)
    if not examples:
        raise UsageError(f"{path}: no question to score")
    name = _sanitise(header.pop("task", Path(path).name.removesuffix(".jsonl")))
    return Task(name=name, path=str(path), sha256=hashlib.sha256(data).hexdigest(),
                examples=tuple(examples), fewshot=tuple(fewshot), **header)


def _header(obj: dict, where: str) -> dict:
    for key, value in obj.items():
        if key not in _HEADER:
            raise UsageError(f"{where}: unknown header key {key!r} (allowed: "
                             f"{', '.join(_HEADER)})")
        kind = _HEADER[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise UsageError(f"{where}: {key} must be a{'n integer' if kind is int else ' string'}")
    if obj.get("num_fewshot", 0) < 0:
        raise UsageError(f"{where}: num_fewshot must be at least 0")
    return dict(obj)


def load_tasks(paths: Sequence[str]) -> tuple[Task, ...]:
    """The tasks of `--tasks` (none given: the shipped task); names must differ."""
    tasks = tuple(load_task(p) for p in (paths or [shipped_path()]))
    names = [t.name for t in tasks]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"--tasks: two tasks are named {name!r} (set a header 'task')")
    return tasks


# ---------------------------------------------------------------- prompts


def query(task: Task, example: Example, formulation: Formulation) -> str:
    """The question as a prompt ends with it (no shots, no instructions)."""
    if formulation is Formulation.CF:
        return f"{task.question_prefix}{example.question}{task.answer_prefix}"
    lettered = "".join(f" {LETTERS[j]}. {c}\n" for j, c in enumerate(example.choices))
    return f"{task.question_prefix}{example.question}\n{lettered}Answer:"


def continuations(example: Example, formulation: Formulation) -> tuple[str, ...]:
    """What is scored after the context, one per choice (a leading space: the context ends
    without one, as the model read text)."""
    if formulation is Formulation.CF:
        return tuple(" " + c for c in example.choices)
    return tuple(" " + LETTERS[j] for j in range(len(example.choices)))


def shots(task: Task, index: int) -> tuple[Example, ...]:
    """The few-shot examples of question `index`: the file's own, else drawn from the other
    questions (deterministic per question)."""
    k = task.num_fewshot
    if task.fewshot or k == 0:
        return task.fewshot[:k]
    others = [i for i in range(len(task.examples)) if i != index]
    rng = np.random.default_rng((FEWSHOT_SEED, index))
    picked = rng.choice(len(others), size=min(k, len(others)), replace=False)
    return tuple(task.examples[others[int(i)]] for i in picked)


def context(task: Task, index: int, formulation: Formulation) -> str:
    """The full prompt before the scored continuation: instructions, shots, the question."""
    parts = [task.instructions] if task.instructions else []
    for shot in shots(task, index):
        parts.append(query(task, shot, formulation) + continuations(shot, formulation)[shot.gold])
    parts.append(query(task, task.examples[index], formulation))
    return SHOT_SEPARATOR.join(parts)


def questions(task: Task, formulation: Formulation, limit: int | None = None
              ) -> tuple[Question, ...]:
    """The task's first `limit` questions (None: all) as scored in `formulation`; the shots are
    drawn from all of them either way, so a limited run sees the same prompts."""
    out = []
    for i, example in enumerate(task.examples[:limit]):
        conts = continuations(example, formulation)
        ctx = context(task, i, formulation)
        # PMI's baseline is the cloze text alone; MCF's letters are alike, so it has none.
        uncond = (tuple(Request(task.unconditional, c) for c in conts)
                  if formulation is Formulation.CF else ())
        out.append(Question(tuple(Request(ctx, c) for c in conts), example.gold, uncond))
    return tuple(out)
