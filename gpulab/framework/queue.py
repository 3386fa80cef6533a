"""The scheduling queue: activeQ, backoffQ and the unschedulable pods.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/backend/queue/scheduling_queue.go``
(``PriorityQueue``: ``Add``, ``Update``, ``Delete``, ``Pop``, ``Done``,
``AddUnschedulableIfNotPresent``, ``MoveAllToActiveOrBackoffQueue``, ``Activate``,
``flushBackoffQCompleted``, ``flushUnschedulablePodsLeftover``) and ``backoff_queue.go``
(the backoff doubles per failed attempt from ``podInitialBackoffSeconds`` (1 s) up to
``podMaxBackoffSeconds`` (10 s); an attempt that ended in an Error counts its
consecutive errors instead).

- activeQ: pods ready for a scheduling attempt, popped in the order of the profile's
  QueueSort plugin (``Less``).
- backoffQ: pods that failed and wait out their backoff before going back to activeQ.
- unschedulablePods: pods the plugins rejected; a cluster event one of those plugins
  registered for (``EventsToRegister``) moves them back (to backoffQ if still backing
  off), and after 5 minutes they are retried anyway.
- A pod with ``spec.schedulingGates`` waits in unschedulablePods until its gates are
  removed (upstream's SchedulingGates PreEnqueue plugin).

Lab differences: activeQ is a list scanned with ``Less`` on every Pop (no heap), so a
QueueSort whose order changes over time (Coscheduling's) is always honoured; events that
arrive while a pod is being scheduled are summed up as one move-request cycle counter
(upstream's behaviour without queueing hints) instead of being replayed per pod.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import cmp_to_key
from typing import Any

from gpulab.framework.interface import (
    WILDCARD,
    ClusterEvent,
    QueuedPodInfo,
)
from gpulab.framework.snapshot import PodInfo, pod_uid

Obj = Mapping[str, Any]
LessFunc = Callable[[QueuedPodInfo, QueuedPodInfo], bool]

DEFAULT_INITIAL_BACKOFF = 1.0
DEFAULT_MAX_BACKOFF = 10.0
MAX_IN_UNSCHEDULABLE = 5 * 60.0
LEFTOVER_FLUSH_INTERVAL = 30.0
BACKOFF_FLUSH_INTERVAL = 1.0

ACTIVE_Q, BACKOFF_Q, UNSCHEDULABLE_Q = "activeQ", "backoffQ", "unschedulablePods"


def is_gated(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("schedulingGates"))


def is_pod_updated(old: Obj, new: Obj) -> bool:
    """isPodUpdated: anything but status, resourceVersion, generation, managedFields and
    finalizers changed."""

    def strip(pod: Obj) -> dict[str, Any]:
        meta = dict(pod.get("metadata") or {})
        for key in ("resourceVersion", "generation", "managedFields", "finalizers"):
            meta.pop(key, None)
        return {**{k: v for k, v in pod.items() if k != "status"}, "metadata": meta}

    return strip(old) != strip(new)


class SchedulingQueue:
    def __init__(
        self,
        less: LessFunc,
        events: Iterable[tuple[ClusterEvent, str]] = (),
        initial_backoff: float = DEFAULT_INITIAL_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._less = less
        self._events = list(events)
        self._initial = initial_backoff
        self._max = max_backoff
        self._clock = clock
        self._cond = threading.Condition()
        self._active: dict[str, QueuedPodInfo] = {}
        self._backoff: dict[str, QueuedPodInfo] = {}
        self._unschedulable: dict[str, QueuedPodInfo] = {}
        self._in_flight: set[str] = set()
        self._cycle = 0
        self._move_request_cycle = -1
        self._closed = False

    # ------------------------------------------------------------------ bookkeeping

    def _new(self, pod: Obj) -> QueuedPodInfo:
        return QueuedPodInfo(PodInfo.of(pod), timestamp=self._clock())

    def backoff_duration(self, count: int) -> float:
        """calculateBackoffDuration: initial * 2^(count-1), at most the maximum."""
        if count <= 0:
            return 0.0
        return min(self._initial * 2 ** (count - 1), self._max)

    def _backoff_expiration(self, qpi: QueuedPodInfo) -> float:
        if qpi.backoff_expiration is None:
            count = qpi.consecutive_errors_count or qpi.unschedulable_count
            qpi.backoff_expiration = qpi.timestamp + self.backoff_duration(count)
        return qpi.backoff_expiration

    def is_backing_off(self, qpi: QueuedPodInfo) -> bool:
        if self._max == 0:
            return False
        return self._backoff_expiration(qpi) > self._clock()

    def _to_active(self, qpi: QueuedPodInfo) -> str:
        if is_gated(qpi.pod):
            self._unschedulable[qpi.uid] = qpi
            return UNSCHEDULABLE_Q
        self._active[qpi.uid] = qpi
        self._cond.notify_all()
        return ACTIVE_Q

    def _drop(self, uid: str) -> QueuedPodInfo | None:
        for q in (self._active, self._backoff, self._unschedulable):
            qpi = q.pop(uid, None)
            if qpi is not None:
                return qpi
        return None

    # ------------------------------------------------------------------ informer events

    def Add(self, pod: Obj) -> None:
        """A new unscheduled pod: to activeQ (unless gated)."""
        with self._cond:
            uid = pod_uid(pod)
            if uid in self._in_flight or self._find(uid) is not None:
                return
            self._to_active(self._new(pod))

    def Update(self, old: Obj, new: Obj) -> None:
        """An unscheduled pod changed: refresh it where it is; an unschedulable pod whose
        spec changed (or whose gates were lifted) gets another attempt."""
        with self._cond:
            uid = pod_uid(new)
            if uid in self._in_flight:
                return
            for q in (self._active, self._backoff):
                if uid in q:
                    q[uid].pod_info = PodInfo.of(new)
                    return
            qpi = self._unschedulable.get(uid)
            if qpi is None:
                self._to_active(self._new(new))
                return
            qpi.pod_info = PodInfo.of(new)
            if is_gated(new) or not (is_pod_updated(old, new) or is_gated(old)):
                return
            del self._unschedulable[uid]
            if self.is_backing_off(qpi):
                self._backoff[uid] = qpi
            else:
                self._to_active(qpi)

    def Delete(self, pod: Obj) -> None:
        with self._cond:
            self._drop(pod_uid(pod))

    # ------------------------------------------------------------------ the scheduler's side

    def Pop(self, timeout: float | None = None) -> QueuedPodInfo | None:
        """The first pod of activeQ by ``Less`` (blocks until there is one); None on
        close or timeout. Starts a scheduling cycle."""
        # real time for blocking; self._clock (fakeable) is for backoff bookkeeping
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._active:
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            best = None
            for qpi in self._active.values():
                if best is None or self._less(qpi, best):
                    best = qpi
            assert best is not None
            del self._active[best.uid]
            self._in_flight.add(best.uid)
            self._cycle += 1
            best.attempts += 1
            if best.initial_attempt_timestamp is None:
                best.initial_attempt_timestamp = time.time()  # wall clock, as plugins compare
            best.backoff_expiration = None
            return best

    def SchedulingCycle(self) -> int:
        with self._cond:
            return self._cycle

    def Done(self, uid: str) -> None:
        """The pod's attempt is over (bound, requeued or gone)."""
        with self._cond:
            self._in_flight.discard(uid)

    def AddUnschedulableIfNotPresent(self, qpi: QueuedPodInfo, pod_cycle: int) -> str:
        """Put a pod whose attempt failed back: backoffQ if a move request came in during
        its attempt or no plugin rejected it (an error), else unschedulablePods."""
        with self._cond:
            self._in_flight.discard(qpi.uid)
            if self._find(qpi.uid) is not None:
                return ""
            if qpi.unschedulable_plugins or qpi.pending_plugins:
                qpi.unschedulable_count += 1
                qpi.consecutive_errors_count = 0
            else:
                qpi.consecutive_errors_count += 1
            qpi.timestamp = self._clock()
            qpi.backoff_expiration = None
            rejectors = qpi.unschedulable_plugins | qpi.pending_plugins
            if self._move_request_cycle >= pod_cycle or not rejectors:
                self._backoff[qpi.uid] = qpi
                return BACKOFF_Q
            self._unschedulable[qpi.uid] = qpi
            return UNSCHEDULABLE_Q

    def _worth_requeuing(self, qpi: QueuedPodInfo, event: ClusterEvent) -> str | None:
        """isPodWorthRequeuing: which queue the event sends the pod to, or None."""
        rejectors = qpi.unschedulable_plugins | qpi.pending_plugins
        if not rejectors or event.resource == WILDCARD:
            return BACKOFF_Q
        for registered, plugin in self._events:
            if plugin in rejectors and registered.matches(event):
                return ACTIVE_Q if plugin in qpi.pending_plugins else BACKOFF_Q
        return None

    def _requeue(self, qpi: QueuedPodInfo, strategy: str) -> str:
        if strategy == BACKOFF_Q and self.is_backing_off(qpi):
            self._backoff[qpi.uid] = qpi
            return BACKOFF_Q
        return self._to_active(qpi)

    def MoveAllToActiveOrBackoffQueue(
        self, event: ClusterEvent, pre_check: Callable[[Obj], bool] | None = None
    ) -> list[str]:
        """A cluster event: move the unschedulable pods it may help; return their keys."""
        with self._cond:
            moved = []
            for uid, qpi in list(self._unschedulable.items()):
                if is_gated(qpi.pod) or (pre_check is not None and not pre_check(qpi.pod)):
                    continue
                strategy = self._worth_requeuing(qpi, event)
                if strategy is None:
                    continue
                del self._unschedulable[uid]
                self._requeue(qpi, strategy)
                moved.append(qpi.key)
            self._move_request_cycle = self._cycle
            return moved

    def Activate(self, pods: Mapping[str, Obj]) -> list[str]:
        """Move these pods (key -> pod) from backoffQ/unschedulablePods to activeQ now."""
        with self._cond:
            moved = []
            for pod in pods.values():
                uid = pod_uid(pod)
                qpi = self._unschedulable.pop(uid, None) or self._backoff.pop(uid, None)
                if qpi is not None and self._to_active(qpi) == ACTIVE_Q:
                    moved.append(qpi.key)
            return moved

    # ------------------------------------------------------------------ background flushes

    def flush_backoff_completed(self) -> None:
        with self._cond:
            for uid, qpi in list(self._backoff.items()):
                if not self.is_backing_off(qpi):
                    del self._backoff[uid]
                    self._to_active(qpi)

    def flush_unschedulable_leftover(self, max_age: float = MAX_IN_UNSCHEDULABLE) -> None:
        with self._cond:
            now = self._clock()
            for uid, qpi in list(self._unschedulable.items()):
                if not is_gated(qpi.pod) and now - qpi.timestamp > max_age:
                    del self._unschedulable[uid]
                    self._requeue(qpi, BACKOFF_Q)

    def run(self, stop: threading.Event) -> None:
        """Pump backoffQ into activeQ every second, leftovers every 30 s, until ``stop``."""
        last_leftover = self._clock()
        while not stop.wait(BACKOFF_FLUSH_INTERVAL):
            self.flush_backoff_completed()
            if self._clock() - last_leftover >= LEFTOVER_FLUSH_INTERVAL:
                last_leftover = self._clock()
                self.flush_unschedulable_leftover()

    def Close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ inspection

    def _find(self, uid: str) -> str | None:
        for name, q in (
            (ACTIVE_Q, self._active),
            (BACKOFF_Q, self._backoff),
            (UNSCHEDULABLE_Q, self._unschedulable),
        ):
            if uid in q:
                return name
        return None

    def where(self, pod: Obj) -> str | None:
        """Which queue holds ``pod`` (None if none: in flight, bound or unknown)."""
        with self._cond:
            return self._find(pod_uid(pod))

    def PendingPods(self) -> dict[str, list[str]]:
        """Pod keys per queue, activeQ in Pop order."""
        with self._cond:
            active = sorted_by(list(self._active.values()), self._less)
            return {
                ACTIVE_Q: [q.key for q in active],
                BACKOFF_Q: sorted(q.key for q in self._backoff.values()),
                UNSCHEDULABLE_Q: sorted(q.key for q in self._unschedulable.values()),
            }


def sorted_by(items: list[QueuedPodInfo], less: LessFunc) -> list[QueuedPodInfo]:
    """``items`` in the order Pop would hand them out."""
    return sorted(
        items, key=cmp_to_key(lambda a, b: -1 if less(a, b) else (1 if less(b, a) else 0))
    )
