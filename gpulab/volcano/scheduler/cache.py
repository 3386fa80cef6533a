"""The scheduler cache: informers in, Bindings, evictions and status write-backs out.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/cache``:
- ``cache.go`` ``newSchedulerCache`` (informers on pods, nodes, PodGroups, Queues,
  PriorityClasses; ``newDefaultAndRootQueue`` creates the ``root`` and ``default`` queues
  at start-up), ``Snapshot``, ``AddBindTask`` / ``BindTask`` / ``Bind`` (the
  ``DefaultBinder`` POSTs a Binding per task; Event ``Scheduled`` "Successfully assigned
  <ns>/<pod> to <node>"; a failed bind sets the pod's PodScheduled condition to
  SchedulerError "failed to bind to node ...") and ``Evict`` (``defaultEvictor``: Event
  ``Evict`` "Pod is evicted, because of <reason>", pod conditions Ready=False/Evict and
  DisruptionTarget=True/PreemptionByScheduler, then DELETE; Event ``Evict`` on the
  PodGroup);
- ``UpdateJobStatus`` (the PodGroup updated whole - it has no status subresource) and
  ``RecordJobStatusEvent`` (Warning ``Unschedulable`` "<pending>/<tasks> tasks in gang
  unschedulable: ..." on a Pending/Inqueue/Unknown PodGroup, else ``Scheduled`` "pod group
  is ready"; each Allocated/Pending/Pipelined pod's PodScheduled condition with
  ``TaskSchedulingReason``, and its ``nominatedNodeName``), ``UpdateQueueStatus``.

Lab differences: lists and watches through gpulab.informer and builds each snapshot from
the informers' stores (snapshot.py) instead of keeping JobInfos incrementally; Events go
through gpulab.trace (events.k8s.io/v1, reportingController gpulab.io/volcano); pod
conditions and ``status.allocated`` of a Queue are merge-PATCHed (upstream: UpdateStatus
of the whole object); no multi-scheduler sharding, PVC/CSI, DRA or NUMA informers.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.framework.binding import BindError, KubeBinder
from gpulab.informer import NODES, PODS, Handlers, Informer, ListWatch, Store
from gpulab.kube import drain
from gpulab.trace import ObjectRef, Tracer
from gpulab.volcano import apis
from gpulab.volcano.scheduler import snapshot
from gpulab.volcano.scheduler.api.job_info import (
    ALL_NODE_UNAVAILABLE_MSG,
    POD_REASON_SCHEDULER_ERROR,
    JobInfo,
    TaskInfo,
    TaskStatus,
)
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.interface import ClusterInfo
from gpulab.wait import retry_call

_log = logging.getLogger(__name__)

Obj = dict[str, Any]
SYNC_WARN_EVERY = 10.0  # seconds between "waiting for cache" lines
# conditions are merged by type, as UpdateStatus of the whole pod would keep the others
STRATEGIC = "application/strategic-merge-patch+json"
PG_UNSCHEDULABLE_PHASES = (apis.PG_UNKNOWN, apis.PG_PENDING, apis.PG_INQUEUE)


def pod_ref(pod: Mapping[str, Any]) -> ObjectRef:
    meta = pod.get("metadata") or {}
    return ObjectRef("Pod", meta.get("name", ""), meta.get("namespace"), meta.get("uid"))


def pod_group_ref(job: JobInfo) -> ObjectRef:
    meta = (job.pod_group or {}).get("metadata") or {}
    return ObjectRef(
        "PodGroup",
        job.name,
        job.namespace,
        meta.get("uid"),
        api_version=f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
    )


def condition_changed(pod: Mapping[str, Any], condition: Mapping[str, str]) -> bool:
    """podConditionHaveUpdate: a different status, reason or message."""
    for existing in (pod.get("status") or {}).get("conditions") or []:
        if existing.get("type") == condition["type"]:
            return any(existing.get(k) != condition[k] for k in ("status", "reason", "message"))
    return True


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SchedulerCache:
    """The scheduler's view of the cluster and its hands on it (cache.Cache)."""

    def __init__(
        self,
        api: client.ApiClient,
        tracer: Tracer,
        scheduler_names: tuple[str, ...] = (apis.DEFAULT_SCHEDULER_NAME,),
        default_queue: str = apis.DEFAULT_QUEUE,
        workers: int = 16,
    ) -> None:
        self.api = api
        self.tracer = tracer
        self.scheduler_names = scheduler_names
        self.default_queue = default_queue
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.binder = KubeBinder(api)
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, "volcano-cache")
        self._lock = threading.Lock()
        self._overlay = snapshot.Overlay()
        self._tasks = snapshot.TaskCache()
        self._status_writes: list[Callable[[], None]] = []
        self.informers = {
            "pods": Informer(
                ListWatch(api, PODS), Handlers(self._pod_changed, self._pod_updated, self._pod_gone)
            ),
            "nodes": Informer(ListWatch(api, NODES)),
            "podgroups": Informer(ListWatch(api, apis.PODGROUPS)),
            "queues": Informer(ListWatch(api, apis.QUEUES)),
            "priorityclasses": Informer(ListWatch(api, apis.PRIORITY_CLASSES)),
        }

    def store(self, name: str) -> Store:
        return self.informers[name].store

    # ---------------------------------------------------------------- start

    def run(self) -> None:
        """Create the root and default queues, start the informers, wait for them."""
        for name, reclaimable in ((apis.ROOT_QUEUE, False), (self.default_queue, True)):
            retry_call(
                lambda n=name, r=reclaimable: self._create_queue(n, r),
                lambda e: not (isinstance(e, ApiException) and e.status in (400, 403, 422)),
                timeout=60,
            )
        for informer in self.informers.values():
            informer.start()
        # WaitForCacheSync blocks until every informer has synced: sessions never open
        # on a partial view (a missing RBAC verb shows as this line and a 403, repeated)
        for name, informer in self.informers.items():
            while not informer.wait_for_sync(SYNC_WARN_EVERY):
                if informer.stopped:
                    return
                _log.warning("waiting for cache %s to sync", name)

    def _create_queue(self, name: str, reclaimable: bool) -> None:
        body = {
            "apiVersion": f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": {"reclaimable": reclaimable, "weight": 1},
        }
        try:
            self.custom.create_cluster_custom_object(
                apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, "queues", body
            )
            _log.info("Successfully created queue %s", name)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- informer events

    def _pod_changed(self, pod: Obj) -> None:
        self._settle(pod)

    def _pod_updated(self, _old: Obj, new: Obj) -> None:
        self._settle(new)

    def _pod_gone(self, pod: Obj) -> None:
        uid = str((pod.get("metadata") or {}).get("uid"))
        with self._lock:
            self._overlay.binding.pop(uid, None)
            self._overlay.releasing.discard(uid)

    def _settle(self, pod: Obj) -> None:
        """A pod the API server shows bound (or deleting) needs no overlay any more."""
        uid = str((pod.get("metadata") or {}).get("uid"))
        with self._lock:
            if (pod.get("spec") or {}).get("nodeName"):
                self._overlay.binding.pop(uid, None)
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                self._overlay.releasing.discard(uid)

    # ---------------------------------------------------------------- Snapshot

    def snapshot(self) -> ClusterInfo:
        classes: dict[str, int] = {}
        default_priority = 0
        for pc in self.store("priorityclasses").list():
            classes[pc["metadata"]["name"]] = int(pc.get("value") or 0)
            if pc.get("globalDefault"):
                default_priority = int(pc.get("value") or 0)
        with self._lock:
            overlay = snapshot.Overlay(dict(self._overlay.binding), set(self._overlay.releasing))
        return snapshot.build(
            self.store("pods").list(),
            self.store("podgroups").list(),
            self.store("nodes").list(),
            self.store("queues").list(),
            priority_classes=classes,
            default_priority=default_priority,
            scheduler_names=self.scheduler_names,
            default_queue=self.default_queue,
            overlay=overlay,
            tasks=self._tasks,
        )

    # ---------------------------------------------------------------- bind

    def add_bind_task(self, task: TaskInfo) -> None:
        with self._lock:
            self._overlay.binding[task.uid] = task.node_name
        self.pool.submit(self._bind, task.pod, task.node_name)

    def _bind(self, pod: Obj, node: str) -> None:
        meta = pod["metadata"]
        try:
            self.binder.bind(pod, node)
        except BindError as err:
            _log.error(
                "Failed to bind pod <%s/%s> to node %s: %s",
                meta["namespace"],
                meta["name"],
                node,
                err,
            )
            with self._lock:
                self._overlay.binding.pop(str(meta.get("uid")), None)
            self._task_unschedulable(
                pod, POD_REASON_SCHEDULER_ERROR, f"failed to bind to node {node}: {err}", ""
            )
            return
        self.tracer.step(
            "Scheduled",
            pod_ref(pod),
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
            node=node,
        )

    # ---------------------------------------------------------------- evict

    def evict(self, task: TaskInfo, reason: str) -> None:
        with self._lock:
            self._overlay.releasing.add(task.uid)
        job = task.job
        self.pool.submit(self._evict, task.pod, reason, job)

    def _evict(self, pod: Obj, reason: str, job_uid: str) -> None:
        meta = pod["metadata"]
        message = f"Pod is evicted, because of {reason}"
        self.tracer.step("Evict", pod_ref(pod), message, warning=True)
        conditions = [
            {"type": "Ready", "status": "False", "reason": "Evict", "message": message},
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": f"{(pod.get('spec') or {}).get('schedulerName')}: preempting to "
                "accommodate a higher priority pod",
            },
        ]
        try:
            for c in conditions:
                c["lastTransitionTime"] = _now()
            self.core.patch_namespaced_pod_status(
                meta["name"],
                meta["namespace"],
                {"status": {"conditions": conditions}},
                _content_type=STRATEGIC,
            )
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"])
        except ApiException as exc:
            if exc.status != 404:
                _log.error(
                    "Failed to evict pod <%s/%s>: %s", meta["namespace"], meta["name"], exc.reason
                )
                with self._lock:
                    self._overlay.releasing.discard(str(meta.get("uid")))
                return
        ns, _, pg = job_uid.partition("/")
        if pg:
            ref = ObjectRef(
                "PodGroup", pg, ns, api_version=f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}"
            )
            self.tracer.step("Evict", ref, reason)

    # ---------------------------------------------------------------- status write-back

    def update_job_status(self, job: JobInfo, update_pg: bool) -> None:
        """Queue the job's write-back; :meth:`flush` runs them (CloseSession waits)."""
        self._status_writes.append(lambda: self._update_job_status(job, update_pg))

    def update_queue_status(self, queue: QueueInfo, allocated: Mapping[str, str]) -> None:
        self._status_writes.append(lambda: self._update_queue_status(queue, dict(allocated)))

    def flush(self) -> None:
        """Run the queued write-backs in parallel and wait (JobUpdater.UpdateAll)."""
        writes, self._status_writes = self._status_writes, []
        for future in [self.pool.submit(w) for w in writes]:
            try:
                future.result()
            except Exception as exc:  # one object's trouble must not stop the others
                _log.warning("status write-back failed: %s", exc)

    def _update_job_status(self, job: JobInfo, update_pg: bool) -> None:
        pg = job.pod_group
        assert pg is not None
        if update_pg:
            try:
                self.custom.replace_namespaced_custom_object(
                    apis.SCHEDULING_GROUP,
                    apis.SCHEDULING_VERSION,
                    job.namespace,
                    "podgroups",
                    job.name,
                    pg,
                )
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
                _log.info("PodGroup %s not updated (%s); next session", job.uid, exc.reason)
        self._record_job_status_event(job, update_pg)

    def _record_job_status_event(self, job: JobInfo, update_pg: bool) -> None:
        """RecordJobStatusEvent."""
        fit_error = job.fit_error()
        if job.phase in PG_UNSCHEDULABLE_PHASES:
            pending = job.count(TaskStatus.PENDING)
            self.tracer.step(
                apis.PG_UNSCHEDULABLE_TYPE,
                pod_group_ref(job),
                f"{pending}/{len(job.tasks)} tasks in gang unschedulable: {fit_error}",
                warning=True,
            )
        elif update_pg:
            self.tracer.step(apis.PG_SCHEDULED, pod_group_ref(job), apis.PG_READY)
        base = fit_error or ALL_NODE_UNAVAILABLE_MSG
        for task in job.tasks_in(TaskStatus.ALLOCATED, TaskStatus.PENDING, TaskStatus.PIPELINED):
            if task.sch_gated:
                continue
            reason, msg, nominated = job.task_scheduling_reason(task.uid)
            self._task_unschedulable(task.pod, reason, msg or base, nominated)

    def _task_unschedulable(self, pod: Obj, reason: str, message: str, nominated: str) -> None:
        """taskUnschedulable: the pod's PodScheduled=False condition (and nominated node)."""
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
        }
        status: Obj = {}
        if condition_changed(pod, condition):
            status["conditions"] = [{**condition, "lastTransitionTime": _now()}]
        if nominated and (pod.get("status") or {}).get("nominatedNodeName") != nominated:
            status["nominatedNodeName"] = nominated
        if not status:
            return
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}, _content_type=STRATEGIC
            )
        except ApiException as exc:
            if exc.status != 404:
                _log.warning("pod %s/%s condition: %s", meta["namespace"], meta["name"], exc.reason)
        except urllib3.exceptions.HTTPError as exc:  # the next session writes it again
            _log.warning("pod %s/%s condition: %s", meta["namespace"], meta["name"], exc)

    def _update_queue_status(self, queue: QueueInfo, allocated: dict[str, str]) -> None:
        # a merge patch sets the keys given; a resource gone to zero must be removed
        old = (queue.queue.get("status") or {}).get("allocated") or {}
        body = {"status": {"allocated": {**dict.fromkeys(old), **allocated}}}
        resp = self.custom.api_client.call_api(
            f"/apis/{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}/queues/{queue.name}/status",
            "PATCH",
            body=body,
            header_params={"Content-Type": "application/merge-patch+json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        drain(resp)  # the connection back to the pool

    def record_pod_group_event(self, job: JobInfo, warning: bool, reason: str, msg: str) -> None:
        self.tracer.step(reason, pod_group_ref(job), msg, warning=warning)
