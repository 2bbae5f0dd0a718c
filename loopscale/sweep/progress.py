"""The local runner's report: a progress bar over the sweep's planned FLOPs, or one line per
finished run without a terminal. runner.py calls it with planned runs and their outcomes; it
knows nothing of the runner's processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Collection, Sequence

from loopscale.rundir import sweep as rundirs
from loopscale.rundir.run import last_metrics_row, read_summary
from loopscale.rundir.status import LaunchOutcome, RunStatus
from loopscale.sweep.plan_table import PlannedRun


class Progress:
    """A progress bar over the sweep's planned FLOPs (runs differ ~10x in cost, so run counts
    make a poor ETA), moved by finished runs and by the steps running ones have logged.
    Without a terminal it prints one line per finished run instead."""

    def __init__(self, stream=None, bar: bool | None = None):
        # sys.stderr as it is now, not when this module was imported (in a notebook or a test,
        # the stream of that moment may since have been replaced and closed)
        self.stream = stream = sys.stderr if stream is None else stream
        self.bar_enabled = stream.isatty() if bar is None else bar
        self.bar = None
        self.total = 0.0
        self.finished_flops = 0.0
        self.n_total = 0
        self.counts = {"done": 0, "failed": 0}
        self.t0 = time.time()
        self.start_flops = 0.0

    @staticmethod
    def _flops(run: PlannedRun) -> float:
        """What the run itself computes (a branch: its cooldown only)."""
        row = run.row
        return float(row.get("flops_spent") or row.get("flops") or 0.0) or 1.0

    def start(self, runs: Sequence[PlannedRun], done: Collection[str],
              failed: Collection[str]) -> None:
        """The sweep as the runner found it: the run ids already `done` and given up."""
        self.n_total = len(runs)
        self.total = sum(self._flops(r) for r in runs)
        self.finished_flops = sum(self._flops(r) for r in runs
                                  if r.run_id in done or r.run_id in failed)
        self.start_flops = self.finished_flops
        self.counts["done"] = len(done)
        self.counts["failed"] = len(failed)
        if self.bar_enabled:
            from tqdm import tqdm

            tqdm.monitor_interval = 0  # no monitor thread: fork (preexec_fn) wants one thread
            self.bar = tqdm(total=self.total, initial=self.finished_flops, unit="FLOP",
                            unit_scale=True, file=self.stream, desc="sweep", dynamic_ncols=True)
            self._postfix(0)
        else:
            left = self.n_total - self.counts["done"] - self.counts["failed"]
            self._line(f"{self.n_total} runs: {self.counts['done']} done, "
                       f"{self.counts['failed']} given up, {left} to run")

    def launched(self, run: PlannedRun) -> None:
        if not self.bar:
            budget = "-" if run.budget is None else f"{run.budget:.3g}"
            self._line(f"start {run.run_id} {run.family} budget={budget} "
                       f"d_model={run.config.model.d_model} steps={run.config.train.steps}")

    def unreachable(self, run: PlannedRun) -> None:
        self.counts["failed"] += 1
        self.finished_flops += self._flops(run)
        self._line(f"gave up  {run.run_id} {run.family}: its trunk "
                   f"{run.config.train.branch_from} ended without checkpoint "
                   f"{run.config.train.branch_step}")

    def finished(self, run: PlannedRun, result: LaunchOutcome, rundir: str,
                 gave_up: bool = False) -> None:
        said = result.value
        if result is LaunchOutcome.DONE:
            self.counts["done"] += 1
            self.finished_flops += self._flops(run)
        elif result is LaunchOutcome.FAILED:
            n, _ = rundirs.failures(rundir)
            said = "gave up" if gave_up else f"failed x{n}, retrying"
            if gave_up:
                self.counts["failed"] += 1
                self.finished_flops += self._flops(run)
        summary = read_summary(rundir) or {}
        loss = summary.get("final_eval_loss")
        text = (f"{said:<8} {run.run_id} {run.family} d_model={run.config.model.d_model} "
                f"status={RunStatus.of(summary).value}"
                + (f" eval_loss={loss:.4f}" if isinstance(loss, (int, float)) else "")
                + ("" if result is LaunchOutcome.DONE
                   else f" (log: {os.path.join(rundir, rundirs.LOG)})"))
        done = self.counts["done"]
        self._line(f"[{done}/{self.n_total}] {text}{self._eta_text(self.finished_flops)}")

    def _eta_text(self, flops_done: float) -> str:
        gained = flops_done - self.start_flops
        left = self.total - flops_done
        if gained <= 0 or left <= 0:
            return ""
        eta = (time.time() - self.t0) * left / gained
        return f" eta {_duration(eta)}"

    def tick(self, running: Sequence[PlannedRun], workdir: str) -> None:
        if not self.bar:
            return
        partial = 0.0
        for run in running:
            row = last_metrics_row(rundirs.run_dir(workdir, run.run_id))
            steps = run.config.train.steps
            if row and steps:
                partial += self._flops(run) * min(1.0, row.get("step", 0) / steps)
        self.bar.n = min(self.total, self.finished_flops + partial)
        self._postfix(len(running))
        self.bar.refresh()

    def _postfix(self, running: int) -> None:
        self.bar.set_postfix_str(f"runs {self.counts['done']}/{self.n_total} done, "
                                 f"{running} running", refresh=False)

    def _line(self, text: str) -> None:
        if self.bar:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar:
            self.bar.close()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
