"""A work queue of keys for controllers (cf. client-go ``util/workqueue``).

Informer handlers only ``add`` keys; one worker takes a key, reconciles it and says
``done``. As in client-go:
- a key added many times before a worker takes it is reconciled once;
- a key being reconciled is not handed to a second worker; added meanwhile, it comes
  back once the first is done;
- ``add_after`` delays a key (Reconcile's "requeue after 5 s");
- ``add_rate_limited`` delays it exponentially per key (5 ms doubling to 1000 s in
  client-go; here 50 ms to 30 s) until ``forget`` resets it after a success.

:func:`run_worker` is the loop controller-runtime runs: Reconcile returns the seconds
after which to look again (or None), an exception requeues with back-off.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

_log = logging.getLogger("gpulab.workqueue")


class WorkQueue:
    def __init__(self, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        self._cond = threading.Condition()
        self._queue: list[str] = []
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._delayed: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._failures: dict[str, int] = {}
        self._base = base_delay
        self._max = max_delay
        self._shutdown = False

    def add(self, key: str) -> None:
        with self._cond:
            self._add(key)

    def _add(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            heapq.heappush(self._delayed, (time.monotonic() + delay, next(self._seq), key))
            self._cond.notify()

    def add_rate_limited(self, key: str) -> float:
        """Requeue after a per-key exponential back-off; returns the delay chosen."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self._base * 2**failures, self._max)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def get(self, timeout: float | None = None) -> str | None:
        """The next key to work on (mark it ``done`` after), or None on shutdown/timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    self._add(heapq.heappop(self._delayed)[2])
                if self._queue:
                    key = self._queue.pop(0)
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                if self._shutdown:
                    return None
                waits = [self._delayed[0][0] - now] if self._delayed else []
                if deadline is not None:
                    if now >= deadline:
                        return None
                    waits.append(deadline - now)
                self._cond.wait(min(waits) if waits else None)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:  # added again while it was being worked on
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)


Reconciler = Callable[[str], float | None]
"""Reconcile one key; return seconds until it should be looked at again, or None."""


def run_worker(queue: WorkQueue, reconcile: Reconciler, name: str = "controller") -> None:
    """Take keys until the queue shuts down; requeue as Reconcile asks or on error."""
    while (key := queue.get()) is not None:
        try:
            requeue_after = reconcile(key)
        except Exception:
            delay = queue.add_rate_limited(key)
            _log.exception("%s: reconciling %s failed; retrying in %.2fs", name, key, delay)
        else:
            queue.forget(key)
            if requeue_after is not None:
                queue.add_after(key, requeue_after)
        finally:
            queue.done(key)
