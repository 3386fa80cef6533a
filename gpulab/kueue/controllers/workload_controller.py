"""Workload reconcile: keep the quota cache in step with Workloads, and say why a
Workload cannot be queued.

Mirrors pkg/controller/core/workload_controller.go: an admitted Workload holds quota
in the cache, a finished or evicted-and-released one gives it back, and a Workload
whose LocalQueue or ClusterQueue is missing gets QuotaReserved=False with upstream's
reason (Misconfigured) and message ("LocalQueue <name> is terminating or missing").
"""

from __future__ import annotations

import copy
import logging

from kubernetes.client.rest import ApiException

from gpulab.kueue import api, model
from gpulab.kueue import workload as wlutil
from gpulab.kueue.cache import Cache
from gpulab.kueue.controllers.client import WORKLOADS, KubeClient
from gpulab.kueue.controllers.store import Store
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger("gpulab.kueue.workload")


def queue_problem(store: Store, wl: dict) -> str | None:
    """Why the Workload's queues cannot take it, in upstream's words, or None."""
    ns = wl["metadata"]["namespace"]
    lq_name = (wl.get("spec") or {}).get("queueName", "")
    lq = store.local_queues.get(f"{ns}/{lq_name}")
    if lq is None or lq["metadata"].get("deletionTimestamp"):
        return f"LocalQueue {lq_name} is terminating or missing"
    cq_name = (lq.get("spec") or {}).get("clusterQueue", "")
    cq = store.cluster_queues.get(cq_name)
    if cq is None or cq["metadata"].get("deletionTimestamp"):
        return f"ClusterQueue {cq_name} is terminating or missing"
    return None


class WorkloadReconciler:
    def __init__(self, kube: KubeClient, store: Store, cache: Cache, tracer: Tracer) -> None:
        self._kube = kube
        self._store = store
        self._cache = cache
        self._tracer = tracer

    def reconcile(self, key: str) -> None:
        wl = self._store.workloads.get(key)
        if wl is None:
            self._release(key, None, "Workload deleted")
            return
        if wlutil.is_finished(wl):
            self._release(key, wl, "Workload finished")
            return
        if wlutil.has_quota_reservation(wl):
            info = model.workload_from_obj(wl)
            if self._cache.workloads.get(key) != info:
                self._cache.add_workload(info)
            return
        # Not (or no longer) holding quota: an evicted Workload released it.
        self._release(key, wl, "quota reservation cleared")
        problem = queue_problem(self._store, wl)
        if problem is None:
            return
        new = copy.deepcopy(wl)
        if not wlutil.unset_quota_reservation(
            new, api.REASON_MISCONFIGURED, problem, wlutil.now_rfc3339()
        ):
            return
        try:
            self._store.put(WORKLOADS, self._kube.replace_status(WORKLOADS, new))
        except ApiException as exc:
            _log.debug("workload %s status: %s %s", key, exc.status, exc.reason)
            return
        self._tracer.step("FindClusterQueue", ObjectRef.of(wl), problem, warning=True)

    def _release(self, key: str, wl: dict | None, why: str) -> None:
        released = self._cache.remove_workload(key)
        if released is None or wl is None:
            return
        self._tracer.step(
            "Finish" if why == "Workload finished" else "Reconcile",
            ObjectRef.of(wl),
            f"{why}; quota released in ClusterQueue {released.cluster_queue}",
        )
