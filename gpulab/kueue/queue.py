"""The queue manager: pending Workloads per ClusterQueue, the heads a scheduling cycle
takes, and the inadmissible Workloads parked until something can make them fit. No I/O.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/cache/queue:
- cluster_queue.go: a heap per ClusterQueue ordered by (the sticky preemptor first,)
  priority, then ``GetQueueOrderTimestamp``, then UID; ``Pop`` takes the head;
  ``requeueIfNotPresent`` puts a Workload that could not be admitted back into the heap
  only when told to (``immediate``: StrictFIFO, a failure after nomination, a pending
  preemption) or when ``QueueInadmissibleWorkloads`` ran since the last ``Pop``
  (``queueInadmissibleCycle >= popCycle``) or the flavor scan has flavors left;
  otherwise into ``inadmissibleWorkloads``.
- manager.go: ``AddOrUpdateWorkload`` (the LocalQueue names the ClusterQueue: this is
  the lab's "FindClusterQueue"), ``RequeueWorkload``, ``Heads``,
  ``QueueAssociatedInadmissibleWorkloadsAfter``.
- inadmissible_workloads.go: ``NotifyRetryInadmissible`` → a requeue request per
  ClusterQueue, or per root Cohort when it has one (batched by the caller, 1 s upstream),
  → ``queueInadmissibleWorkloads`` moves the parked Workloads back (namespace still
  selected, backoff over). Events that call it: a ClusterQueue or Cohort added or its
  spec changed, a ResourceFlavor or AdmissionCheck changed, a Workload that held quota
  finished, was evicted or deleted. No periodic re-sort of everything.

Not here: the scheduling-equivalence bulk move (SchedulingEquivalenceHashing) and the
second-pass queue (TAS).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.kueue import api
from gpulab.kueue.model import LocalQueue, WorkloadInfo, selector_matches


class RequeueReason(enum.Enum):
    GENERIC = ""
    FAILED_AFTER_NOMINATION = "FailedAfterNomination"
    NAMESPACE_MISMATCH = "NamespaceMismatch"
    PENDING_PREEMPTION = "PendingPreemption"
    PREEMPTION_FAILED = "PreemptionFailed"
    NO_FIT = "NoFit"
    PREEMPTION_NO_CANDIDATES = "PreemptionNoCandidates"


@dataclass(frozen=True)
class Head:
    info: WorkloadInfo
    is_preemptor: bool = False


@dataclass
class ClusterQueueQueue:
    """queue.ClusterQueue: the heap, the inadmissible set and the cycle counters."""

    name: str
    strategy: str = api.BEST_EFFORT_FIFO
    namespace_selector: Mapping[str, Any] | None = None
    cohort: str | None = None
    items: dict[str, WorkloadInfo] = field(default_factory=dict)  # in the heap
    inadmissible: dict[str, WorkloadInfo] = field(default_factory=dict)
    inflight: str | None = None
    inflight_info: WorkloadInfo | None = None  # the Workload ``inflight`` names, for Snapshot
    sticky: str | None = None  # the preemptor waiting for its victims (BestEffortFIFO)
    preemptor: str | None = None
    pop_cycle: int = 0
    queue_inadmissible_cycle: int = -1
    _heap: list[tuple[tuple[object, ...], int, str]] = field(default_factory=list)
    _seq: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]

    def _push(self, wl: WorkloadInfo) -> None:
        self.items[wl.key] = wl
        heapq.heappush(self._heap, (_order(wl), next(self._seq), wl.key))

    def push_or_update(self, wl: WorkloadInfo, now: float) -> None:
        if wl.key == self.inflight:
            return  # RequeueWorkload places it with its newest version
        if wl.key in self.inadmissible:
            old = self.inadmissible[wl.key]
            if _same_for_admission(old.obj, wl.obj):
                self.inadmissible[wl.key] = wl
                return
            del self.inadmissible[wl.key]
        if wl.key not in self.items and not _backoff_expired(wl, now):
            self.inadmissible[wl.key] = wl
            return
        self._push(wl)

    def delete(self, key: str) -> None:
        self.items.pop(key, None)
        self.inadmissible.pop(key, None)
        if self.inflight == key:
            self.inflight = None
        if self.sticky == key:
            self.sticky = None
        if self.preemptor == key:
            self.preemptor = None

    def pop(self) -> WorkloadInfo | None:
        self.pop_cycle += 1
        if self.sticky is not None and self.sticky in self.items:
            wl = self.items.pop(self.sticky)
        else:
            wl = None
            while self._heap:
                _order, _seq, key = heapq.heappop(self._heap)
                if key in self.items:
                    wl = self.items.pop(key)
                    break
        self.inflight = wl.key if wl else None
        self.inflight_info = wl
        return wl

    def requeue_if_not_present(self, wl: WorkloadInfo, reason: RequeueReason, now: float) -> bool:
        if self.strategy == api.STRICT_FIFO:
            immediate = reason is not RequeueReason.NAMESPACE_MISMATCH
        else:
            immediate = reason in (
                RequeueReason.FAILED_AFTER_NOMINATION,
                RequeueReason.PENDING_PREEMPTION,
                RequeueReason.PREEMPTION_FAILED,
            )
        if reason is RequeueReason.PENDING_PREEMPTION:
            self.preemptor = wl.key
            self.sticky = wl.key if self.strategy == api.BEST_EFFORT_FIFO else None
        if self.inflight == wl.key:
            self.inflight = None
        pending_flavors = wl.last_assignment is not None and wl.last_assignment.pending_flavors()
        if _backoff_expired(wl, now) and (
            immediate or self.queue_inadmissible_cycle >= self.pop_cycle or pending_flavors
        ):
            self.inadmissible.pop(wl.key, None)
            if wl.key in self.items:
                return False
            self._push(wl)
            return True
        if wl.key in self.inadmissible or wl.key in self.items:
            return False
        self.inadmissible[wl.key] = wl
        return True

    def queue_inadmissible(
        self, namespace_labels: Callable[[str], Mapping[str, str] | None], now: float
    ) -> int:
        """queueInadmissibleWorkloads: back to the heap what may fit now."""
        self.queue_inadmissible_cycle = self.pop_cycle
        moved = 0
        for key, wl in list(self.inadmissible.items()):
            labels = namespace_labels(wl.namespace)
            if labels is None or not selector_matches(self.namespace_selector, labels):
                continue
            if not _backoff_expired(wl, now):
                continue
            del self.inadmissible[key]
            self._push(wl)
            moved += 1
        return moved

    def pending(self) -> tuple[int, int]:
        """(active, inadmissible) pending Workloads, the in-flight one counted active."""
        active = len(self.items) + (1 if self.inflight else 0)
        return active, len(self.inadmissible)

    def all_pending(self) -> list[WorkloadInfo]:
        return [*self.items.values(), *self.inadmissible.values()]

    def snapshot(self) -> list[WorkloadInfo]:
        """Snapshot: every pending Workload (heap, inadmissible, in flight) in queue
        order, the sticky preemptor first, as the visibility API lists them."""
        pending = self.all_pending()
        info = self.inflight_info
        if info is not None and self.inflight == info.key and info.key not in self.items:
            pending.append(info)
        return sorted(pending, key=lambda wl: (wl.key != self.sticky, _order(wl)))


def _order(wl: WorkloadInfo) -> tuple[int, float, str]:
    """The heap's less function: higher priority, then the earlier queue-order
    timestamp, then the UID."""
    return (-wl.priority, wl.queue_ts, wl.uid)


def _same_for_admission(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """PushOrUpdate keeps a parked Workload parked unless its spec, eviction or
    requeue state changed."""

    def cond(o: Mapping[str, Any], t: str) -> Any:
        return next(
            (c for c in (o.get("status") or {}).get("conditions") or [] if c.get("type") == t),
            None,
        )

    return (
        old.get("spec") == new.get("spec")
        and cond(old, api.EVICTED) == cond(new, api.EVICTED)
        and cond(old, api.REQUEUED) == cond(new, api.REQUEUED)
    )


def _backoff_expired(wl: WorkloadInfo, now: float) -> bool:
    """backoffWaitingTimeExpired: Requeued=False holds a Workload; so does requeueAt."""
    requeued = next(
        (
            c
            for c in (wl.obj.get("status") or {}).get("conditions") or []
            if c.get("type") == api.REQUEUED
        ),
        None,
    )
    if requeued is not None and requeued.get("status") == "False":
        return False
    return wl.requeue_at is None or now >= wl.requeue_at


@dataclass
class Manager:
    """queue.Manager."""

    # (kind, name) of a requeue request: ("ClusterQueue", cq) or ("Cohort", root cohort)
    requeuer: Callable[[str, str], None] = lambda _kind, _name: None
    namespace_labels: Callable[[str], Mapping[str, str] | None] = lambda _ns: {}
    cohort_parents: dict[str, str | None] = field(default_factory=dict)
    is_active: Callable[[str], bool] = lambda _cq: True
    clock: Callable[[], float] = time.time
    cluster_queues: dict[str, ClusterQueueQueue] = field(default_factory=dict)
    local_queues: dict[str, LocalQueue] = field(default_factory=dict)
    # Workload key -> LocalQueue key it was queued under.
    assigned: dict[str, str] = field(default_factory=dict)
    # Workloads whose LocalQueue or ClusterQueue is missing, or whose LocalQueue is stopped.
    parked: dict[str, WorkloadInfo] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)

    # -- ClusterQueues and LocalQueues --------------------------------------------------

    def add_or_update_cluster_queue(
        self,
        name: str,
        strategy: str,
        namespace_selector: Mapping[str, Any] | None,
        cohort: str | None,
        spec_changed: bool = True,
    ) -> None:
        with self.cond:
            cq = self.cluster_queues.get(name)
            if cq is None:
                cq = self.cluster_queues[name] = ClusterQueueQueue(name)
                for wl_key, lq_key in self.assigned.items():
                    lq = self.local_queues.get(lq_key)
                    parked = self.parked.pop(wl_key, None)
                    if lq is not None and lq.cluster_queue == name and parked is not None:
                        cq.push_or_update(parked, self.clock())
            cq.strategy, cq.namespace_selector, cq.cohort = strategy, namespace_selector, cohort
            if spec_changed:
                self.notify_retry_inadmissible({name})
            self.cond.notify_all()

    def delete_cluster_queue(self, name: str) -> None:
        with self.cond:
            cq = self.cluster_queues.pop(name, None)
            if cq is not None:
                for wl in cq.all_pending():
                    self.parked[wl.key] = wl

    def add_or_update_local_queue(self, lq: LocalQueue) -> None:
        with self.cond:
            old = self.local_queues.get(lq.key)
            self.local_queues[lq.key] = lq
            if old is not None and old.cluster_queue != lq.cluster_queue:
                return  # spec.clusterQueue is immutable (CEL); nothing moves
            if old is None or old.stop_policy != lq.stop_policy:
                for wl_key, lq_key in list(self.assigned.items()):
                    parked = self.parked.get(wl_key)
                    if lq_key == lq.key and parked is not None:
                        self._add(parked)
            self.cond.notify_all()

    def delete_local_queue(self, key: str) -> None:
        with self.cond:
            lq = self.local_queues.pop(key, None)
            if lq is None:
                return
            cq = self.cluster_queues.get(lq.cluster_queue)
            for wl_key, lq_key in self.assigned.items():
                if lq_key == key and cq is not None:
                    wl = cq.items.get(wl_key) or cq.inadmissible.get(wl_key)
                    cq.delete(wl_key)
                    if wl is not None:
                        self.parked[wl_key] = wl

    def cluster_queue_for(self, namespace: str, queue_name: str) -> str | None:
        lq = self.local_queues.get(f"{namespace}/{queue_name}")
        return lq.cluster_queue if lq is not None else None

    # -- Workloads -----------------------------------------------------------------------

    def add_or_update_workload(self, wl: WorkloadInfo) -> bool:
        """Queue a pending Workload in its LocalQueue's ClusterQueue; False (parked) when
        the LocalQueue or ClusterQueue is missing or the LocalQueue is stopped."""
        with self.cond:
            added = self._add(wl)
            if added:
                self.cond.notify_all()
            return added

    def _add(self, wl: WorkloadInfo) -> bool:
        lq_key = f"{wl.namespace}/{wl.queue_name}"
        old_lq = self.assigned.get(wl.key)
        if old_lq is not None and old_lq != lq_key:
            self._delete(wl.key)
        self.assigned[wl.key] = lq_key
        lq = self.local_queues.get(lq_key)
        cq = self.cluster_queues.get(lq.cluster_queue) if lq else None
        if lq is None or cq is None or lq.stop_policy != api.STOP_NONE:
            self.parked[wl.key] = wl
            for other in self.cluster_queues.values():
                other.delete(wl.key)
            return False
        self.parked.pop(wl.key, None)
        wl.cluster_queue = cq.name
        cq.push_or_update(wl, self.clock())
        return True

    def requeue_workload(self, wl: WorkloadInfo, reason: RequeueReason) -> bool:
        """RequeueWorkload: back into its ClusterQueue after a cycle that did not admit it
        (the caller checks it is still admissible)."""
        with self.cond:
            lq = self.local_queues.get(f"{wl.namespace}/{wl.queue_name}")
            cq = self.cluster_queues.get(lq.cluster_queue) if lq else None
            if cq is None:
                return False
            added = cq.requeue_if_not_present(wl, reason, self.clock())
            if added:
                self.cond.notify_all()
            return added

    def delete_workload(self, key: str, forget: bool = True) -> None:
        """Out of the queues; ``forget`` also drops which LocalQueue it came from
        (DeleteAndForgetWorkload), kept while it holds quota so its release can
        requeue its ClusterQueue."""
        with self.cond:
            self._delete(key, forget)

    def _delete(self, key: str, forget: bool = True) -> None:
        self.parked.pop(key, None)
        if forget:
            self.assigned.pop(key, None)
        for cq in self.cluster_queues.values():
            cq.delete(key)

    def is_preemptor(self, cq_name: str, key: str) -> bool:
        cq = self.cluster_queues.get(cq_name)
        return cq is not None and cq.preemptor == key

    # -- heads ---------------------------------------------------------------------------

    def heads(self) -> list[Head]:
        """One Workload per active ClusterQueue, popped (Manager.heads)."""
        with self.cond:
            out = []
            for name, cq in self.cluster_queues.items():
                if not self.is_active(name):
                    continue
                wl = cq.pop()
                if wl is None:
                    continue
                wl.cluster_queue = name
                out.append(Head(wl, cq.preemptor == wl.key))
            return out

    def wait_for_heads(self, stop: threading.Event, timeout: float = 1.0) -> list[Head]:
        """Heads, blocking until there are some, ``stop`` is set or ``timeout`` passes."""
        heads = self.heads()
        if heads or stop.is_set():
            return heads
        with self.cond:
            self.cond.wait(timeout)
        return self.heads()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    # -- inadmissible Workloads ----------------------------------------------------------------

    def root_cohort(self, cohort: str) -> str:
        seen = {cohort}
        while (parent := self.cohort_parents.get(cohort)) and parent not in seen:
            seen.add(parent)
            cohort = parent
        return cohort

    def notify_retry_inadmissible(self, cq_names: set[str]) -> None:
        """NotifyRetryInadmissible: a requeue request per ClusterQueue, or per root
        Cohort for ClusterQueues in one."""
        for name in cq_names:
            cq = self.cluster_queues.get(name)
            if cq is None:
                continue
            if cq.cohort:
                self.requeuer("Cohort", self.root_cohort(cq.cohort))
            else:
                self.requeuer("ClusterQueue", name)

    def queue_associated_inadmissible_after(self, wl_key: str) -> None:
        """QueueAssociatedInadmissibleWorkloadsAfter: a Workload that held quota is gone."""
        with self.cond:
            lq = self.local_queues.get(self.assigned.get(wl_key, ""))
            if lq is not None:
                self.notify_retry_inadmissible({lq.cluster_queue})

    def requeue_inadmissible(self, kind: str, name: str) -> int:
        """The requeuer's reconcile: requeueWorkloadsCQ or requeueWorkloadsCohort."""
        with self.cond:
            if kind == "ClusterQueue":
                targets = [self.cluster_queues[name]] if name in self.cluster_queues else []
            else:
                targets = [
                    cq
                    for cq in self.cluster_queues.values()
                    if cq.cohort and self.root_cohort(cq.cohort) == name
                ]
            now = self.clock()
            moved = sum(cq.queue_inadmissible(self.namespace_labels, now) for cq in targets)
            if moved:
                self.cond.notify_all()
            return moved

    # -- counts ----------------------------------------------------------------------------------

    def pending(self, cq_name: str) -> tuple[int, int]:
        with self.cond:
            cq = self.cluster_queues.get(cq_name)
            return cq.pending() if cq else (0, 0)

    def pending_in_local_queue(self, lq_key: str) -> int:
        with self.cond:
            lq = self.local_queues.get(lq_key)
            cq = self.cluster_queues.get(lq.cluster_queue) if lq else None
            if cq is None:
                return sum(1 for k, v in self.assigned.items() if v == lq_key and k in self.parked)
            keys = [*cq.items, *cq.inadmissible, *([cq.inflight] if cq.inflight else [])]
            return sum(1 for k in keys if self.assigned.get(k) == lq_key)

    def pending_workloads_info(self, cq_name: str) -> list[WorkloadInfo] | None:
        """PendingWorkloadsInfo: the ClusterQueue's Snapshot, None if it is unknown."""
        with self.cond:
            cq = self.cluster_queues.get(cq_name)
            return cq.snapshot() if cq is not None else None

    def pending_workloads(self) -> list[WorkloadInfo]:
        with self.cond:
            return [wl for cq in self.cluster_queues.values() for wl in cq.all_pending()]
