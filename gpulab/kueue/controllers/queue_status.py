"""ClusterQueue and LocalQueue status, and the gauges that go with them.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/controller/core/clusterqueue_controller.go
(``updateCqStatusIfChanged``: pendingWorkloads, reservingWorkloads, admittedWorkloads,
flavorsReservation, flavorsUsage, fairSharing.weightedShare, conditions[Active]) and
localqueue_controller.go (``UpdateStatusIfChanged``), plus the gauges
pkg/metrics/metrics.go reports for them (pending, reserving/admitted active,
cluster_queue_status, and with ``enableClusterQueueResources`` the per-flavor
resource usage and quota).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from gpulab.informer import key_of
from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.api import FlavorResource, format_value
from gpulab.kueue.controllers.client import CLUSTER_QUEUES, LOCAL_QUEUES
from gpulab.kueue.model import WorkloadInfo, condition
from gpulab.trace import ObjectRef

if TYPE_CHECKING:
    from gpulab.kueue.controllers.manager import Manager

_log = logging.getLogger("gpulab.kueue.status")
Obj = dict[str, Any]
ROLE = "standalone"


def _strip_times(conds: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conds]


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    a, b = dict(old.get("status") or {}), dict(new.get("status") or {})
    ca, cb = _strip_times(a.pop("conditions", [])), _strip_times(b.pop("conditions", []))
    return a != b or ca != cb


def usage_by_flavor(workloads: Iterable[WorkloadInfo]) -> list[dict[str, Any]]:
    totals: dict[FlavorResource, int] = {}
    for w in workloads:
        for fr, v in w.usage().items():
            totals[fr] = totals.get(fr, 0) + v
    by_flavor: dict[str, list[dict[str, str]]] = {}
    for fr in sorted(totals):
        by_flavor.setdefault(fr.flavor, []).append(
            {"name": fr.resource, "total": format_value(fr.resource, totals[fr])}
        )
    return [{"name": f, "resources": rs} for f, rs in by_flavor.items()]


class StatusReconciler:
    def __init__(self, manager: Manager) -> None:
        self.m = manager

    def reconcile(self, key: str) -> None:
        self.m.take(self.m.status_q, key)
        kind, _, name = key.partition(":")
        if kind == "ClusterQueue":
            self._cluster_queue(name)
        else:
            self._local_queue(name)

    def _write(self, res: Any, old: Obj, new: Obj) -> None:
        if not status_changed(old, new):
            return
        try:
            self.m.kube.replace_status(res, new)
        except ApiException as exc:
            _log.info("%s %s status not written: %s", res.kind, key_of(old), exc.status)
            return
        before = (condition(old, api.CQ_ACTIVE) or {}).get("status")
        after_cond = next(c for c in new["status"]["conditions"] if c["type"] == api.CQ_ACTIVE)
        if before != after_cond["status"]:
            active = after_cond["status"] == "True"
            self.m.tracer.step(
                "Reconcile",
                ObjectRef.of(new),
                f"{res.kind} {'active' if active else 'inactive'}: {after_cond['message']}",
                warning=not active,
                reason=after_cond["reason"],
            )

    def _cluster_queue(self, name: str) -> None:
        m = self.m
        obj = m.store(CLUSTER_QUEUES).get(name)
        if obj is None:
            for status in ("pending", "active", "terminating"):
                with contextlib.suppress(KeyError):
                    m.metrics.cq_status.remove(name, status, ROLE)
            return
        with m.lock:
            spec = m.cache.cluster_queues.get(name)
            if spec is None:
                return
            reserving = m.cache.workloads_in(name)
            active_pending, inadmissible = m.queues.pending(name)
            active, reason, message = m.cache.active_condition(spec)
            flavors_reservation = m.cache.flavors_usage(spec)
            share = m.cache.weighted_share(name)
        admitted = [w for w in reserving if w.admitted]
        used = _totals(admitted)
        new = copy.deepcopy(obj)
        status = new.setdefault("status", {})
        status.update(
            pendingWorkloads=active_pending + inadmissible,
            reservingWorkloads=len(reserving),
            admittedWorkloads=len(admitted),
            flavorsReservation=flavors_reservation,
            flavorsUsage=_usage_of(spec, used),
        )
        if m.config.fair_sharing is not None and share is not None:
            status["fairSharing"] = {"weightedShare": share}
        wlutil.set_condition(
            new, api.CQ_ACTIVE, "True" if active else "False", reason, message, wlutil.now_rfc3339()
        )
        self._write(CLUSTER_QUEUES, obj, new)
        counts = (active_pending, inadmissible, len(reserving), len(admitted))
        self._cq_metrics(name, spec, active, counts, used, _totals(reserving), share)

    def _cq_metrics(
        self,
        name: str,
        spec: Any,
        active: bool,
        counts: tuple[int, int, int, int],
        usage: dict[FlavorResource, int],
        reservation: dict[FlavorResource, int],
        share: int | None,
    ) -> None:
        mx = self.m.metrics
        active_pending, inadmissible, reserving, admitted = counts
        mx.pending.labels(name, "active", ROLE).set(active_pending)
        mx.pending.labels(name, "inadmissible", ROLE).set(inadmissible)
        mx.reserving_active.labels(name, ROLE).set(reserving)
        mx.admitted_active.labels(name, ROLE).set(admitted)
        for status in ("pending", "active", "terminating"):
            mx.cq_status.labels(name, status, ROLE).set(
                1 if status == ("active" if active else "pending") else 0
            )
        cohort = spec.cohort or ""
        if share is not None and self.m.config.fair_sharing is not None:
            mx.weighted_share.labels(name, cohort, ROLE).set(share)
        if not self.m.config.cluster_queue_resource_metrics:
            return
        for fr, quota in spec.quotas.items():
            labels = (cohort, name, fr.flavor, fr.resource, ROLE)
            mx.resource_usage.labels(*labels).set(usage.get(fr, 0))
            mx.resource_reservation.labels(*labels).set(reservation.get(fr, 0))
            mx.nominal_quota.labels(*labels).set(quota.nominal)

    def _local_queue(self, key: str) -> None:
        m = self.m
        obj = m.store(LOCAL_QUEUES).get(key)
        if obj is None:
            return
        ns, name = key.split("/", 1)
        with m.lock:
            lq = m.queues.local_queues.get(key)
            cq_exists = lq is not None and lq.cluster_queue in m.cache.cluster_queues
            candidates = m.cache.workloads_in(lq.cluster_queue) if lq is not None else []
            mine = [w for w in candidates if w.namespace == ns and w.queue_name == name]
            pending = m.queues.pending_in_local_queue(key)
        admitted = [w for w in mine if w.admitted]
        new = copy.deepcopy(obj)
        new.setdefault("status", {}).update(
            pendingWorkloads=pending,
            reservingWorkloads=len(mine),
            admittedWorkloads=len(admitted),
            flavorsReservation=usage_by_flavor(mine),
            flavorsUsage=usage_by_flavor(admitted),
        )
        now = wlutil.now_rfc3339()
        if lq is not None and lq.stop_policy != api.STOP_NONE:
            wlutil.set_condition(
                new, api.CQ_ACTIVE, "False", "Stopped", "LocalQueue is stopped", now
            )
        elif cq_exists:
            wlutil.set_condition(
                new, api.CQ_ACTIVE, "True", "Ready", "Can submit new workloads to localQueue", now
            )
        else:
            wlutil.set_condition(
                new,
                api.CQ_ACTIVE,
                "False",
                "ClusterQueueDoesNotExist",
                "Can't submit new workloads to clusterQueue",
                now,
            )
        self._write(LOCAL_QUEUES, obj, new)


def _totals(workloads: Iterable[WorkloadInfo]) -> dict[FlavorResource, int]:
    totals: dict[FlavorResource, int] = {}
    for w in workloads:
        for fr, v in w.usage().items():
            totals[fr] = totals.get(fr, 0) + v
    return totals


def _usage_of(spec: Any, totals: dict[FlavorResource, int]) -> list[dict[str, Any]]:
    """flavorsUsage in the ClusterQueue's flavor order, with what is borrowed."""
    out = []
    for group in spec.resource_groups:
        for flavor in group.flavors:
            resources = []
            for resource in group.covered_resources:
                fr = FlavorResource(flavor, resource)
                total = totals.get(fr, 0)
                nominal = spec.quotas[fr].nominal if fr in spec.quotas else 0
                resources.append(
                    {
                        "name": resource,
                        "total": format_value(resource, total),
                        "borrowed": format_value(resource, max(0, total - nominal)),
                    }
                )
            out.append({"name": flavor, "resources": resources})
    return out
