"""Where a run starts: the newest checkpoint of its own that restores, else its trunk's
checkpoint at the branch point (a cooldown branch's first start), else step 0 with a fresh
state. Each gives the train state and the data iterator together, so a resumed run reads the
batches it would have read had it never stopped.
"""

from __future__ import annotations

import sys

import jax
import numpy as np

from loopscale.errors import UsageError
from loopscale.rundir.checkpoint import Checkpointer, Restored
from loopscale.rundir.run import CHECKPOINTS, branch_source
from loopscale.train.sharded_state import Setup, abstract_state, init_state


def restore(s: Setup, checkpointer: Checkpointer, train_ds, workdir: str) \
        -> tuple[Restored, object]:
    """(what the run starts from, its data iterator): the newest checkpoint that restores (bad
    ones moved aside with a warning), or a fresh start (step 0, no counts, no watch)."""
    def warn(line: str) -> None:
        if jax.process_index() == 0:
            print(f"loopscale train: warning: {workdir}: {line}", file=sys.stderr)

    data_iter = train_ds.iterator()
    restored = checkpointer.restore_latest(abstract_state(s), data_iter, warn)
    if restored:
        return restored, data_iter
    # Nothing restored: a fresh iterator, since a failed restore may have set this one's state.
    data_iter = train_ds.iterator()
    t = s.config.train
    if t.branch_from:
        return _branch_start(s, workdir, data_iter)
    return Restored(0, init_state(s), np.zeros(0, np.int64), None), data_iter


def _branch_start(s: Setup, workdir: str, data_iter):
    """A cooldown branch's first start: model, optimiser, data, unigram counts and watch from
    its trunk's checkpoint at the branch point (read-only: the trunk may still be training), so
    the branch goes on as the standalone run with its schedule would."""
    t = s.config.train
    trunk = branch_source(workdir, t.branch_from)
    source = Checkpointer(trunk / CHECKPOINTS, keep=1, read_only=True)
    try:
        if t.branch_step not in source.manager.all_steps():
            raise UsageError(f"train.branch_from={t.branch_from}: {trunk} has no checkpoint at "
                             f"train.branch_step={t.branch_step}")
        restored = source.restore(t.branch_step, abstract_state(s), data_iter)
    finally:
        source.manager.close()
    return restored, data_iter
