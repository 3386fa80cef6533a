"""The Kueue manager loop: informers feed one queue; one thread reconciles and schedules.

Upstream runs controller-runtime reconcilers plus a scheduler goroutine that works on
an in-memory snapshot and takes quota in the cache before it writes the Workload
(pkg/scheduler/scheduler.go admit / assumeWorkload). Here everything runs on one
thread in this order, every pass:

1. apply watch events to the store and the quota cache;
2. reconcile the Workloads touched (cache usage, queue problems);
3. reconcile the Jobs touched (create Workloads, finish, stop evicted Jobs);
4. schedule the pending Workloads: admission is written to Workload status (PUT with
   resourceVersion) before any Job is unsuspended, so a restart can neither admit twice
   nor lose an admission: on start the cache is rebuilt from admitted Workloads before
   the first scheduling pass;
5. write ClusterQueue and LocalQueue status where it changed.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from typing import Any

from kubernetes.client.rest import ApiException

from gpulab.kueue import api, model
from gpulab.kueue import workload as wlutil
from gpulab.kueue.cache import Cache
from gpulab.kueue.controllers import queue_status
from gpulab.kueue.controllers.client import (
    ALL,
    CLUSTER_QUEUES,
    JOBS,
    LOCAL_QUEUES,
    RESOURCE_FLAVORS,
    WORKLOADS,
    KubeClient,
    Resource,
    key_of,
)
from gpulab.kueue.controllers.informer import SYNC, Event, Informer
from gpulab.kueue.controllers.job_controller import JobReconciler
from gpulab.kueue.controllers.store import Store
from gpulab.kueue.controllers.workload_controller import WorkloadReconciler, queue_problem
from gpulab.kueue.scheduler import Decision, Outcome, schedule
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger("gpulab.kueue.manager")

Obj = dict[str, Any]


class Manager:
    def __init__(self, kube: KubeClient, tracer: Tracer, resync_seconds: float = 5.0) -> None:
        self._kube = kube
        self._tracer = tracer
        self._resync = resync_seconds
        self.store = Store()
        self.cache = Cache()
        self.events: queue.Queue[Event] = queue.Queue()
        self.stop = threading.Event()
        self._jobs = JobReconciler(kube, self.store, self.cache.flavors, tracer)
        self._workloads = WorkloadReconciler(kube, self.store, self.cache, tracer)
        self._found: set[str] = set()  # Workloads whose ClusterQueue was traced

    # -- running -------------------------------------------------------------------

    def run(self) -> None:
        for res in ALL:
            Informer(self._kube, res, self.events, self.stop).start()
        self._initial_sync()
        last_resync = time.monotonic()
        while not self.stop.is_set():
            dirty = self._collect(timeout=self._resync)
            if time.monotonic() - last_resync >= self._resync:
                dirty.update(self._everything())
                last_resync = time.monotonic()
            if not dirty:
                continue
            try:
                self.process(dirty)
            except Exception:  # the API server may be restarting; the resync retries
                _log.exception("reconcile pass failed; retrying at the next resync")

    def _initial_sync(self) -> None:
        """Wait for every informer's first listing, then rebuild the cache from it."""
        synced: set[str] = set()
        while len(synced) < len(ALL) and not self.stop.is_set():
            ev = self.events.get()
            self._apply(ev)
            if ev.type == SYNC:
                synced.add(ev.resource.plural)
        _log.info("synced %s; rebuilding the quota cache", ", ".join(sorted(synced)))
        self.process(self._everything())

    def _everything(self) -> set[tuple[str, str]]:
        return {(plural, key) for plural, objs in self.store.objects.items() for key in objs}

    def _collect(self, timeout: float) -> set[tuple[str, str]]:
        dirty: set[tuple[str, str]] = set()
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            return dirty
        dirty |= self._apply(ev)
        while True:
            try:
                dirty |= self._apply(self.events.get_nowait())
            except queue.Empty:
                return dirty

    def _apply(self, ev: Event) -> set[tuple[str, str]]:
        res = ev.resource
        if ev.type == SYNC:
            keys = self.store.replace_all(res, list(ev.items))
            if res == RESOURCE_FLAVORS:
                self.cache.flavors.clear()
            if res == CLUSTER_QUEUES:
                self.cache.cluster_queues.clear()
            for obj in ev.items:
                self._cache_object(res, obj, deleted=False)
            return {(res.plural, k) for k in keys}
        deleted = ev.type == "DELETED"
        if deleted:
            self.store.delete(res, ev.obj)
        else:
            self.store.put(res, ev.obj)
        self._cache_object(res, ev.obj, deleted)
        return {(res.plural, key_of(ev.obj))}

    def _cache_object(self, res: Resource, obj: Obj, deleted: bool) -> None:
        name = obj["metadata"]["name"]
        if res == RESOURCE_FLAVORS:
            if deleted:
                self.cache.delete_flavor(name)
            else:
                self.cache.add_or_update_flavor(model.flavor_from_obj(obj))
        elif res == CLUSTER_QUEUES:
            if deleted:
                self.cache.delete_cluster_queue(name)
            else:
                self.cache.add_or_update_cluster_queue(model.cluster_queue_from_obj(obj))

    # -- one pass ----------------------------------------------------------------------

    def process(self, dirty: set[tuple[str, str]]) -> None:
        workloads = {k for p, k in dirty if p == WORKLOADS.plural}
        jobs = {k for p, k in dirty if p == JOBS.plural}
        if any(p == LOCAL_QUEUES.plural for p, _ in dirty):
            workloads |= set(self.store.workloads)  # a queue appeared or went away
        for key in sorted(workloads):
            self._workloads.reconcile(key)
            wl = self.store.workloads.get(key)
            job = self.store.job_for_workload(wl) if wl else None
            if job is not None:
                jobs.add(key_of(job))
        for key in sorted(jobs):
            self._jobs.reconcile(key)
        for job_key in self._schedule():
            self._jobs.reconcile(job_key)
        self._queue_statuses()

    def pending(self) -> list[model.WorkloadInfo]:
        """Workloads waiting for quota whose LocalQueue and ClusterQueue exist."""
        out = []
        self._found &= set(self.store.workloads)
        for key, wl in self.store.workloads.items():
            if not _is_pending(wl) or queue_problem(self.store, wl) is not None:
                continue
            cq = self.store.cluster_queue_of(wl)
            if key not in self._found:
                self._found.add(key)
                self._tracer.step(
                    "FindClusterQueue",
                    ObjectRef.of(wl),
                    f"LocalQueue {wl['spec'].get('queueName')} -> ClusterQueue {cq}",
                )
            out.append(model.workload_from_obj(wl, cluster_queue=cq))
        return out

    def _schedule(self) -> list[str]:
        """Run the scheduler; returns the Jobs whose Workload changed."""
        pending = self.pending()
        if not pending:
            return []
        decisions = schedule(pending, self.cache, self._kube.namespace_labels())
        touched: list[str] = []
        for d in decisions:
            wl = self.store.workloads.get(d.workload.key)
            if wl is None:
                self.cache.remove_workload(d.workload.key)
                continue
            if self._apply_decision(d, wl):
                job = self.store.job_for_workload(self.store.workloads[d.workload.key])
                if job is not None:
                    touched.append(key_of(job))
        return touched

    def _apply_decision(self, d: Decision, wl: Obj) -> bool:
        now = wlutil.now_rfc3339()
        new = copy.deepcopy(wl)
        if d.outcome is Outcome.ADMIT:
            assert d.admission is not None
            wlutil.set_quota_reservation(new, d.admission, now)
            if not self._write_status(new):
                # Not recorded: give the quota back; the next pass decides again.
                self.cache.remove_workload(d.workload.key)
                return False
            flavors = {psa["name"]: psa["flavors"] for psa in d.admission["podSetAssignments"]}
            self._tracer.step(
                "Admit",
                ObjectRef.of(wl),
                f"Quota reserved in ClusterQueue {d.admission['clusterQueue']}",
                flavors=flavors,
            )
            return True
        if d.outcome is Outcome.PREEMPT:
            for target in d.targets:
                self._evict(target.workload.key, wl, target.reason, d.workload.cluster_queue, now)
        if wlutil.unset_quota_reservation(new, d.reason, d.message, now) and self._write_status(
            new
        ):
            self._tracer.step("Admit", ObjectRef.of(wl), f"{d.reason}: {d.message}", warning=True)
        return False

    def _evict(self, key: str, preemptor: Obj, reason: str, cq: str | None, now: str) -> None:
        victim = self.store.workloads.get(key)
        if victim is None or wlutil.is_evicted(victim):
            return
        victim_cq = ((victim.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
        message = wlutil.preemption_message(preemptor, reason, cq or "", victim_cq)
        new = copy.deepcopy(victim)
        wlutil.set_evicted(new, api.EVICTED_BY_PREEMPTION, message, now)
        wlutil.set_condition(new, api.PREEMPTED, "True", reason, message, now)
        if self._write_status(new):
            self._tracer.step("Evict", ObjectRef.of(victim), message, warning=True)

    def _write_status(self, wl: Obj) -> bool:
        try:
            self.store.put(WORKLOADS, self._kube.replace_status(WORKLOADS, wl))
        except ApiException as exc:
            _log.info("workload %s status not written: %s %s", key_of(wl), exc.status, exc.reason)
            return False
        return True

    def _queue_statuses(self) -> None:
        now = wlutil.now_rfc3339()
        pending_by_lq: dict[str, int] = {}
        for wl in self.store.workloads.values():
            if _is_pending(wl):
                lq = f"{wl['metadata']['namespace']}/{wl['spec'].get('queueName')}"
                pending_by_lq[lq] = pending_by_lq.get(lq, 0) + 1
        pending_by_cq: dict[str, int] = {}
        for lq_key, lq in self.store.local_queues.items():
            cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
            pending_by_cq[cq_name] = pending_by_cq.get(cq_name, 0) + pending_by_lq.get(lq_key, 0)
        for cq in list(self.store.cluster_queues.values()):
            name = cq["metadata"]["name"]
            new = queue_status.cluster_queue_status(cq, self.cache, pending_by_cq.get(name, 0), now)
            if queue_status.status_changed(cq, new):
                self._write_queue(CLUSTER_QUEUES, cq, new)
        for lq_key, lq in list(self.store.local_queues.items()):
            cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
            ns, name = lq_key.split("/", 1)
            mine = [
                w
                for w in self.cache.workloads.values()
                if w.namespace == ns and w.queue_name == name
            ]
            new = queue_status.local_queue_status(
                lq, mine, pending_by_lq.get(lq_key, 0), cq_name in self.store.cluster_queues, now
            )
            if queue_status.status_changed(lq, new):
                self._write_queue(LOCAL_QUEUES, lq, new)

    def _write_queue(self, res: Resource, old: Obj, new: Obj) -> None:
        try:
            self.store.put(res, self._kube.replace_status(res, new))
        except ApiException as exc:
            _log.info("%s %s status not written: %s", res.kind, key_of(old), exc.status)
            return
        before = wlutil.condition_status(old, api.CQ_ACTIVE)
        after = wlutil.condition_status(new, api.CQ_ACTIVE)
        if before != after:
            cond = next(c for c in new["status"]["conditions"] if c["type"] == api.CQ_ACTIVE)
            self._tracer.step(
                "Reconcile",
                ObjectRef.of(new),
                f"{res.kind} {'active' if after == 'True' else 'inactive'}: {cond['message']}",
                warning=after != "True",
                reason=cond["reason"],
            )


def _is_pending(wl: Obj) -> bool:
    return (
        not wlutil.is_finished(wl)
        and not wlutil.has_quota_reservation(wl)
        and (wl.get("spec") or {}).get("active", True) is not False
    )
