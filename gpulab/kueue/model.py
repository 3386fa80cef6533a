"""Typed views of the kueue.x-k8s.io objects the cache and scheduler work on.

Parsed from plain dicts (what the API server returns for custom resources). Mirrors the
parts of apis/kueue/v1beta2 and pkg/workload/workload.go (workload.Info, TotalRequests)
that admission needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource, quantity

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor: the node labels, taints and tolerations it stands for."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    node_taints: Sequence[Mapping[str, Any]] = ()
    tolerations: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Quota:
    nominal: Decimal
    borrowing_limit: Decimal | None = None
    lending_limit: Decimal | None = None


@dataclass(frozen=True)
class ResourceGroup:
    covered_resources: tuple[str, ...]
    flavors: tuple[str, ...]


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    quotas: Mapping[FlavorResource, Quota] = field(default_factory=dict)
    cohort: str | None = None
    queueing_strategy: str = api.BEST_EFFORT_FIFO
    # None is the "nothing" selector upstream: no namespace may submit.
    namespace_selector: Mapping[str, Any] | None = None
    within_cluster_queue: str = api.NEVER
    reclaim_within_cohort: str = api.NEVER
    when_can_borrow: str = "MayStopSearch"
    when_can_preempt: str = "TryNextFlavor"
    stop_policy: str = "None"

    def group_for(self, resource: str) -> ResourceGroup | None:
        for group in self.resource_groups:
            if resource in group.covered_resources:
                return group
        return None

    def flavor_names(self) -> list[str]:
        seen: dict[str, None] = {}
        for group in self.resource_groups:
            for name in group.flavors:
                seen.setdefault(name)
        return list(seen)


@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    # Total requests of the pod set: per-pod requests times count.
    requests: Mapping[str, Decimal]
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class WorkloadInfo:
    """A Workload as the scheduler sees it (pkg/workload.Info)."""

    namespace: str
    name: str
    queue_name: str
    pod_sets: tuple[PodSet, ...]
    priority: int = 0
    created: str = ""
    uid: str = ""
    # The ClusterQueue it is admitted to, or (pending) the one its LocalQueue points at.
    cluster_queue: str | None = None
    admission: Mapping[str, Any] | None = None
    quota_reserved_at: str = ""
    evicted: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def usage(self) -> dict[FlavorResource, Decimal]:
        """Quota this Workload holds, read from status.admission."""
        if not self.admission:
            return {}
        used: dict[FlavorResource, Decimal] = {}
        for psa in self.admission.get("podSetAssignments") or []:
            usage = psa.get("resourceUsage") or {}
            for resource, flavor in (psa.get("flavors") or {}).items():
                if resource in usage:
                    fr = FlavorResource(flavor, resource)
                    used[fr] = used.get(fr, Decimal(0)) + quantity(usage[resource])
        return used


def _opt_quantity(value: Any) -> Decimal | None:
    return None if value is None else quantity(value)


def flavor_from_obj(obj: Obj) -> Flavor:
    spec = obj.get("spec") or {}
    return Flavor(
        name=obj["metadata"]["name"],
        node_labels=dict(spec.get("nodeLabels") or {}),
        node_taints=tuple(spec.get("nodeTaints") or ()),
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def cluster_queue_from_obj(obj: Obj) -> ClusterQueue:
    """Parse a v1beta2 ClusterQueue (a v1beta1 ``cohort`` is accepted too)."""
    spec = obj.get("spec") or {}
    groups: list[ResourceGroup] = []
    quotas: dict[FlavorResource, Quota] = {}
    for rg in spec.get("resourceGroups") or []:
        flavors = []
        for fq in rg.get("flavors") or []:
            flavors.append(fq["name"])
            for rq in fq.get("resources") or []:
                quotas[FlavorResource(fq["name"], rq["name"])] = Quota(
                    nominal=quantity(rq.get("nominalQuota", 0)),
                    borrowing_limit=_opt_quantity(rq.get("borrowingLimit")),
                    lending_limit=_opt_quantity(rq.get("lendingLimit")),
                )
        groups.append(ResourceGroup(tuple(rg.get("coveredResources") or ()), tuple(flavors)))
    preemption = spec.get("preemption") or {}
    fungibility = spec.get("flavorFungibility") or {}
    return ClusterQueue(
        name=obj["metadata"]["name"],
        resource_groups=tuple(groups),
        quotas=quotas,
        cohort=spec.get("cohortName") or spec.get("cohort") or None,
        queueing_strategy=spec.get("queueingStrategy") or api.BEST_EFFORT_FIFO,
        namespace_selector=spec.get("namespaceSelector"),
        within_cluster_queue=preemption.get("withinClusterQueue") or api.NEVER,
        reclaim_within_cohort=preemption.get("reclaimWithinCohort") or api.NEVER,
        when_can_borrow=fungibility.get("whenCanBorrow") or "MayStopSearch",
        when_can_preempt=fungibility.get("whenCanPreempt") or "TryNextFlavor",
        stop_policy=spec.get("stopPolicy") or "None",
    )


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """Per-pod requests: containers summed, init containers as a floor, plus overhead.

    Requests default to limits when only limits are given, as the API server does.
    """

    def container_requests(c: Obj) -> dict[str, Decimal]:
        res = c.get("resources") or {}
        merged = dict(res.get("limits") or {})
        merged.update(res.get("requests") or {})
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        for k, v in container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in pod_spec.get("initContainers") or []:
        for k, v in container_requests(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    for k, v in (pod_spec.get("overhead") or {}).items():
        total[k] = total.get(k, Decimal(0)) + quantity(v)
    return total


def pod_set_from_obj(ps: Obj) -> PodSet:
    spec = (ps.get("template") or {}).get("spec") or {}
    count = int(ps.get("count", 1))
    return PodSet(
        name=ps.get("name") or api.DEFAULT_POD_SET,
        count=count,
        requests={k: v * count for k, v in pod_requests(spec).items()},
        node_selector=dict(spec.get("nodeSelector") or {}),
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def condition(obj: Obj, ctype: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def condition_true(obj: Obj, ctype: str) -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond.get("status") == "True"


def workload_from_obj(obj: Obj, cluster_queue: str | None = None) -> WorkloadInfo:
    """Parse a Workload; ``cluster_queue`` is the LocalQueue's ClusterQueue when pending."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    admission = status.get("admission")
    reserved = condition(obj, api.QUOTA_RESERVED)
    return WorkloadInfo(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        queue_name=spec.get("queueName", ""),
        pod_sets=tuple(pod_set_from_obj(ps) for ps in spec.get("podSets") or []),
        priority=int(spec.get("priority") or 0),
        created=meta.get("creationTimestamp", ""),
        cluster_queue=admission["clusterQueue"] if admission else cluster_queue,
        admission=admission,
        quota_reserved_at=(reserved or {}).get("lastTransitionTime", "")
        if condition_true(obj, api.QUOTA_RESERVED)
        else "",
        evicted=condition_true(obj, api.EVICTED),
    )
