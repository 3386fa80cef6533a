"""The scheduler's loop and its writes: one cycle per ``Heads``, the decisions of
gpulab.kueue.scheduler written back.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/scheduler/scheduler.go: ``schedule`` (heads,
snapshot, decisions), ``admit`` (``assumeWorkload`` in the cache first, then the
Workload's status: QuotaReserved, and Admitted when the ClusterQueue requires no
admission check; on failure the cache forgets it and it is requeued),
``issuePreemptions`` (preemption.go ``IssuePreemptions``: Evicted + Preempted on each
victim), ``waitForPodsReadyIfNeeded`` (``blockAdmission``), ``requeueAndUpdate``
(QuotaReserved=False with the reason and message, ``status.resourceRequests``), and the
admission metrics. Admissions are written on the scheduler's thread (upstream hands them
to a goroutine).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.api import FlavorResource, format_value
from gpulab.kueue.cache import CQNode
from gpulab.kueue.controllers.client import WORKLOADS, is_conflict, is_not_found
from gpulab.kueue.model import WorkloadInfo, condition, timestamp
from gpulab.kueue.queue import Head, RequeueReason
from gpulab.kueue.scheduler import Entry, Status, pending_reason, schedule
from gpulab.trace import ObjectRef
from gpulab.wait import WaitTimeout, retry_call, wait_for

if TYPE_CHECKING:
    from gpulab.kueue.controllers.manager import Manager

_log = logging.getLogger("gpulab.kueue.scheduler")
BACKOFF_INITIAL = 0.001
BACKOFF_MAX = 0.01
Obj = dict[str, Any]


def cq_path(cq: CQNode | None, name: str = "") -> str:
    """buildCQPath: /root-cohort/.../cluster-queue."""
    if cq is None:
        return f"/{name}" if name else ""
    parts = [cq.name, *(a.name for a in cq.path_to_root())]
    return "/" + "/".join(reversed(parts))


def quota_books(cq: CQNode | None, usage: Mapping[FlavorResource, int]) -> str:
    """What the quota cache holds for ``cq`` once a Workload's ``usage`` is added
    (pkg/cache's ClusterQueue: nominal quota, borrowing limit, usage): the numbers the
    next decision is taken from, without asking the API server."""
    if cq is None:
        return "ClusterQueue gone from the cache"
    parts = []
    for fr, value in usage.items():
        quota = cq.quota(fr)
        limit = "none" if quota.borrowing_limit is None else quota.borrowing_limit
        used = cq.usage.get(fr, 0)
        borrowed = f", borrowing {used - quota.nominal}" if used > quota.nominal else ""
        parts.append(
            f"{fr.resource} ({fr.flavor}) +{format_value(fr.resource, value)}: used "
            f"{format_value(fr.resource, used)} of nominal "
            f"{format_value(fr.resource, quota.nominal)}{borrowed}, borrowingLimit {limit}"
        )
    return f"cache: ClusterQueue {cq.name} " + "; ".join(parts)


def queued_wait_seconds(wl: Mapping[str, Any], now: float) -> float:
    """QueuedWaitTime: since creation, or since the last Requeued transition."""
    requeued = condition(wl, api.REQUEUED)
    since = timestamp((requeued or {}).get("lastTransitionTime")) or timestamp(
        (wl.get("metadata") or {}).get("creationTimestamp")
    )
    return max(0.0, now - (since or now))


def resource_requests(info: WorkloadInfo) -> list[dict[str, Any]]:
    return [
        {
            "name": ps.name,
            "resources": {r: format_value(r, v) for r, v in sorted(ps.requests.items())},
        }
        for ps in info.total_requests
    ]


def required_checks(checks: Mapping[str, tuple[str, ...]], flavors: set[str]) -> list[str]:
    """The AdmissionChecks a ClusterQueue requires for the flavors assigned (onFlavors
    empty: for every flavor)."""
    return sorted(n for n, on in checks.items() if not on or set(on) & flavors)


class SchedulerRunner:
    def __init__(self, manager: Manager) -> None:
        self.m = manager
        self.cycle = 0

    def run(self) -> None:
        """wait.UntilWithBackoff: a cycle that admitted nothing slows the next one down
        (1 ms doubling to 10 ms), one that admitted resets it."""
        m = self.m
        backoff = 0.0
        while not m.stop.is_set():
            try:
                heads = m.queues.wait_for_heads(m.stop, 1.0)
                if not heads:
                    continue
                admitted = any(e.admission is not None for e in self.schedule(heads))
            except Exception:  # one bad cycle must not stop admission
                _log.exception("scheduling cycle %d failed", self.cycle)
                admitted = False
            backoff = 0.0 if admitted else min(max(backoff * 2, BACKOFF_INITIAL), BACKOFF_MAX)
            if backoff:
                m.stop.wait(backoff)

    # -- one cycle -------------------------------------------------------------------------

    def schedule(self, heads: list[Head]) -> list[Entry]:
        m = self.m
        self.cycle += 1
        start = time.perf_counter()
        with m.lock:
            snapshot = m.cache.snapshot()
        entries = schedule(
            heads,
            snapshot,
            m.preemptor,
            m.namespace_labels,
            m.cache.is_added,
            fair_sharing=m.config.fair_sharing is not None,
            cycle=self.cycle,
            limit_ranges=m.limit_ranges,
        )
        admitted: set[str] = set()
        for e in entries:
            if e.admission is not None and self.admit(e):
                admitted.add(e.info.key)
            elif e.preempt:
                self.issue_preemptions(e)
        for e in entries:
            if e.info.key not in admitted:
                self.requeue_and_update(e)
        result = "success" if admitted else "inadmissible"
        m.metrics.admission_attempts.labels(result, "standalone").inc()
        m.metrics.admission_attempt_duration.labels(result, "standalone").observe(
            time.perf_counter() - start
        )
        return entries

    def update_status(
        self, key: str, mutate: Callable[[MutableMapping[str, Any]], bool]
    ) -> Obj | None:
        """Apply ``mutate`` to the Workload and PUT its status; on a conflict read it again
        and retry (WithRetryOnConflict). None when it is gone or nothing changed."""
        m = self.m
        ns, name = key.split("/", 1)
        state = {"obj": m.store(WORKLOADS).get(key)}

        def attempt() -> Obj | None:
            current = state["obj"]
            if current is None:
                return None
            # mutations only touch the status: the spec (pod templates) is shared
            new = {**current, "status": copy.deepcopy(current.get("status") or {})}
            if not mutate(new):
                return None
            try:
                return m.kube.replace_status(WORKLOADS, new)
            except ApiException as exc:
                if is_conflict(exc):
                    state["obj"] = m.kube.get(WORKLOADS, ns, name)
                raise

        try:
            return retry_call(
                attempt,
                lambda e: isinstance(e, ApiException) and is_conflict(e),
                attempts=5,
                stop=m.stop,
            )
        except ApiException as exc:
            if is_not_found(exc):
                return None
            raise

    # -- admit (assumeWorkload, then the API) -----------------------------------------------

    def admit(self, e: Entry) -> bool:
        m = self.m
        assert e.admission is not None and e.cq is not None
        key = e.info.key
        wfpr = m.config.wait_for_pods_ready
        if wfpr and wfpr.block_admission and not m.cache.pods_ready_for_all_admitted():
            self._wait_for_pods_ready(key)
        checks = required_checks(
            e.cq.spec.admission_checks, wlutil.flavors_of({"status": {"admission": e.admission}})
        )
        now = wlutil.now_rfc3339()

        def reserve(wl: MutableMapping[str, Any]) -> bool:
            if wlutil.has_quota_reservation(wl) or not wlutil.is_admissible(wl):
                return False
            wlutil.set_quota_reservation(wl, e.admission or {}, now, not checks, m.granular)
            return True

        base = m.store(WORKLOADS).get(key) or e.info.obj
        assumed = copy.deepcopy(base)
        reserve(assumed)
        info = m.wl_info(assumed)
        with m.lock:
            if not m.cache.add_or_update_workload(info):
                return False
            books = quota_books(m.cache.cq_node(e.admission["clusterQueue"]), info.usage())
        m.tracer.step("assumeWorkload", ObjectRef.of(assumed), books)
        try:
            written = self.update_status(key, reserve)
        except ApiException as exc:
            written = None
            e.message = f"Failed to admit workload: {exc.status} {exc.reason}"
        if written is None:
            with m.lock:
                m.cache.delete_workload(key)
            return False
        cq = e.admission["clusterQueue"]
        wait = queued_wait_seconds(written, m.clock())
        pc = e.info.priority_class
        m.metrics.quota_reserved.labels(cq, pc, "standalone").inc()
        m.metrics.quota_reserved_wait.labels(cq, pc, "standalone").observe(wait)
        flavors = {psa["name"]: psa["flavors"] for psa in e.admission["podSetAssignments"]}
        message = f"Quota reserved in ClusterQueue {cq}, wait time since queued was {wait:.0f}s"
        m.tracer.step("admit", ObjectRef.of(written), message, flavors=flavors)
        if wlutil.is_admitted(written):
            m.metrics.admitted.labels(cq, pc, "standalone").inc()
            m.metrics.admission_wait.labels(cq, pc, "standalone").observe(wait)
        return True

    def _wait_for_pods_ready(self, key: str) -> None:
        """waitForPodsReadyIfNeeded: say so on the Workload, then block the scheduler until
        every admitted Workload has PodsReady (or the manager stops)."""
        m = self.m
        reason = api.REASON_WAITING_FOR_PODS_READY if m.granular else api.WAITING
        message = "waiting for all admitted workloads to be in PodsReady condition"
        now = wlutil.now_rfc3339()
        try:
            self.update_status(
                key, lambda wl: wlutil.unset_quota_reservation(wl, reason, message, now, m.granular)
            )
        except ApiException as exc:
            _log.info("workload %s status not written: %s", key, exc.status)
        ns, _, name = key.partition("/")
        m.tracer.step(
            "waitForPodsReadyIfNeeded",
            ObjectRef("Workload", name, ns, api_version=api.API_VERSION),
            "blockAdmission: " + message,
        )
        with contextlib.suppress(WaitTimeout):  # raised only when the manager stops
            wait_for(
                m.cache.pods_ready_for_all_admitted,
                math.inf,
                "every admitted Workload to have PodsReady",
                stop=m.stop,
            )

    # -- issuePreemptions -----------------------------------------------------------------------

    def issue_preemptions(self, e: Entry) -> None:
        m = self.m
        preemptor = m.store(WORKLOADS).get(e.info.key) or e.info.obj
        issued = 0
        for t in e.targets:
            victim = t.workload
            with m.lock:
                victim_cq = m.cache.cq_node(victim.cluster_queue or "")
            message = wlutil.preemption_message(
                preemptor, t.reason, cq_path(e.cq), cq_path(victim_cq, victim.cluster_queue or "")
            )
            now = wlutil.now_rfc3339()

            def evict(
                wl: MutableMapping[str, Any],
                reason: str = t.reason,
                msg: str = message,
                now: str = now,
            ) -> bool:
                if wlutil.is_evicted(wl) or not wlutil.has_quota_reservation(wl):
                    return False
                wlutil.set_evicted(wl, api.EVICTED_BY_PREEMPTION, msg, now)
                wlutil.set_condition(wl, api.PREEMPTED, "True", reason, msg, now)
                return True

            try:
                written = self.update_status(victim.key, evict)
            except ApiException as exc:
                _log.info("preempting %s: %s %s", victim.key, exc.status, exc.reason)
                continue
            issued += 1
            if written is None:
                continue  # already being evicted
            m.tracer.step("IssuePreemptions", ObjectRef.of(written), message, warning=True)
            m.metrics.preempted.labels(e.info.cluster_queue or "", t.reason, "standalone").inc()
            m.metrics.evicted.labels(
                victim.cluster_queue or "",
                api.EVICTED_BY_PREEMPTION,
                "",
                victim.priority_class,
                "standalone",
            ).inc()
        e.info.last_assignment = None
        if issued:
            e.message += f". Pending the preemption of {issued} workload(s)"
            e.requeue_reason = RequeueReason.PENDING_PREEMPTION
        else:
            e.requeue_reason = RequeueReason.PREEMPTION_FAILED

    # -- requeueAndUpdate -------------------------------------------------------------------------

    def requeue_and_update(self, e: Entry) -> None:
        m = self.m
        if e.status is not Status.NOT_NOMINATED and e.requeue_reason is RequeueReason.GENERIC:
            e.requeue_reason = RequeueReason.FAILED_AFTER_NOMINATION
        key = e.info.key
        current = m.store(WORKLOADS).get(key)
        if current is None or not wlutil.is_admissible(current):
            return
        info = m.wl_info(current, e.info.cluster_queue)
        info.last_assignment = e.info.last_assignment
        with m.lock:
            m.queues.requeue_workload(info, e.requeue_reason)
        if e.status is Status.NOMINATED:
            return
        reason = pending_reason(e, m.granular)
        now = wlutil.now_rfc3339()
        requests = resource_requests(info)

        def pending(wl: MutableMapping[str, Any]) -> bool:
            changed = wlutil.unset_quota_reservation(wl, reason, e.message, now, m.granular)
            if (wl.get("status") or {}).get("resourceRequests") != requests:
                wl["status"]["resourceRequests"] = requests
                changed = True
            return changed

        try:
            written = self.update_status(key, pending)
        except ApiException as exc:
            _log.info("workload %s status not written: %s %s", key, exc.status, exc.reason)
            return
        if written is not None and _reason_changed(current, written):
            m.tracer.step(
                "requeueAndUpdate", ObjectRef.of(written), f"{reason}: {e.message}", warning=True
            )


def _reason_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    a, b = condition(old, api.QUOTA_RESERVED) or {}, condition(new, api.QUOTA_RESERVED) or {}
    return (a.get("reason"), a.get("message")) != (b.get("reason"), b.get("message"))
