"""A run's TensorBoard events, written by tensorboardX's EventsWriter in the run directory's
writer thread (writer.py).

tensorboardX's SummaryWriter writes from a thread of its own that dies on a write error (a full
disk), after which the run blocks forever on its full queue, SIGTERM included; written by the
run directory's thread, a failed write comes back to the trainer, which reports it. On resume, the new events file opens with a
purge marker at the first step to be logged again, so TensorBoard drops the old file's events
from that step on and shows each step once, as metrics.jsonl does.

A row is one event holding all its scalars (one Summary of many values, as TensorFlow's
writers make them), and the file is synced to disk at most every FLUSH_SECONDS and when it
closes: a record per scalar (18 a row), each checksummed in Python, and a sync per row took
most of the 2.4 ms a step that this change saved (under cProfile, 1,000 steps of a trivial
model: 6.75 s before, 4.30 s after; a batch put in one device_put is the rest). What a crash
loses is at most those seconds of curves; metrics.jsonl keeps every row. On gs://, where
tensorboardX keeps the file in memory and uploads it whole at each flush, the trainer also
flushes at every checkpoint (RunDirectory.flush), so that a killed run's resume finds the events
up to its checkpoint.
"""

from __future__ import annotations

import time

from etils import epath

FLUSH_SECONDS = 10.0


class Events:
    """One events file. `purge_step`: TensorBoard discards earlier events at or past it."""

    def __init__(self, directory: epath.Path, purge_step: int | None):
        from tensorboardX.event_file_writer import EventsWriter

        directory.mkdir(parents=True, exist_ok=True)
        # The file is named by the second it opens: a suffix keeps a resume within the same
        # second from overwriting the previous file.
        n = len(list(directory.glob("events.out.tfevents.*")))
        self._writer = EventsWriter(str(directory / "events"), filename_suffix=f".{n}")
        self._flushed = time.monotonic()
        if purge_step is not None:
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            self._writer.write_event(Event(wall_time=time.time(), step=purge_step,
                                           session_log=SessionLog(status=SessionLog.START)))

    def row(self, row: dict) -> None:
        """A metrics row's numbers as scalars at its step, in one event; a list of numbers
        (one per loop) as one curve per loop (`KEY/1`, `KEY/2`, ...)."""
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        values = []
        for key, value in row.items():
            if key == "step":
                continue
            if isinstance(value, (int, float)):
                values.append(Summary.Value(tag=key, simple_value=float(value)))
            elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                values += [Summary.Value(tag=f"{key}/{i + 1}", simple_value=float(v))
                           for i, v in enumerate(value)]
        self._writer.write_event(Event(wall_time=time.time(), step=row["step"],
                                       summary=Summary(value=values)))
        if time.monotonic() - self._flushed >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """To disk (on gs://, tensorboardX uploads the whole file again)."""
        self._writer.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        self._writer.close()
