"""The scheduling queue: activeQ, backoffQ and unschedulablePods, moved by queueing hints.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/backend/queue/scheduling_queue.go``
(``PriorityQueue`` with SchedulerQueueingHints, GA and locked on since 1.34, and
SchedulerPopFromBackoffQ, beta and on since 1.33), ``active_queue.go`` (in-flight pods
and the events seen while they were in flight) and ``backoff_queue.go``; and
``pkg/scheduler/scheduler.go`` ``buildQueueingHintMap``.

- activeQ: pods ready for an attempt, popped in the order of the profile's QueueSort
  plugin (``Less``). When activeQ is empty, ``Pop`` takes the head of backoffQ instead
  (PopFromBackoffQ): a pod still backing off is tried rather than leaving the scheduler
  idle.
- backoffQ: pods waiting out their backoff (``podInitialBackoffSeconds`` doubling per
  failed attempt up to ``podMaxBackoffSeconds``; an attempt that ended in an error counts
  consecutive errors instead, in a queue of its own that ``Pop`` never takes from).
  Expirations are aligned to whole seconds and the flush runs on each second boundary,
  so pods of one window leave together, in ``Less`` order.
- unschedulablePods: pods some plugins rejected (``unschedulable_plugins``, or
  ``pending_plugins``). A cluster event moves such a pod only if one of *those* plugins
  registered a matching event (``EventsToRegister``) and that registration's
  QueueingHint says ``Queue`` for this pod (``isPodWorthRequeuing``): to activeQ for a
  Pending plugin, else to backoffQ while it still backs off, activeQ otherwise. Events
  that arrive while a pod is in flight (popped, not yet back or bound) are kept and
  replayed for it if it fails (``determineSchedulingHintForInFlightPod``). After 5
  minutes a pod is moved anyway (``UnschedulableTimeout``).
- PreEnqueue plugins (SchedulingGates) run before a pod enters activeQ or backoffQ; a
  pod they refuse waits in unschedulablePods, gated, until an event its gating plugin
  registered arrives.

Every hint decision is reported through ``on_hint`` (the scheduler turns it into a
``QueueingHint`` trace step on the pod; upstream logs it at verbosity 5).

Lab differences: activeQ is a dict scanned with ``Less`` on every Pop (no heap), so a
QueueSort whose order changes over time (Coscheduling's) is always honoured; no
nominator (no preemption); no metrics.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cmp_to_key
from typing import Any

from gpulab.framework.events import (
    EVENT_FORCE_ACTIVATE,
    EVENT_UNSCHEDULABLE_TIMEOUT,
    NODE,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    QueueingHint,
    QueueingHintFn,
    is_wildcard,
    match_any_cluster_event,
    match_cluster_events,
    pod_scheduling_properties_change,
    unroll_wildcard_resource,
)
from gpulab.framework.interface import (
    EnqueueExtensions,
    PreEnqueuePlugin,
    QueuedPodInfo,
)
from gpulab.framework.snapshot import PodInfo, pod_uid

_log = logging.getLogger(__name__)

Obj = Mapping[str, Any]
LessFunc = Callable[[QueuedPodInfo, QueuedPodInfo], bool]

DEFAULT_INITIAL_BACKOFF = 1.0
DEFAULT_MAX_BACKOFF = 10.0
MAX_IN_UNSCHEDULABLE = 5 * 60.0
LEFTOVER_FLUSH_INTERVAL = 30.0
BACKOFF_ORDERING_WINDOW = 1.0

ACTIVE_Q, BACKOFF_Q, UNSCHEDULABLE_Q = "activeQ", "backoffQ", "unschedulablePods"


def scheduler_name(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("schedulerName") or "")


# -- queueing hints per profile (scheduler.go buildQueueingHintMap) -------------------------


@dataclass(frozen=True)
class QueueingHintFunction:
    plugin_name: str
    fn: QueueingHintFn | None  # None: always Queue (defaultQueueingHintFn)


QueueingHintMap = list[tuple[ClusterEvent, QueueingHintFunction]]


class DefaultEnqueueExtension:
    """What a plugin that filters or reserves but says nothing about events gets: every
    event (framework.go defaultEnqueueExtension)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        return unroll_wildcard_resource()


def build_queueing_hint_map(extensions: Iterable[EnqueueExtensions]) -> QueueingHintMap:
    """Each plugin's registrations; a plugin registering Node/Add without
    Node/UpdateNodeTaint also gets UpdateNodeTaint with the default hint (upstream's
    mitigation for kubernetes#109437, still applied in 1.36)."""
    out: QueueingHintMap = []
    for ext in extensions:
        events = ext.EventsToRegister()
        node_added = node_taint = False
        for registered in events:
            if registered.event.resource == NODE:
                node_added |= bool(registered.event.action_type & ActionType.ADD)
                node_taint |= bool(registered.event.action_type & ActionType.UPDATE_NODE_TAINT)
            out.append(
                (registered.event, QueueingHintFunction(ext.name, registered.queueing_hint_fn))
            )
        if node_added and not node_taint:
            taint = ClusterEvent(NODE, ActionType.UPDATE_NODE_TAINT)
            out.append((taint, QueueingHintFunction(ext.name, None)))
    return out


class Strategy(Enum):
    """queueingStrategy."""

    SKIP = "queueSkip"
    AFTER_BACKOFF = "queueAfterBackoff"
    IMMEDIATELY = "queueImmediately"


HintListener = Callable[[QueuedPodInfo, ClusterEvent, str, str], None]
"""(pod, event, outcome: the queue it went to or an IN_FLIGHT verdict, why: "<plugin>
says <hint>" ...)"""

IN_FLIGHT = {
    Strategy.SKIP: "seen while in flight: no help",
    Strategy.AFTER_BACKOFF: "seen while in flight: retry after backoff",
    Strategy.IMMEDIATELY: "seen while in flight: retry at once",
}


@dataclass
class _InFlightEvent:
    event: ClusterEvent
    old: Any
    new: Any


class SchedulingQueue:
    def __init__(
        self,
        less: LessFunc,
        hints: Mapping[str, QueueingHintMap],
        pre_enqueue: Mapping[str, Sequence[PreEnqueuePlugin]] | None = None,
        initial_backoff: float = DEFAULT_INITIAL_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        clock: Callable[[], float] = time.time,
        on_hint: HintListener | None = None,
    ) -> None:
        self._less = less
        self._hints = {profile: list(m) for profile, m in hints.items()}
        self._pre_enqueue = {p: list(pl) for p, pl in (pre_enqueue or {}).items()}
        self._plugin_events: dict[str, list[ClusterEvent]] = {}
        for m in self._hints.values():
            for event, fn in m:
                self._plugin_events.setdefault(fn.plugin_name, []).append(event)
        self._initial = initial_backoff
        self._max = max_backoff
        self._clock = clock
        self._on_hint = on_hint
        self._cond = threading.Condition()
        self._active: dict[str, QueuedPodInfo] = {}
        self._backoff: dict[str, QueuedPodInfo] = {}  # podBackoffQ
        self._error_backoff: dict[str, QueuedPodInfo] = {}  # podErrorBackoffQ
        self._unschedulable: dict[str, QueuedPodInfo] = {}
        # inFlightEvents: pod UIDs (a pod's attempt started here) and events, in order
        self._in_flight: list[str | _InFlightEvent] = []
        self._in_flight_pods: set[str] = set()
        self._cycle = 0
        self._closed = False

    # ------------------------------------------------------------------ backoff

    def backoff_duration(self, count: int) -> float:
        """calculateBackoffDuration: initial * 2^(count-1), at most the maximum."""
        if count <= 0:
            return 0.0
        return min(self._initial * 2 ** (count - 1), self._max)

    @staticmethod
    def _align(t: float) -> float:
        """alignToWindow: the start of t's 1-second ordering window."""
        return math.floor(t / BACKOFF_ORDERING_WINDOW) * BACKOFF_ORDERING_WINDOW

    def backoff_time(self, qpi: QueuedPodInfo) -> float:
        """getBackoffTime: when the pod's backoff ends, aligned to its window (0: no
        backoff at all)."""
        if self._max == 0:
            return 0.0
        count = qpi.consecutive_errors_count or qpi.unschedulable_count
        if count == 0:
            return 0.0
        if qpi.backoff_expiration is None:
            qpi.backoff_expiration = self._align(qpi.timestamp + self.backoff_duration(count))
        return qpi.backoff_expiration

    def is_backing_off(self, qpi: QueuedPodInfo) -> bool:
        """isPodBackingoff: its window has not passed yet (the current window counts as
        backing off)."""
        return not self.backoff_time(qpi) < self._align(self._clock())

    def _backoff_less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        """lessBackoffCompletedWithPriority: earlier window first, then ``Less``."""
        ta, tb = self.backoff_time(a), self.backoff_time(b)
        return ta < tb if ta != tb else self._less(a, b)

    # ------------------------------------------------------------------ moving pods

    def _run_pre_enqueue_plugins(self, qpi: QueuedPodInfo) -> None:
        """runPreEnqueuePlugins: the gating plugin first, then the others; the first
        refusal gates the pod."""
        plugins = self._pre_enqueue.get(scheduler_name(qpi.pod), [])
        ordered = sorted(plugins, key=lambda p: p.name != qpi.gating_plugin)
        for plugin in ordered:
            status = plugin.PreEnqueue(qpi.pod)
            if not status.is_success():
                qpi.unschedulable_plugins.add(plugin.name)
                qpi.gating_plugin = plugin.name
                qpi.gating_plugin_events = self._plugin_events.get(plugin.name, [])
                return
        qpi.gating_plugin = ""

    def _pop_from_queues(self, uid: str) -> None:
        for q in (self._unschedulable, self._backoff, self._error_backoff):
            q.pop(uid, None)

    def _move_to_active(self, qpi: QueuedPodInfo, moves_from_backoff: bool = False) -> bool:
        """moveToActiveQ: PreEnqueue (skipped for a pod coming out of backoffQ, which
        passed it on the way in), then activeQ - or unschedulablePods if gated."""
        if not moves_from_backoff:
            self._run_pre_enqueue_plugins(qpi)
        if qpi.gated():
            if qpi.uid in self._active or self._in_backoff(qpi.uid):
                return False
            self._unschedulable[qpi.uid] = qpi
            return False
        if qpi.initial_attempt_timestamp is None:
            qpi.initial_attempt_timestamp = self._clock()
        self._pop_from_queues(qpi.uid)
        self._active[qpi.uid] = qpi
        self._cond.notify_all()
        return True

    def _move_to_backoff(self, qpi: QueuedPodInfo) -> bool:
        """moveToBackoffQ: PreEnqueue runs here (PopFromBackoffQ); an error goes to the
        error backoff queue."""
        self._run_pre_enqueue_plugins(qpi)
        if qpi.gated():
            self._unschedulable[qpi.uid] = qpi
            return False
        self._pop_from_queues(qpi.uid)
        if qpi.unschedulable_plugins or qpi.pending_plugins:
            self._backoff[qpi.uid] = qpi
        else:
            self._error_backoff[qpi.uid] = qpi
        self._cond.notify_all()  # Pop may take it (PopFromBackoffQ)
        return True

    def _requeue(self, qpi: QueuedPodInfo, strategy: Strategy) -> str:
        """requeuePodWithQueueingStrategy: which queue the pod ends up in."""
        if strategy is Strategy.SKIP:
            self._unschedulable[qpi.uid] = qpi
            return UNSCHEDULABLE_Q
        if strategy is Strategy.AFTER_BACKOFF and self.is_backing_off(qpi):
            return BACKOFF_Q if self._move_to_backoff(qpi) else UNSCHEDULABLE_Q
        return ACTIVE_Q if self._move_to_active(qpi) else UNSCHEDULABLE_Q

    # ------------------------------------------------------------------ queueing hints

    def _is_event_of_interest(self, event: ClusterEvent) -> bool:
        if is_wildcard(event):
            return True
        return any(
            match_cluster_events(registered, event)
            for m in self._hints.values()
            for registered, _ in m
        )

    def _is_pod_worth_requeuing(
        self, qpi: QueuedPodInfo, event: ClusterEvent, old: Any, new: Any
    ) -> tuple[Strategy, str]:
        """isPodWorthRequeuing: ask the hints of the plugins that rejected the pod; return
        the strategy and who decided it."""
        rejectors = qpi.unschedulable_plugins | qpi.pending_plugins
        if not rejectors:
            return Strategy.AFTER_BACKOFF, "no plugin rejected it"
        if is_wildcard(event):
            if new is not None and (not isinstance(new, Mapping) or pod_uid(new) != qpi.uid):
                return Strategy.SKIP, "a wildcard event for another pod"
            return Strategy.AFTER_BACKOFF, "a wildcard event"
        strategy, said = Strategy.SKIP, []
        for registered, hint in self._hints.get(scheduler_name(qpi.pod), []):
            if hint.plugin_name not in rejectors or not match_cluster_events(registered, event):
                continue
            answer = self._call_hint(hint, qpi, event, old, new)
            said.append(f"{hint.plugin_name} says {answer}")
            if answer is QueueingHint.QUEUE_SKIP:
                continue
            if hint.plugin_name in qpi.pending_plugins:
                return Strategy.IMMEDIATELY, "; ".join(said)
            if not qpi.pending_plugins:
                return Strategy.AFTER_BACKOFF, "; ".join(said)
            strategy = Strategy.AFTER_BACKOFF
        if not said:
            return strategy, f"no rejector ({', '.join(sorted(rejectors))}) registered for it"
        return strategy, "; ".join(said)

    @staticmethod
    def _call_hint(
        hint: QueueingHintFunction, qpi: QueuedPodInfo, event: ClusterEvent, old: Any, new: Any
    ) -> QueueingHint:
        if hint.fn is None:
            return QueueingHint.QUEUE
        try:
            return hint.fn(qpi.pod, old, new)
        except Exception:  # upstream: a hint that errs counts as Queue, so no pod is stuck
            _log.exception(
                "QueueingHint of %s failed for %s on %s", hint.plugin_name, qpi.key, event.label
            )
            return QueueingHint.QUEUE

    def _report(self, qpi: QueuedPodInfo, event: ClusterEvent, where: str, why: str) -> None:
        if self._on_hint is not None:
            self._on_hint(qpi, event, where, why)

    def _move_pods(
        self, pods: Iterable[QueuedPodInfo], event: ClusterEvent, old: Any, new: Any
    ) -> list[str]:
        """movePodsToActiveOrBackoffQueue; the keys of the pods moved."""
        if not self._is_event_of_interest(event):
            return []
        moved = []
        for qpi in list(pods):
            if qpi.gated() and not match_any_cluster_event(event, qpi.gating_plugin_events):
                continue  # nothing its gating plugin waits for
            strategy, why = self._is_pod_worth_requeuing(qpi, event, old, new)
            if strategy is Strategy.SKIP:
                self._report(qpi, event, UNSCHEDULABLE_Q, why)
                continue
            del self._unschedulable[qpi.uid]
            where = self._requeue(qpi, strategy)
            self._report(qpi, event, where, why)
            if where != UNSCHEDULABLE_Q:
                moved.append(qpi.key)
        if self._in_flight_pods:
            self._in_flight.append(_InFlightEvent(event, old, new))
        return moved

    def _hint_for_in_flight_pod(self, qpi: QueuedPodInfo) -> Strategy:
        """determineSchedulingHintForInFlightPod: replay the events seen since the pod
        was popped."""
        if not qpi.unschedulable_plugins and not qpi.pending_plugins:
            return Strategy.AFTER_BACKOFF
        start = self._in_flight.index(qpi.uid) if qpi.uid in self._in_flight_pods else None
        if start is None:
            _log.error("in-flight pod %s is not in the scheduling queue (a bug)", qpi.key)
            return Strategy.AFTER_BACKOFF
        strategy = Strategy.SKIP
        for entry in self._in_flight[start + 1 :]:
            if not isinstance(entry, _InFlightEvent):
                continue
            found, why = self._is_pod_worth_requeuing(qpi, entry.event, entry.old, entry.new)
            self._report(qpi, entry.event, IN_FLIGHT[found], why)
            if found is Strategy.IMMEDIATELY:
                return found
            if found is Strategy.AFTER_BACKOFF:
                strategy = found
                if not qpi.pending_plugins:
                    return strategy
        return strategy

    # ------------------------------------------------------------------ informer events

    def _new(self, pod: Obj) -> QueuedPodInfo:
        return QueuedPodInfo(PodInfo.of(pod), timestamp=self._clock())

    def _in_backoff(self, uid: str) -> bool:
        return uid in self._backoff or uid in self._error_backoff

    def Add(self, pod: Obj) -> None:
        """A new unscheduled pod: to activeQ (unless a PreEnqueue plugin gates it)."""
        with self._cond:
            uid = pod_uid(pod)
            if uid in self._in_flight_pods or self._find(uid) is not None:
                return
            self._move_to_active(self._new(pod))

    def Update(self, old: Obj, new: Obj) -> None:
        """An unscheduled pod changed: an in-flight pod remembers the update; in activeQ
        or backoffQ it is refreshed; in unschedulablePods the update's events
        (PodSchedulingPropertiesChange) go through the rejectors' hints."""
        with self._cond:
            uid = pod_uid(new)
            events = pod_scheduling_properties_change(new, old)
            if uid in self._in_flight_pods:
                for event in events:
                    self._in_flight.append(_InFlightEvent(event, old, new))
                return
            for q in (self._active, self._backoff, self._error_backoff):
                if uid in q:
                    q[uid].pod_info = PodInfo.of(new)
                    return
            qpi = self._unschedulable.get(uid)
            if qpi is None:
                self._move_to_active(self._new(new))
                return
            qpi.pod_info = PodInfo.of(new)
            for event in events:
                strategy, why = self._is_pod_worth_requeuing(qpi, event, old, new)
                where = self._requeue(qpi, strategy)
                self._report(qpi, event, where, why)
                if where != UNSCHEDULABLE_Q:
                    break

    def Delete(self, pod: Obj) -> None:
        with self._cond:
            uid = pod_uid(pod)
            for q in (self._active, self._backoff, self._error_backoff, self._unschedulable):
                q.pop(uid, None)

    def MoveAllToActiveOrBackoffQueue(
        self,
        event: ClusterEvent,
        old: Any = None,
        new: Any = None,
        pre_check: Callable[[Obj], bool] | None = None,
    ) -> list[str]:
        """A cluster event: move the unschedulable pods whose rejectors' hints say it
        may help them; return their keys."""
        with self._cond:
            if not self._is_event_of_interest(event):
                return []
            pods = [
                q for q in self._unschedulable.values() if pre_check is None or pre_check(q.pod)
            ]
            return self._move_pods(pods, event, old, new)

    def Activate(self, pods: Mapping[str, Obj]) -> list[str]:
        """Move these pods (key -> pod) from backoffQ/unschedulablePods to activeQ now;
        a pod in flight gets a ForceActivate event, so it comes back if it fails."""
        with self._cond:
            moved = []
            for pod in pods.values():
                uid = pod_uid(pod)
                qpi = self._unschedulable.get(uid)
                from_backoff = False
                if qpi is None:
                    qpi = self._backoff.pop(uid, None) or self._error_backoff.pop(uid, None)
                    from_backoff = qpi is not None
                if qpi is not None:
                    if self._move_to_active(qpi, from_backoff):
                        moved.append(qpi.key)
                        self._report(qpi, EVENT_FORCE_ACTIVATE, ACTIVE_Q, "a plugin activated it")
                elif uid in self._in_flight_pods:
                    self._in_flight.append(_InFlightEvent(EVENT_FORCE_ACTIVATE, None, pod))
            return moved

    # ------------------------------------------------------------------ the scheduler's side

    def Pop(self, timeout: float | None = None) -> QueuedPodInfo | None:
        """The first pod of activeQ by ``Less`` - or, with activeQ empty, the head of
        backoffQ (PopFromBackoffQ). Blocks until there is one; None on close or timeout.
        Starts a scheduling cycle."""
        # real time for blocking; self._clock (fakeable) is for the queue's bookkeeping
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._active and not self._backoff:
                if self._closed:
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._active:
                best = _first(self._active.values(), self._less)
                del self._active[best.uid]
            else:
                best = _first(self._backoff.values(), self._backoff_less)
                del self._backoff[best.uid]
            best.attempts += 1
            self._in_flight_pods.add(best.uid)
            self._in_flight.append(best.uid)
            self._cycle += 1
            return best

    def SchedulingCycle(self) -> int:
        with self._cond:
            return self._cycle

    def Done(self, uid: str) -> None:
        """The pod's attempt is over (bound, requeued or gone): forget its in-flight
        events."""
        with self._cond:
            self._done(uid)

    def _done(self, uid: str) -> None:
        if uid not in self._in_flight_pods:
            return
        self._in_flight_pods.discard(uid)
        self._in_flight.remove(uid)
        while self._in_flight and isinstance(self._in_flight[0], _InFlightEvent):
            del self._in_flight[0]  # only pods that are gone saw these

    def AddUnschedulableIfNotPresent(self, qpi: QueuedPodInfo) -> str:
        """Put a pod whose attempt failed back, where the events it missed while in
        flight send it (unschedulablePods if none helps); return the queue."""
        with self._cond:
            try:
                if self._find(qpi.uid) is not None:
                    _log.error("pod %s is already in the scheduling queue", qpi.key)
                    return ""
                if qpi.unschedulable_plugins or qpi.pending_plugins:
                    qpi.unschedulable_count += 1
                    qpi.consecutive_errors_count = 0
                else:
                    qpi.consecutive_errors_count += 1
                qpi.timestamp = self._clock()
                qpi.backoff_expiration = None
                return self._requeue(qpi, self._hint_for_in_flight_pod(qpi))
            finally:
                self._done(qpi.uid)

    # ------------------------------------------------------------------ background flushes

    def flush_backoff_completed(self) -> None:
        """flushBackoffQCompleted: pods whose window has passed go to activeQ."""
        with self._cond:
            for q in (self._backoff, self._error_backoff):
                for qpi in sorted_by(list(q.values()), self._backoff_less):
                    if self.is_backing_off(qpi):
                        break
                    del q[qpi.uid]
                    self._move_to_active(qpi, moves_from_backoff=True)

    def flush_unschedulable_leftover(self, max_age: float = MAX_IN_UNSCHEDULABLE) -> None:
        """flushUnschedulablePodsLeftover: pods waiting longer than ``max_age``."""
        with self._cond:
            now = self._clock()
            old = [q for q in self._unschedulable.values() if now - q.timestamp > max_age]
            if old:
                self._move_pods(old, EVENT_UNSCHEDULABLE_TIMEOUT, None, None)

    def run(self, stop: threading.Event) -> None:
        """Flush backoffQ on every whole second (waitUntilAlignedWithOrderingWindow) and
        the leftovers every 30 s, until ``stop``."""
        last_leftover = time.monotonic()
        while not stop.wait(BACKOFF_ORDERING_WINDOW - time.time() % BACKOFF_ORDERING_WINDOW):
            self.flush_backoff_completed()
            if time.monotonic() - last_leftover >= LEFTOVER_FLUSH_INTERVAL:
                last_leftover = time.monotonic()
                self.flush_unschedulable_leftover()

    def Close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ inspection

    def _find(self, uid: str) -> str | None:
        if uid in self._active:
            return ACTIVE_Q
        if self._in_backoff(uid):
            return BACKOFF_Q
        if uid in self._unschedulable:
            return UNSCHEDULABLE_Q
        return None

    def where(self, pod: Obj) -> str | None:
        """Which queue holds ``pod`` (None if none: in flight, bound or unknown)."""
        with self._cond:
            return self._find(pod_uid(pod))

    def get(self, pod: Obj) -> QueuedPodInfo | None:
        """GetPod: the pod's queue entry, if it is in a queue."""
        uid = pod_uid(pod)
        with self._cond:
            for q in (self._active, self._backoff, self._error_backoff, self._unschedulable):
                if uid in q:
                    return q[uid]
            return None

    def PendingPods(self) -> dict[str, list[str]]:
        """Pod keys per queue, activeQ in Pop order, backoffQ in its order."""
        with self._cond:
            backoff = sorted_by(list(self._backoff.values()), self._backoff_less)
            errors = sorted_by(list(self._error_backoff.values()), self._backoff_less)
            return {
                ACTIVE_Q: [q.key for q in sorted_by(list(self._active.values()), self._less)],
                BACKOFF_Q: [q.key for q in backoff + errors],
                UNSCHEDULABLE_Q: sorted(q.key for q in self._unschedulable.values()),
            }


def _first(items: Iterable[QueuedPodInfo], less: LessFunc) -> QueuedPodInfo:
    best: QueuedPodInfo | None = None
    for qpi in items:
        if best is None or less(qpi, best):
            best = qpi
    assert best is not None
    return best


def sorted_by(items: list[QueuedPodInfo], less: LessFunc) -> list[QueuedPodInfo]:
    """``items`` in the order Pop would hand them out."""
    return sorted(
        items, key=cmp_to_key(lambda a, b: -1 if less(a, b) else (1 if less(b, a) else 0))
    )
