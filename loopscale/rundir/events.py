"""A run's TensorBoard events, written synchronously in the caller's thread.

tensorboardX's SummaryWriter writes from a thread that dies on a write error (a full disk),
after which the run blocks forever on its full queue, SIGTERM included; written here, a failed
write raises where the trainer can report it. On resume, the new events file opens with a
purge marker at the first step to be logged again, so TensorBoard drops the old file's events
from that step on and shows each step once, as metrics.jsonl does.
"""

from __future__ import annotations

import time

from etils import epath


class Events:
    """One events file. `purge_step`: TensorBoard discards earlier events at or past it."""

    def __init__(self, directory: epath.Path, purge_step: int | None):
        from tensorboardX.event_file_writer import EventsWriter

        directory.mkdir(parents=True, exist_ok=True)
        # The file is named by the second it opens: a suffix keeps a resume within the same
        # second from overwriting the previous file.
        n = len(list(directory.glob("events.out.tfevents.*")))
        self._writer = EventsWriter(str(directory / "events"), filename_suffix=f".{n}")
        if purge_step is not None:
            from tensorboardX.proto.event_pb2 import Event, SessionLog

            self._writer.write_event(Event(wall_time=time.time(), step=purge_step,
                                           session_log=SessionLog(status=SessionLog.START)))

    def row(self, row: dict) -> None:
        """A metrics row's numbers as scalars at its step; a list of numbers (one per loop)
        as one curve per loop (`KEY/1`, `KEY/2`, ...)."""
        step = row["step"]
        for key, value in row.items():
            if key == "step":
                continue
            if isinstance(value, (int, float)):
                self.scalar(key, value, step)
            elif isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
                for i, v in enumerate(value):
                    self.scalar(f"{key}/{i + 1}", v, step)
        self._writer.flush()

    def scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        self._writer.write_event(Event(wall_time=time.time(), step=step,
                                       summary=scalar(tag, value)))

    def close(self) -> None:
        self._writer.close()
