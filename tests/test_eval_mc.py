"""`loopscale eval --what=mc`: multiple-choice tasks scored by continuation log-likelihood on a
tiny text run, checked against the model applied to one unpadded sequence at a time."""

import dataclasses
import functools
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
import trainkit

from loopscale.cli import main
from loopscale.data.tokenizer import ByteTokenizer
from loopscale.evaluate import mc_kjv
from loopscale.evaluate.mc import NORMALISATIONS, Normalisation
from loopscale.evaluate.mc_score import Request, loglikelihoods
from loopscale.evaluate.mc_tasks import (
    Formulation,
    context,
    continuations,
    load_task,
    load_tasks,
    shipped_path,
)
from loopscale.model import LoopedLM
from loopscale.rundir.load import load_run
from loopscale.sweep.collect import collect_dir
from loopscale.parallel.mesh import make_mesh
from loopscale.train.trainer import train

EOS = ByteTokenizer.eos_id


@dataclasses.dataclass(frozen=True)
class Run:
    dir: Path
    config: object
    params: object  # on one device

    @functools.cached_property
    def _logits(self):
        model = LoopedLM(self.config.model)
        return jax.jit(lambda p, x: model.apply({"params": p}, x).logits)

    def logits(self, ids) -> np.ndarray:
        """The model's plain forward pass over one sequence, whole (T, V) logits (no
        micro-batches, no vocabulary chunks): compiled once for seq_len positions, the
        sequence padded on the right (its own positions are causal: what follows them does
        not count; test_batched_... checks this against sequences at their own length)."""
        T = self.config.train.seq_len
        x = np.zeros((1, T), np.int32)
        x[0, :len(ids)] = ids
        # Sliced on the host: the same numbers, without an eager slice compiled per length.
        return np.asarray(self._logits(self.params, x))[0, :len(ids)].astype(np.float64)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A looped byte-level run (2 loops), trained a few steps, scored in two micro-batches
    with the vocabulary read 8 positions at a time."""
    tmp = tmp_path_factory.mktemp("mc")
    corpus = trainkit.write_corpus(str(tmp / "text"))
    cfg = trainkit.config("looped", corpus, str(tmp / "cache"), **{
        "train.steps": 2, "train.checkpoint_every": 0, "train.eval_every": 0,
        "train.batch_size": 16, "train.grad_accum": 2, "train.ce_chunk": 8})
    rundir = tmp / "run"
    assert train(cfg, str(rundir)) == 0
    config, params = load_run(rundir)
    return Run(rundir, config, jax.device_get(params))


def fresh(run, tmp_path):
    """A copy of the run without any eval/ yet."""
    shutil.copytree(run.dir, tmp_path / "run", ignore=shutil.ignore_patterns("eval"))
    return tmp_path / "run"


def plain_loglik(run, ctx: str, cont: str) -> float:
    """log P(cont | ctx): the model on this one sequence (end-of-document token, the bytes,
    the last seq_len + 1 kept), the continuation's positions summed."""
    ids = np.array([EOS, *(ctx + cont).encode()], np.int32)[-(run.config.train.seq_len + 1):]
    logp = np.asarray(jax.nn.log_softmax(run.logits(ids[:-1]), -1))
    n = min(len(cont.encode()), len(ids) - 1)
    pos = np.arange(len(ids) - 1 - n, len(ids) - 1)
    return float(logp[pos, ids[pos + 1]].sum())


def write_task(path, header, rows):
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(x) for x in ([header] if header else []) + rows) + "\n")
    return str(path)


def read_mc(rundir):
    return json.loads((rundir / "eval" / "mc.json").read_text())


def test_batched_loglikelihoods_equal_the_model_on_each_sequence(run):
    config, params = run.config, run.params
    requests = [Request("In the beginning God", " created the heaven"),
                Request("And the earth was without form, and void; and darkness", " was"),
                Request("", " And God said"),  # no context: after the end-of-document token
                Request("Answer:", " the light"),
                Request("x" * 40, " longer than the model's 32 positions, cut on the left")]
    requests += [Request(f"And God called the {w}", f" {w}s") for w in
                 ("light", "dark", "firmament", "dry land", "waters", "seas", "earth", "grass",
                  "herb", "tree", "fruit", "seed", "day", "night", "sign")]  # 20 > 16 rows
    scores = loglikelihoods(config, params, make_mesh(config.mesh), ByteTokenizer(), requests)
    want = [plain_loglik(run, r.context, r.continuation) for r in requests]
    np.testing.assert_allclose(scores.logprob, want, rtol=1e-5, atol=1e-5)
    T = config.train.seq_len
    assert scores.tokens.tolist() == [min(len(r.continuation), T) for r in requests]
    assert scores.truncated.tolist() == [len(r.context + r.continuation) + 1 > T + 1
                                         for r in requests]
    assert scores.truncated[4] and not scores.truncated[3]
    # The padded reference is the model on the sequence alone, at its own length.
    ids = np.array([[EOS, *b"In the beginning God created"]], np.int32)
    alone = run._logits(params, ids)[0]  # compiled for this length too
    np.testing.assert_allclose(run.logits(ids[0]), alone, rtol=1e-5, atol=1e-5)


def greedy(run, ctx: str, n: int, alphabet: str) -> str:
    """The model's own greedy continuation of `ctx`, one character at a time, among
    `alphabet` (so the text is valid and has no spaces)."""
    out = ""
    allowed = np.frombuffer(alphabet.encode(), np.uint8)
    for _ in range(n):
        logits = run.logits(np.array([EOS, *(ctx + out).encode()], np.int32))[-1]
        out += chr(allowed[np.argmax(logits[allowed])])
    return out


def test_gold_as_the_models_greedy_continuation_scores_1(run, tmp_path):
    """Each question's gold is the model's greedy continuation; each distractor is the same
    but for its last character (another one, of lower probability by construction): per
    token (and summed) the gold must win every time, whatever the model."""
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    rows = []
    for i, q in enumerate(["In the beginning God", "And the earth", "And God said unto",
                           "Let there be", "And the evening and the"]):
        gold = greedy(run, q + " ", 1 + i % 4, alphabet)
        others = [c for c in alphabet if c != gold[-1]][i:i + 3]
        choices = [gold[:-1] + c for c in others]
        choices.insert(i % 4, gold)
        rows.append({"question": q, "choices": choices, "gold": i % 4})
    path = write_task(tmp_path / "greedy.jsonl", {"num_fewshot": 0, "question_prefix": "",
                                                  "answer_prefix": ""}, rows)
    run_copy = fresh(run, tmp_path)
    assert main(["eval", f"--workdir={run_copy}", "--what=mc", f"--tasks={path}"]) == 0
    got = read_mc(run_copy)
    assert got["greedy_cf_token_accuracy"] == 1.0 and got["greedy_cf_none_accuracy"] == 1.0
    assert got["greedy_cf_token_low"] == got["greedy_cf_token_high"] == 1.0
    assert got["greedy_chance"] == 0.25 and got["greedy_cf_truncated"] == 0.0


TASK = [  # choices of unequal lengths, one with a two-byte character: the norms differ
    {"question": "And God saw the light, that it was", "choices": ["good", "very bad indeed",
                                                                    "café"], "gold": 0},
    {"question": "And God called the light", "choices": ["Day", "the night", "a"], "gold": 0},
    {"question": "And the evening and the morning were", "choices": ["the first day", "x",
                                                                     "wet é"], "gold": 0},
    {"question": "the earth", "choices": ["brought forth grass", "is", "was void"], "gold": 2},
    {"question": "Let there be", "choices": ["light", "lights in the heaven", "é"], "gold": 1},
]


def test_normalisations_and_formulations_as_defined(run, tmp_path):
    """mc.json's accuracies equal the ones computed here from each choice's log-likelihood
    under the plain model: per token (bytes), per character, PMI against "Answer:", and the
    MCF letters after the lettered prompt."""
    path = write_task(tmp_path / "hand.jsonl", {"task": "hand", "num_fewshot": 1}, TASK)
    task = load_task(path)
    # MCF: the question, its lettered choices, the letter scored; a drawn shot before it.
    prompt = context(task, 1, Formulation.MCF)
    assert prompt.endswith("Question: And God called the light\n A. Day\n B. the night\n"
                           " C. a\nAnswer:")
    shot, _ = prompt.split("\n\n")
    assert shot.startswith("Question: ") and shot[-10:] in [f"\nAnswer: {x}" for x in "ABC"]
    assert continuations(task.examples[0], Formulation.MCF) == (" A", " B", " C")
    assert context(task, 0, Formulation.CF).endswith("Question: And God saw the light, that "
                                                     "it was\nAnswer:")
    assert continuations(task.examples[0], Formulation.CF) == (" good", " very bad indeed",
                                                               " café")
    assert context(task, 3, Formulation.CF) == context(task, 3, Formulation.CF)  # deterministic

    want = {}
    for f in Formulation:
        picked = {n: [] for n in NORMALISATIONS[f]}
        for i, ex in enumerate(task.examples):
            conts = continuations(ex, f)
            cond = np.array([plain_loglik(run, context(task, i, f), c) for c in conts])
            uncond = np.array([plain_loglik(run, "Answer:", c) for c in conts])
            by = {Normalisation.NONE: cond,
                  Normalisation.TOKEN: cond / [len(c.encode()) for c in conts],
                  Normalisation.CHAR: cond / [len(c) for c in conts],
                  Normalisation.PMI: cond - uncond}
            for n, right in picked.items():
                right.append(np.argmax(by[n]) == ex.gold)
        want.update({f"hand_{f.value}_{n.value}_accuracy": np.mean(v) for n, v in picked.items()})
    assert set(NORMALISATIONS[Formulation.CF]) == set(Normalisation)
    run_copy = fresh(run, tmp_path)
    assert main(["eval", f"--workdir={run_copy}", "--what=mc", f"--tasks={path}"]) == 0
    got = read_mc(run_copy)
    assert {k: got[k] for k in want} == pytest.approx(want)
    for row in got["results"]:
        assert row["low"] <= row["accuracy"] <= row["high"]
    assert (run_copy / "eval" / "mc.png").read_bytes()[:4] == b"\x89PNG"


def test_the_shipped_task_a_changed_task_and_collect(run, tmp_path):
    lines = mc_kjv.task_lines()
    with open(shipped_path()) as f:
        assert f.read() == "\n".join(lines) + "\n"  # the generator's output, as shipped
    (task,) = load_tasks([])
    assert task.name == "kjv_next_words" and len(task.examples) == 414 and task.chance == 0.25
    rundir = fresh(run, tmp_path)
    assert main(["eval", f"--workdir={rundir}", "--what=mc"]) == 0
    default = read_mc(rundir)
    acc = default["kjv_next_words_cf_token_accuracy"]
    assert default["inputs"] == {"tasks": {"kjv_next_words": task.sha256}}
    row = collect_dir(str(rundir))[0]
    assert row["mc_kjv_next_words_cf_token_accuracy"] == acc
    assert row["mc_kjv_next_words_mcf_none_high"] == default["kjv_next_words_mcf_none_high"]
    # Another --tasks is measured again, not read from the stale file; the same is kept.
    other = write_task(tmp_path / "other.jsonl", {"num_fewshot": 0}, TASK[:2])
    assert main(["eval", f"--workdir={rundir}", "--what=mc", f"--tasks={other}"]) == 0
    assert "kjv_next_words_chance" not in read_mc(rundir) and "other_chance" in read_mc(rundir)
    before = (rundir / "eval" / "mc.json").stat().st_mtime_ns
    assert main(["eval", f"--workdir={rundir}", "--what=mc", f"--tasks={other}"]) == 0
    assert (rundir / "eval" / "mc.json").stat().st_mtime_ns == before
    write_task(other, {"num_fewshot": 0}, TASK[:3])  # edited: measured again
    assert main(["eval", f"--workdir={rundir}", "--what=mc", f"--tasks={other}"]) == 0
    assert read_mc(rundir)["tasks"][0]["examples"] == 3


@pytest.mark.parametrize("case,phrase", [
    ("missing", "cannot read"),
    ("not_json", "bad.jsonl:2: not JSON"),
    ("gold", "bad.jsonl:1: gold=3 is not an index into its 3 choices"),
    ("key", "bad.jsonl:1: unknown key 'answer'"),
    ("one_choice", "bad.jsonl:1: choices must be a list of two or more"),
    ("tasks_without_mc", "--tasks names task files for --what=mc"),
    ("permutation", "needs a run trained on text"),
])
def test_bad_input_exits_2_in_one_line(run, tmp_path, capsys, case, phrase):
    rundir = fresh(run, tmp_path)
    good = json.dumps(TASK[0])
    text = {"not_json": good + "\n{question: 1}\n",
            "gold": json.dumps({**TASK[0], "gold": 3}),
            "key": json.dumps({**TASK[0], "answer": 0}),
            "one_choice": json.dumps({**TASK[0], "choices": ["a"], "gold": 0}),
            "tasks_without_mc": good}.get(case)
    if text is not None:
        (tmp_path / "bad.jsonl").write_text(text)
    args = {"missing": [f"--tasks={tmp_path / 'nope.jsonl'}"], "permutation": []}.get(
        case, [f"--tasks={tmp_path / 'bad.jsonl'}"])
    what = "--what=ppl" if case == "tasks_without_mc" else "--what=mc"
    if case == "permutation":  # a run whose data has no tokenizer for text
        cfg = json.loads((rundir / "config.json").read_text())
        cfg["data"]["source"] = "permutation"
        (rundir / "config.json").write_text(json.dumps(cfg))
    assert main(["eval", f"--workdir={rundir}", what, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and phrase in err[0], err
    assert not os.path.exists(rundir / "eval")
