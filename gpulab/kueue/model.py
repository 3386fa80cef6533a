"""Typed views of the kueue.x-k8s.io objects the cache, queues and scheduler work on.

Parsed from plain dicts (what the API server returns for custom resources). Mirrors the
parts of kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta2 and pkg/workload/workload.go
(``workload.Info``: TotalRequests with excluded resources dropped and resource
transformations applied, ``Usage``, ``Ordering.GetQueueOrderTimestamp``) that admission
needs. Quantities are ints as upstream's ``resources.ResourceValue`` counts them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource, resource_value

Obj = Mapping[str, Any]


# -- small helpers --------------------------------------------------------------------


def condition(obj: Obj, ctype: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


def condition_true(obj: Obj, ctype: str) -> bool:
    cond = condition(obj, ctype)
    return cond is not None and cond.get("status") == "True"


def timestamp(value: str | None) -> float | None:
    """RFC 3339 to seconds since the epoch (None when unset)."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; None selects nothing, {} everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -- ResourceFlavor, ClusterQueue, Cohort, LocalQueue, AdmissionCheck -------------------


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor: the node labels, taints and tolerations it stands for."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    node_taints: Sequence[Mapping[str, Any]] = ()
    tolerations: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class Quota:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True)
class ResourceGroup:
    covered_resources: tuple[str, ...]
    flavors: tuple[str, ...]


@dataclass(frozen=True)
class Preemption:
    within_cluster_queue: str = api.NEVER
    reclaim_within_cohort: str = api.NEVER
    borrow_within_cohort: str = api.NEVER
    max_priority_threshold: int | None = None


@dataclass(frozen=True)
class FlavorFungibility:
    when_can_borrow: str = api.MAY_STOP_SEARCH
    when_can_preempt: str = api.TRY_NEXT_FLAVOR
    preference: str | None = None


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    quotas: Mapping[FlavorResource, Quota] = field(default_factory=dict)
    cohort: str | None = None
    queueing_strategy: str = api.BEST_EFFORT_FIFO
    # None is the "nothing" selector upstream: no namespace may submit.
    namespace_selector: Mapping[str, Any] | None = None
    preemption: Preemption = Preemption()
    fungibility: FlavorFungibility = FlavorFungibility()
    fair_weight: float = 1.0
    # AdmissionCheck name -> the flavors it applies to (empty: all flavors).
    admission_checks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    stop_policy: str = api.STOP_NONE

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
class Cohort:
    """A Cohort object: its parent (hierarchical cohorts) and its own quota."""

    name: str
    parent: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    quotas: Mapping[FlavorResource, Quota] = field(default_factory=dict)
    fair_weight: float = 1.0


@dataclass(frozen=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    stop_policy: str = api.STOP_NONE

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _opt_value(resource: str, value: Any) -> int | None:
    return None if value is None else resource_value(resource, value)


def _resource_groups(
    spec: Obj,
) -> tuple[tuple[ResourceGroup, ...], dict[FlavorResource, Quota]]:
    groups: list[ResourceGroup] = []
    quotas: dict[FlavorResource, Quota] = {}
    for rg in spec.get("resourceGroups") or []:
        flavors = []
        for fq in rg.get("flavors") or []:
            flavors.append(fq["name"])
            for rq in fq.get("resources") or []:
                name = rq["name"]
                quotas[FlavorResource(fq["name"], name)] = Quota(
                    nominal=resource_value(name, rq.get("nominalQuota", 0)),
                    borrowing_limit=_opt_value(name, rq.get("borrowingLimit")),
                    lending_limit=_opt_value(name, rq.get("lendingLimit")),
                )
        groups.append(ResourceGroup(tuple(rg.get("coveredResources") or ()), tuple(flavors)))
    return tuple(groups), quotas


def _fair_weight(spec: Obj) -> float:
    weight = (spec.get("fairSharing") or {}).get("weight")
    return 1.0 if weight is None else float(parse_quantity(weight))


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
    groups, quotas = _resource_groups(spec)
    preemption = spec.get("preemption") or {}
    bwc = preemption.get("borrowWithinCohort") or {}
    fungibility = spec.get("flavorFungibility") or {}
    checks = {
        rule["name"]: tuple(rule.get("onFlavors") or ())
        for rule in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    }
    return ClusterQueue(
        name=obj["metadata"]["name"],
        resource_groups=groups,
        quotas=quotas,
        cohort=spec.get("cohortName") or spec.get("cohort") or None,
        queueing_strategy=spec.get("queueingStrategy") or api.BEST_EFFORT_FIFO,
        namespace_selector=spec.get("namespaceSelector"),
        preemption=Preemption(
            within_cluster_queue=preemption.get("withinClusterQueue") or api.NEVER,
            reclaim_within_cohort=preemption.get("reclaimWithinCohort") or api.NEVER,
            borrow_within_cohort=bwc.get("policy") or api.NEVER,
            max_priority_threshold=bwc.get("maxPriorityThreshold"),
        ),
        fungibility=FlavorFungibility(
            when_can_borrow=fungibility.get("whenCanBorrow") or api.MAY_STOP_SEARCH,
            when_can_preempt=fungibility.get("whenCanPreempt") or api.TRY_NEXT_FLAVOR,
            preference=fungibility.get("preference"),
        ),
        fair_weight=_fair_weight(spec),
        admission_checks=checks,
        stop_policy=spec.get("stopPolicy") or api.STOP_NONE,
    )


def cohort_from_obj(obj: Obj) -> Cohort:
    spec = obj.get("spec") or {}
    groups, quotas = _resource_groups(spec)
    return Cohort(
        name=obj["metadata"]["name"],
        parent=spec.get("parentName") or None,
        resource_groups=groups,
        quotas=quotas,
        fair_weight=_fair_weight(spec),
    )


def local_queue_from_obj(obj: Obj) -> LocalQueue:
    spec = obj.get("spec") or {}
    return LocalQueue(
        namespace=obj["metadata"]["namespace"],
        name=obj["metadata"]["name"],
        cluster_queue=spec.get("clusterQueue", ""),
        stop_policy=spec.get("stopPolicy") or api.STOP_NONE,
    )


# -- Workloads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Transformation:
    """Configuration resources.transformations[] (config.ResourceTransformation)."""

    input: str
    retain: bool = True  # strategy Retain (default) or Replace
    multiply_by: str = ""
    outputs: Mapping[str, Decimal] = field(default_factory=dict)


@dataclass(frozen=True)
class ResourceConfig:
    """Configuration ``resources``: what the Workloads' requests count as."""

    excluded_prefixes: tuple[str, ...] = ()
    transformations: Mapping[str, Transformation] = field(default_factory=dict)

    def effective(self, requests: Mapping[str, Decimal]) -> dict[str, Decimal]:
        """dropExcludedResources then applyResourceTransformations, per pod."""
        kept = {
            k: v
            for k, v in requests.items()
            if not any(k.startswith(p) for p in self.excluded_prefixes)
        }
        if not any(k in self.transformations for k in kept):
            return kept
        retained: dict[str, Decimal] = {}
        generated: dict[str, Decimal] = {}
        for name, q in kept.items():
            t = self.transformations.get(name)
            if t is None:
                retained[name] = retained.get(name, Decimal(0)) + q
                continue
            base = q * kept[t.multiply_by] if t.multiply_by in kept else q
            for out, factor in t.outputs.items():
                generated[out] = generated.get(out, Decimal(0)) + base * factor
            if t.retain:
                retained[name] = retained.get(name, Decimal(0)) + q
        for name, q in generated.items():
            retained[name] = retained.get(name, Decimal(0)) + max(q, Decimal(0))
        return retained


@dataclass(frozen=True)
class PodSetSpec:
    """What flavor matching needs of a pod set's template."""

    name: str
    count: int
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    required_affinity: Sequence[Sequence[Mapping[str, Any]]] = ()  # terms of expressions


@dataclass(frozen=True)
class PodSetResources:
    """workload.PodSetResources: total requests of a pod set and, once admitted, the
    flavor of every resource."""

    name: str
    count: int
    requests: Mapping[str, int]
    flavors: Mapping[str, str] = field(default_factory=dict)


@dataclass
class LastAssignment:
    """workload.AssignmentClusterQueueState: where the flavor scan stopped, so the next
    cycle resumes there (FlavorFungibilityPreserveScanProgress, Beta, on)."""

    last_tried: list[dict[str, int]]
    cq_generation: int
    cycle: int

    def next_flavor(self, ps: int, resource: str) -> int:
        if ps >= len(self.last_tried) or resource not in self.last_tried[ps]:
            return 0
        return self.last_tried[ps][resource] + 1

    def pending_flavors(self) -> bool:
        return any(idx != -1 for ps in self.last_tried for idx in ps.values())


@dataclass
class WorkloadInfo:
    """A Workload as the queues and the scheduler see it (pkg/workload.Info)."""

    namespace: str
    name: str
    queue_name: str
    total_requests: tuple[PodSetResources, ...]
    pod_sets: tuple[PodSetSpec, ...] = ()
    priority: int = 0
    priority_class: str = ""
    created: float = 0.0
    queue_ts: float = 0.0  # Ordering.GetQueueOrderTimestamp
    uid: str = ""
    job_uid: str = ""
    # The ClusterQueue it is admitted to, or (pending) the one its LocalQueue points at.
    cluster_queue: str | None = None
    admission: Mapping[str, Any] | None = None
    quota_reserved_at: float | None = None
    evicted: bool = False
    admitted: bool = False  # quota reserved and every admission check Ready
    requeue_at: float | None = None
    last_assignment: LastAssignment | None = None
    obj: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _usage: dict[FlavorResource, int] | None = field(default=None, repr=False, compare=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def usage(self) -> dict[FlavorResource, int]:
        """Quota this Workload holds (Info.Usage): requests under their flavors."""
        if self._usage is None:
            used: dict[FlavorResource, int] = {}
            for ps in self.total_requests:
                for resource, flavor in ps.flavors.items():
                    if resource in ps.requests:
                        fr = FlavorResource(flavor, resource)
                        used[fr] = used.get(fr, 0) + ps.requests[resource]
            self._usage = used
        return dict(self._usage)

    def uses(self, frs: set[FlavorResource]) -> bool:
        return any(
            FlavorResource(flv, res) in frs
            for ps in self.total_requests
            for res, flv in ps.flavors.items()
        )


def _container_requests(c: Obj) -> dict[str, Decimal]:
    res = c.get("resources") or {}
    merged = dict(res.get("limits") or {})  # requests default to limits (API server)
    merged.update(res.get("requests") or {})
    return {k: parse_quantity(v) for k, v in merged.items()}


def _add(a: dict[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Decimal(0)) + v
    return out


def _max(a: dict[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, Decimal(0)), v)
    return out


def pod_requests(pod_spec: Obj) -> dict[str, Decimal]:
    """Per-pod requests as k8s resourcehelper.PodRequests: containers summed, sidecars
    (restartable init containers) added, regular init containers as a floor, overhead."""
    total: dict[str, Decimal] = {}
    for c in pod_spec.get("containers") or []:
        total = _add(total, _container_requests(c))
    sidecars: dict[str, Decimal] = {}
    init_floor: dict[str, Decimal] = {}
    for c in pod_spec.get("initContainers") or []:
        reqs = _container_requests(c)
        if c.get("restartPolicy") == "Always":
            sidecars = _add(sidecars, reqs)
            reqs = dict(sidecars)
        else:
            reqs = _add(reqs, sidecars)
        init_floor = _max(init_floor, reqs)
    total = _max(_add(total, sidecars), init_floor)
    return _add(total, {k: parse_quantity(v) for k, v in (pod_spec.get("overhead") or {}).items()})


def _required_affinity(pod_spec: Obj) -> tuple[tuple[Mapping[str, Any], ...], ...]:
    na = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return tuple(
        tuple(term.get("matchExpressions") or ()) for term in na.get("nodeSelectorTerms") or []
    )


def pod_set_spec(ps: Obj) -> PodSetSpec:
    spec = (ps.get("template") or {}).get("spec") or {}
    return PodSetSpec(
        name=ps.get("name") or api.DEFAULT_POD_SET,
        count=int(ps.get("count", 1)),
        node_selector=dict(spec.get("nodeSelector") or {}),
        tolerations=tuple(spec.get("tolerations") or ()),
        required_affinity=_required_affinity(spec),
    )


def _pending_requests(ps: Obj, resources: ResourceConfig) -> PodSetResources:
    spec = (ps.get("template") or {}).get("spec") or {}
    count = int(ps.get("count", 1))
    per_pod = resources.effective(pod_requests(spec))
    return PodSetResources(
        name=ps.get("name") or api.DEFAULT_POD_SET,
        count=count,
        requests={k: resource_value(k, v * count) for k, v in per_pod.items()},
    )


def _admitted_requests(admission: Obj) -> tuple[PodSetResources, ...]:
    """totalRequestsFromAdmission: what status.admission records."""
    out = []
    for psa in admission.get("podSetAssignments") or []:
        usage = psa.get("resourceUsage") or {}
        out.append(
            PodSetResources(
                name=psa.get("name") or api.DEFAULT_POD_SET,
                count=int(psa.get("count") or 0),
                requests={k: resource_value(k, v) for k, v in usage.items()},
                flavors=dict(psa.get("flavors") or {}),
            )
        )
    return tuple(out)


def _evicted_at(obj: Obj, reasons: tuple[str, ...]) -> float | None:
    cond = condition(obj, api.EVICTED)
    if cond and cond.get("status") == "True" and cond.get("reason") in reasons:
        return timestamp(cond.get("lastTransitionTime"))
    return None


def queue_order_timestamp(obj: Obj, eviction_timestamp: bool = True) -> float:
    """Ordering.GetQueueOrderTimestamp: creation, or the eviction by PodsReadyTimeout
    (requeuingStrategy.timestamp Eviction, the default) or by an AdmissionCheck."""
    reasons = (api.EVICTED_BY_ADMISSION_CHECK,)
    if eviction_timestamp:
        reasons += (api.EVICTED_BY_PODS_READY_TIMEOUT,)
    evicted = _evicted_at(obj, reasons)
    if evicted is not None:
        return evicted
    return timestamp((obj.get("metadata") or {}).get("creationTimestamp")) or 0.0


def workload_from_obj(
    obj: Obj,
    cluster_queue: str | None = None,
    resources: ResourceConfig | None = None,
    eviction_timestamp: bool = True,
) -> WorkloadInfo:
    """workload.NewInfo; ``cluster_queue`` is the LocalQueue's ClusterQueue when pending."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    admission = status.get("admission") if condition_true(obj, api.QUOTA_RESERVED) else None
    reserved = condition(obj, api.QUOTA_RESERVED)
    if admission:
        total = _admitted_requests(admission)
    else:
        rc = resources or ResourceConfig()
        total = tuple(_pending_requests(ps, rc) for ps in spec.get("podSets") or [])
    requeue_at = (status.get("requeueState") or {}).get("requeueAt")
    return WorkloadInfo(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        job_uid=(meta.get("labels") or {}).get(api.JOB_UID_LABEL, ""),
        queue_name=spec.get("queueName", ""),
        total_requests=total,
        pod_sets=tuple(pod_set_spec(ps) for ps in spec.get("podSets") or []),
        priority=int(spec.get("priority") or 0),
        priority_class=(spec.get("priorityClassRef") or {}).get("name", ""),
        created=timestamp(meta.get("creationTimestamp")) or 0.0,
        queue_ts=queue_order_timestamp(obj, eviction_timestamp),
        cluster_queue=admission["clusterQueue"] if admission else cluster_queue,
        admission=admission,
        quota_reserved_at=timestamp((reserved or {}).get("lastTransitionTime"))
        if admission
        else None,
        evicted=condition_true(obj, api.EVICTED),
        admitted=condition_true(obj, api.ADMITTED),
        requeue_at=timestamp(requeue_at),
        obj=obj,
    )
