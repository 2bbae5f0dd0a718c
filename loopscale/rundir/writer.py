"""The run directory's writer thread: metrics rows are written off the training loop.

A row's write is a JSON line and a TensorBoard event on a local disk, but on an object store
it may be an upload of the whole metrics file (MetricsFile, at most every 30 s) that would
otherwise stall the loop for as long as the upload takes. `Background` runs the writes one
after another, in the order they were given, in one thread of its own. Unlike tensorboardX's
writer thread, which dies on a failed write and leaves the run blocked on its full queue
(events.py), a failure here comes back to the caller: the next `submit`, `wait` or `close`
raises it, so the trainer reports it as it would a failure in its own thread. At most `limit`
writes wait at a time; past that `submit` waits for the oldest (a store slower than the run
holds the loop back instead of filling memory).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class Background:
    def __init__(self, limit: int = 1000):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopscale-writer")
        self._pending: collections.deque[Future] = collections.deque()
        self._limit = limit

    def submit(self, fn: Callable, *args) -> None:
        """Queues fn(*args); raises the first failure of an earlier write, if one failed."""
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()
        if len(self._pending) >= self._limit:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(fn, *args))

    def wait(self) -> None:
        """Returns once every queued write is done; raises the first that failed."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
