"""ClusterQueue and LocalQueue status: counts, usage and the Active condition.

Mirrors pkg/controller/core/clusterqueue_controller.go and localqueue_controller.go
(updateCqStatusIfChanged, UpdateStatusIfChanged): pendingWorkloads,
reservingWorkloads, admittedWorkloads, flavorsReservation, flavorsUsage and
conditions[Active]. Without admission checks, reserving and admitted are the same set.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.api import FlavorResource, format_quantity
from gpulab.kueue.cache import Cache
from gpulab.kueue.model import WorkloadInfo, cluster_queue_from_obj

Obj = dict[str, Any]


def _strip_times(conds: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conds]


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    a, b = dict(old.get("status") or {}), dict(new.get("status") or {})
    ca, cb = _strip_times(a.pop("conditions", [])), _strip_times(b.pop("conditions", []))
    return a != b or ca != cb


def cluster_queue_status(obj: Obj, cache: Cache, pending: int, now: str) -> Obj:
    """The ClusterQueue with its status recomputed from the cache."""
    cq = cluster_queue_from_obj(obj)
    new = copy.deepcopy(obj)
    admitted = len(cache.workloads_in(cq.name))
    usage = cache.flavors_usage(cq)
    status = new.setdefault("status", {})
    status.update(
        pendingWorkloads=pending,
        reservingWorkloads=admitted,
        admittedWorkloads=admitted,
        flavorsReservation=usage,
        flavorsUsage=copy.deepcopy(usage),
    )
    active, reason, message = cache.active_condition(cq)
    wlutil.set_condition(new, api.CQ_ACTIVE, "True" if active else "False", reason, message, now)
    return new


def local_queue_status(
    obj: Obj, admitted: Iterable[WorkloadInfo], pending: int, cq_exists: bool, now: str
) -> Obj:
    """The LocalQueue with its status recomputed; ``admitted`` are its Workloads holding
    quota."""
    new = copy.deepcopy(obj)
    workloads = list(admitted)
    totals: dict[FlavorResource, Decimal] = {}
    for w in workloads:
        for fr, v in w.usage().items():
            totals[fr] = totals.get(fr, Decimal(0)) + v
    by_flavor: dict[str, list[dict[str, str]]] = {}
    for fr in sorted(totals):
        by_flavor.setdefault(fr.flavor, []).append(
            {"name": fr.resource, "total": format_quantity(totals[fr])}
        )
    usage = [{"name": f, "resources": rs} for f, rs in by_flavor.items()]
    status = new.setdefault("status", {})
    status.update(
        pendingWorkloads=pending,
        reservingWorkloads=len(workloads),
        admittedWorkloads=len(workloads),
        flavorsReservation=usage,
        flavorsUsage=copy.deepcopy(usage),
    )
    if cq_exists:
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
    return new
