"""The controller manager: informers feed the cache, the queues and the work queues; the
reconcilers and the scheduler run on their own threads.

Mirrors kubernetes-sigs/kueue v0.19.2 cmd/kueue/main.go and the event handlers of
pkg/controller/core (workload_controller.go ``Create``/``Update``/``Delete``: a pending
Workload goes to the queues, one holding quota to the cache, transitions between the
two move it; clusterqueue_controller.go, cohort_controller.go,
resourceflavor_controller.go, admissioncheck_controller.go, localqueue_controller.go:
keep the cache and the queue manager in step and call ``NotifyRetryInadmissible``).
Handlers only update in-memory state and add keys; API calls happen in the workers
(gpulab.workqueue.run_worker), as client-go's informer contract asks.

Keys: ``Workload`` queue ``ns/name``; job queue a ``jobs.Ref`` (``batch/Job:ns/name``,
``Pod:ns/name``, ``PodGroup:ns/group``); status queue ``ClusterQueue:name``,
``LocalQueue:ns/name``; requeue queue ``ClusterQueue:name`` or ``Cohort:root``
(batched ``UPDATES_BATCH_PERIOD`` as upstream's requeuer); check queue
``AdmissionCheck:name`` or ``Workload:ns/name``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpulab.informer import (
    JOBS,
    NODES,
    PODS,
    Handlers,
    Informer,
    ListWatch,
    Resource,
    Store,
    key_of,
)
from gpulab.kueue import api, dra, model
from gpulab.kueue import jobs as jobsutil
from gpulab.kueue import workload as wlutil
from gpulab.kueue.cache import AdmissionCheckInfo, Cache
from gpulab.kueue.config import Configuration
from gpulab.kueue.controllers import client as kc
from gpulab.kueue.controllers.client import KubeClient
from gpulab.kueue.metrics import Metrics, UnadmittedWorkloads
from gpulab.kueue.model import condition_true
from gpulab.kueue.preemption import Preemptor
from gpulab.kueue.queue import Manager as QueueManager
from gpulab.kueue.resources import adjust_resources
from gpulab.trace import ObjectRef, Tracer
from gpulab.wait import WaitTimeout, wait_for
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger("gpulab.kueue.manager")

Obj = dict[str, Any]
UPDATES_BATCH_PERIOD = 1.0  # requeueBatchPeriod, UpdatesBatchPeriod
GPUS_HEALTHY_CONTROLLER = "gpulab.io/gpus-healthy"

WATCHED: tuple[tuple[Resource, str | None], ...] = (
    (kc.RESOURCE_FLAVORS, None),
    (kc.COHORTS, None),
    (kc.CLUSTER_QUEUES, None),
    (kc.ADMISSION_CHECKS, None),
    (kc.LOCAL_QUEUES, None),
    (kc.WORKLOAD_PRIORITY_CLASSES, None),
    (kc.PRIORITY_CLASSES, None),
    (kc.NAMESPACES, None),
    (kc.WORKLOADS, None),
    (JOBS, None),
    (PODS, f"{api.MANAGED_LABEL}=true"),
    (kc.STATEFULSETS, None),
    (kc.LIMIT_RANGES, None),
    (NODES, None),
)


class Manager:
    """Shared state of the controllers and the scheduler."""

    def __init__(
        self,
        kube: KubeClient,
        tracer: Tracer,
        config: Configuration | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        batch_period: float = UPDATES_BATCH_PERIOD,
    ) -> None:
        self.kube = kube
        self.tracer = tracer
        self.config = config or Configuration()
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.lock = threading.RLock()
        self.stop = threading.Event()
        wfpr = self.config.wait_for_pods_ready
        self.cache = Cache(pods_ready_tracking=wfpr is not None and wfpr.block_admission)
        self.stores: dict[str, Store] = {res.plural: Store() for res, _sel in WATCHED}
        self.granular = self.config.gate("UnadmittedWorkloadsObservability")
        self.unadmitted = UnadmittedWorkloads(self.metrics.unadmitted) if self.granular else None
        self.preemptor = Preemptor(
            fair_sharing=self.config.fair_sharing is not None,
            strategies=self.config.fair_sharing or (),
            clock=clock,
        )
        self.workload_q = WorkQueue()
        self.job_q = WorkQueue()
        self.status_q = WorkQueue()
        self.requeue_q = WorkQueue()
        self.check_q = WorkQueue()
        self._batch = batch_period
        # (work queue, key) pairs waiting in the queue's delay: the status and requeue
        # queues share key names ("ClusterQueue:x"), so the queue is part of the entry
        self._batched: set[tuple[int, str]] = set()
        # ClusterQueues that may admit, recomputed under the lock whenever what decides it
        # changes; the queue manager reads it without taking the lock (Heads)
        self.active: frozenset[str] = frozenset()
        self.queues = QueueManager(
            requeuer=self._request_requeue,
            namespace_labels=self.namespace_labels,
            is_active=lambda name: name in self.active,
            clock=clock,
        )
        # imported here: the reconcilers take the manager
        from gpulab.kueue.controllers.admissioncheck import GpusHealthyController
        from gpulab.kueue.controllers.jobframework import JobReconciler
        from gpulab.kueue.controllers.queue_status import StatusReconciler
        from gpulab.kueue.controllers.scheduler import SchedulerRunner
        from gpulab.kueue.controllers.workload_controller import WorkloadReconciler

        self.workloads = WorkloadReconciler(self)
        self.jobs = JobReconciler(self)
        self.statuses = StatusReconciler(self)
        self.checks = GpusHealthyController(self)
        self.scheduler = SchedulerRunner(self)
        self._informers: list[Informer] = []

    # -- lookups ------------------------------------------------------------------------------

    def store(self, res: Resource) -> Store:
        return self.stores[res.plural]

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        ns = self.store(kc.NAMESPACES).get(namespace)
        if ns is None:
            return None
        return (ns.get("metadata") or {}).get("labels") or {}

    def limit_ranges(self, namespace: str) -> list[Obj]:
        """The namespace's LimitRanges, by name (the order Summarize takes them in)."""
        return sorted(
            (
                lr
                for lr in self.store(kc.LIMIT_RANGES).list()
                if lr["metadata"]["namespace"] == namespace
            ),
            key=lambda lr: lr["metadata"]["name"],
        )

    def priority_values(self) -> tuple[dict[str, int], dict[str, int]]:
        """(WorkloadPriorityClass values, PriorityClass values) by name."""
        wpcs = {
            key_of(o): int(o.get("value", 0))
            for o in self.store(kc.WORKLOAD_PRIORITY_CLASSES).list()
        }
        pcs = {key_of(o): int(o.get("value", 0)) for o in self.store(kc.PRIORITY_CLASSES).list()}
        return wpcs, pcs

    def wl_info(
        self, obj: Mapping[str, Any], cluster_queue: str | None = None
    ) -> model.WorkloadInfo:
        wfpr = self.config.wait_for_pods_ready
        return model.workload_from_obj(
            adjust_resources(obj, self.limit_ranges(obj["metadata"]["namespace"])),
            cluster_queue,
            self.config.resources,
            eviction_timestamp=wfpr.eviction_timestamp if wfpr else True,
        )

    def job_ref_of(self, wl: Mapping[str, Any]) -> jobsutil.Ref | None:
        meta = wl["metadata"]
        if (meta.get("annotations") or {}).get(api.IS_GROUP_WORKLOAD) == "true":
            return jobsutil.Ref(jobsutil.POD_GROUP, meta["namespace"], meta["name"])
        owner = wlutil.owner(wl)
        if owner is None:
            return None
        if owner.get("kind") == "Job" and str(owner.get("apiVersion", "")).startswith("batch/"):
            return jobsutil.Ref(jobsutil.JOB, meta["namespace"], owner["name"])
        if owner.get("kind") == "Pod":
            return jobsutil.Ref(jobsutil.POD, meta["namespace"], owner["name"])
        return None

    def _trace_queued(self, wl: Mapping[str, Any]) -> None:
        """A Workload without quota (new, or evicted) enters its ClusterQueue: the step the
        seed calls FindClusterQueue (upstream: the controller's event handler, not
        Reconcile, reads the LocalQueue)."""
        queue = _queue(wl)
        cq = self.queues.cluster_queue_for(wl["metadata"]["namespace"], queue)
        where = f"ClusterQueue {cq}'s queue" if cq else "nowhere (parked until it exists)"
        self.tracer.step(
            "AddOrUpdateWorkload",
            ObjectRef.of(wl),
            f"no quota reserved: LocalQueue {queue} → {where}",
        )

    def queue_pending(self, wl: Mapping[str, Any]) -> None:
        """AddOrUpdateWorkload into the ClusterQueue its LocalQueue names (call with the
        lock held)."""
        cq = self.queues.cluster_queue_for(wl["metadata"]["namespace"], _queue(wl))
        self.queues.add_or_update_workload(self.wl_info(wl, cq))

    # -- requeueing inadmissible Workloads -----------------------------------------------------

    def _request_requeue(self, kind: str, name: str) -> None:
        self.batched(self.requeue_q, f"{kind}:{name}")

    def batched(self, q: WorkQueue, key: str) -> None:
        """Add ``key`` after the batch period unless it already waits (client-go's delaying
        queue keeps one entry per key)."""
        entry = (id(q), key)
        with self.lock:
            if entry in self._batched:
                return
            self._batched.add(entry)
        q.add_after(key, self._batch)

    def take(self, q: WorkQueue, key: str) -> None:
        """A worker of ``q`` starts on a batched key: the next change schedules it again."""
        with self.lock:
            self._batched.discard((id(q), key))

    def _requeue(self, key: str) -> None:
        self.take(self.requeue_q, key)
        kind, _, name = key.partition(":")
        with self.lock:
            self.queues.requeue_inadmissible(kind, name)

    def notify_cqs(self, names: set[str]) -> None:
        with self.lock:
            self.queues.notify_retry_inadmissible(names)

    def cqs_using(self, predicate: Callable[[model.ClusterQueue], bool]) -> set[str]:
        return {name for name, cq in self.cache.cluster_queues.items() if predicate(cq)}

    def _refresh_active(self) -> None:
        """Call with the lock held, after a flavor, queue, cohort or check changed."""
        self.active = frozenset(n for n in self.cache.cluster_queues if self.cache.is_active(n))

    def enqueue_status(self, cq_name: str | None = None, later: bool = False) -> None:
        """Status of the ClusterQueue and its LocalQueues; ``later`` batches what
        Workload changes trigger (UpdatesBatchPeriod, 1 s, as upstream)."""
        if not cq_name:
            return
        keys = [f"ClusterQueue:{cq_name}"]
        keys += [
            f"LocalQueue:{lq.key}"
            for lq in list(self.queues.local_queues.values())
            if lq.cluster_queue == cq_name
        ]
        for key in keys:
            if later:
                self.batched(self.status_q, key)
            else:
                self.status_q.add(key)

    # -- event handlers (run on the informer threads) --------------------------------------------

    def handlers(self, res: Resource) -> Handlers:
        on = {
            kc.RESOURCE_FLAVORS.plural: self._on_flavor,
            kc.COHORTS.plural: self._on_cohort,
            kc.CLUSTER_QUEUES.plural: self._on_cluster_queue,
            kc.ADMISSION_CHECKS.plural: self._on_admission_check,
            kc.LOCAL_QUEUES.plural: self._on_local_queue,
            kc.NAMESPACES.plural: self._on_namespace,
            kc.WORKLOADS.plural: self._on_workload,
            JOBS.plural: self._on_job,
            PODS.plural: self._on_pod,
            NODES.plural: self._on_node,
        }.get(res.plural)
        if on is None:
            return Handlers()
        f = on
        return Handlers(
            on_add=lambda obj: f(None, obj, False),
            on_update=lambda old, new: f(old, new, False),
            on_delete=lambda obj: f(obj, obj, True),
        )

    def _on_flavor(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        name = key_of(new)
        with self.lock:
            if deleted:
                self.cache.delete_flavor(name)
            else:
                self.cache.add_or_update_flavor(model.flavor_from_obj(new))
            self._refresh_active()
            users = self.cqs_using(lambda cq: name in cq.flavor_names())
            if not deleted:
                self.queues.notify_retry_inadmissible(users)
        for cq in users:
            self.enqueue_status(cq)

    def _on_cohort(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        if _status_only(old, new, deleted):
            return
        name = key_of(new)
        with self.lock:
            if deleted:
                self.cache.delete_cohort(name)
                self.queues.cohort_parents.pop(name, None)
            else:
                cohort = model.cohort_from_obj(new)
                self.cache.add_or_update_cohort(cohort)
                self.queues.cohort_parents[name] = cohort.parent
            self._refresh_active()
            if not deleted:
                self.queues.requeuer("Cohort", self.queues.root_cohort(name))
            members = self.cqs_using(lambda cq: cq.cohort is not None)
        for cq in members:
            self.enqueue_status(cq)

    def _on_cluster_queue(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        if _status_only(old, new, deleted):
            return  # its own status write
        name = key_of(new)
        with self.lock:
            if deleted:
                self.cache.delete_cluster_queue(name)
                self.queues.delete_cluster_queue(name)
            else:
                spec = model.cluster_queue_from_obj(new)
                changed = old is None or (old.get("spec") != new.get("spec"))
                self.cache.add_or_update_cluster_queue(spec)
                self.queues.add_or_update_cluster_queue(
                    name, spec.queueing_strategy, spec.namespace_selector, spec.cohort, changed
                )
                if spec.stop_policy == api.HOLD_AND_DRAIN:
                    for wl in self.cache.workloads_in(name):
                        self.workload_q.add(wl.key)
            self._refresh_active()
            self.queues.wake()
        self.enqueue_status(name)

    def _on_admission_check(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        name = key_of(new)
        with self.lock:
            if deleted:
                self.cache.delete_admission_check(name)
            else:
                info = AdmissionCheckInfo(
                    controller=(new.get("spec") or {}).get("controllerName", ""),
                    active=condition_true(new, api.CQ_ACTIVE),
                )
                self.cache.add_or_update_admission_check(name, info)
            self._refresh_active()
            users = self.cqs_using(lambda cq: name in cq.admission_checks)
            self.queues.notify_retry_inadmissible(users)
        for cq in users:
            self.enqueue_status(cq)
        if not deleted:
            self.check_q.add(f"AdmissionCheck:{name}")

    def _on_local_queue(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        if _status_only(old, new, deleted):
            return  # its own status write
        key = key_of(new)
        with self.lock:
            if deleted:
                self.queues.delete_local_queue(key)
            else:
                self.queues.add_or_update_local_queue(model.local_queue_from_obj(new))
            waiting = [k for k, lq in self.queues.assigned.items() if lq == key]
            admitted = [
                w.key
                for w in self.cache.workloads.values()
                if f"{w.namespace}/{w.queue_name}" == key
            ]
        for wl_key in waiting + admitted:
            self.workload_q.add(wl_key)
        self.status_q.add(f"LocalQueue:{key}")

    def _on_namespace(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        if old is not None and not deleted:
            old_labels = (old.get("metadata") or {}).get("labels")
            if old_labels == (new.get("metadata") or {}).get("labels"):
                return
        self.notify_cqs(set(self.cache.cluster_queues))

    def _on_workload(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        """workload_controller.go Create/Update/Delete: move the Workload between the
        queues and the cache on status transitions."""
        key = key_of(new)
        status = "deleted" if deleted else _status(new)
        prev = _status(old) if old is not None else "absent"
        with self.lock:
            if status in ("deleted", "finished", "inactive"):
                if self.cache.delete_workload(key) is not None:
                    self.queues.queue_associated_inadmissible_after(key)
                self.queues.delete_workload(key)
            elif status == "reserved":
                self.queues.delete_workload(key, forget=False)
                self.cache.add_or_update_workload(self.wl_info(new))
            else:  # pending
                if prev == "reserved" and self.cache.delete_workload(key) is not None:
                    self.queues.queue_associated_inadmissible_after(key)
                if dra.has_dra(new):
                    # the Workload reconciler refuses it or queues it (Reconcile's DRA step)
                    self.queues.delete_workload(key)
                else:
                    self.queue_pending(new)
                    if prev in ("absent", "reserved"):
                        self._trace_queued(new)
            old_cq = self.queues.cluster_queue_for(new["metadata"]["namespace"], _queue(old or new))
        if deleted and self.unadmitted is not None:
            self.unadmitted.remove(key)
        if not deleted:
            self.workload_q.add(key)
            self.check_q.add(f"Workload:{key}")
        ref = self.job_ref_of(new)
        if ref is not None:
            self.job_q.add(str(ref))
        admission = (new.get("status") or {}).get("admission") or {}
        cq_name = admission.get("clusterQueue") or self.queues.cluster_queue_for(
            new["metadata"]["namespace"], _queue(new)
        )
        self.enqueue_status(cq_name, later=True)
        if old_cq != cq_name:  # moved to another LocalQueue: the old one has one less
            self.enqueue_status(old_cq, later=True)

    def _on_job(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        meta = new["metadata"]
        self.job_q.add(str(jobsutil.Ref(jobsutil.JOB, meta["namespace"], meta["name"])))

    def _on_pod(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        self.job_q.add(str(jobsutil.ref_for_pod(new)))

    def _on_node(self, old: Obj | None, new: Obj, deleted: bool) -> None:
        self.check_q.add("Nodes")

    # -- running -------------------------------------------------------------------------------

    def start_informers(self, api_client: Any) -> None:
        frameworks = self.config.frameworks
        for res, selector in WATCHED:
            if res == JOBS and "batch/job" not in frameworks:
                continue
            lw = ListWatch(api_client, res, label_selector=selector)
            informer = Informer(lw, self.handlers(res), store=self.store(res))
            self._informers.append(informer.start())

    def run(self, api_client: Any) -> None:
        """Informers first; once every one has listed, the cache holds every Workload
        that has quota, then the workers and the scheduler start."""
        self.start_informers(api_client)
        try:
            wait_for(
                lambda: all(i.has_synced() for i in self._informers),
                math.inf,
                "every informer to list",
                stop=self.stop,
            )
        except WaitTimeout:  # raised only when the manager stops first
            return
        _log.info("informers synced; starting reconcilers and the scheduler")
        workers = [
            (self.workload_q, self.workloads.reconcile, "workload"),
            (self.job_q, self.jobs.reconcile, "job"),
            (self.status_q, self.statuses.reconcile, "queue-status"),
            (self.requeue_q, self._requeue, "requeue"),
            (self.check_q, self.checks.reconcile, "admission-check"),
        ]
        threads = [
            threading.Thread(target=run_worker, args=w, name=w[2], daemon=True) for w in workers
        ]
        threads.append(threading.Thread(target=self.scheduler.run, name="scheduler", daemon=True))
        for t in threads:
            t.start()
        self.stop.wait()
        for q, _fn, _name in workers:
            q.shutdown()
        for informer in self._informers:
            informer.stop()
        self.queues.wake()


def _status_only(old: Obj | None, new: Obj, deleted: bool) -> bool:
    """An update that changed nothing but the status (the controller's own write)."""
    if old is None or deleted:
        return False
    a, b = old.get("metadata") or {}, new.get("metadata") or {}
    return old.get("spec") == new.get("spec") and a.get("deletionTimestamp") == b.get(
        "deletionTimestamp"
    )


def _queue(wl: Mapping[str, Any]) -> str:
    return (wl.get("spec") or {}).get("queueName", "")


def _status(wl: Mapping[str, Any]) -> str:
    if wlutil.is_finished(wl):
        return "finished"
    if wlutil.has_quota_reservation(wl):
        return "reserved"
    if not wlutil.is_active(wl):
        return "inactive"
    return "pending"
