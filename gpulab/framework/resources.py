"""Resource arithmetic of the scheduler: what a pod asks for, what a node has.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/types.go`` (``Resource``: MilliCPU,
Memory, EphemeralStorage, AllowedPodNumber, ScalarResources) and k8s.io/component-helpers
v0.36.3 ``resource/helpers.go`` (``PodRequests``: the sum of the app containers, the
largest init container - restartable (sidecar) init containers count as running next to
everything after them - pod-level requests for cpu/memory, plus ``spec.overhead``).

Pure functions over pod/node JSON dicts as the API server serves them (quantities parsed
with gpulab.kueue.api's helper). The Volcano
chapter reuses them (its predicates and proportion plugins do the same arithmetic).

Lab differences: requests come from ``spec`` only (upstream reads the resized
``status`` resources of in-place vertically scaled pods); DRA node-allocatable claims are
not counted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.kueue.api import quantity

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
HUGEPAGES_PREFIX = "hugepages-"

# schedutil.DefaultMilliCPURequest / DefaultMemoryRequest: what scoring assumes for a
# container that requests nothing (never used for fitting)
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

# component-helpers SupportedPodLevelResources (cpu, memory, hugepages-*)
_POD_LEVEL = (CPU, MEMORY)

Obj = Mapping[str, Any]
ResourceList = dict[str, Decimal]


INT64_MAX = 2**63 - 1


def value_of(q: Decimal) -> int:
    """resource.Quantity.Value(): whole units, rounded up; an int64 in Go, so a quantity
    beyond it ("1e400") is held at the int64 bounds here (lab: Go's result is not
    specified for those; a bound keeps it a number floats can add)."""
    return max(-INT64_MAX - 1, min(INT64_MAX, math.ceil(q)))


def milli_value_of(q: Decimal) -> int:
    """resource.Quantity.MilliValue(): thousandths, rounded up; bounded as value_of."""
    return max(-INT64_MAX - 1, min(INT64_MAX, math.ceil(q * 1000)))


def is_native_resource(name: str) -> bool:
    """v1helper.IsNativeResource: no domain, or a kubernetes.io domain."""
    return "/" not in name or "kubernetes.io/" in name


def is_hugepages(name: str) -> bool:
    return name.startswith(HUGEPAGES_PREFIX)


def is_extended_resource_name(name: str) -> bool:
    """v1helper.IsExtendedResourceName: a domain-qualified, non-kubernetes.io name
    such as ``nvidia.com/gpu``."""
    return not is_native_resource(name) and not name.startswith("requests.")


@dataclass
class Resource:
    """A bundle of compute resources (framework.Resource), in the units the scheduler
    compares: millicores, bytes, counts."""

    milli_cpu: int = 0
    memory: int = 0
    ephemeral_storage: int = 0
    allowed_pod_number: int = 0
    scalar: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_list(cls, resources: Mapping[str, Any] | None) -> Resource:
        """NewResource(rl): a ResourceList (strings or Decimals) in scheduler units."""
        r = cls()
        r.add_list(resources or {})
        return r

    def add_list(self, resources: Mapping[str, Any]) -> None:
        for name, raw in resources.items():
            q = raw if isinstance(raw, Decimal) else quantity(raw)
            if name == CPU:
                self.milli_cpu += milli_value_of(q)
            elif name == MEMORY:
                self.memory += value_of(q)
            elif name == PODS:
                self.allowed_pod_number += value_of(q)
            elif name == EPHEMERAL_STORAGE:
                self.ephemeral_storage += value_of(q)
            else:
                self.scalar[name] = self.scalar.get(name, 0) + value_of(q)

    def add(self, other: Resource) -> None:
        self.milli_cpu += other.milli_cpu
        self.memory += other.memory
        self.ephemeral_storage += other.ephemeral_storage
        self.allowed_pod_number += other.allowed_pod_number
        for name, v in other.scalar.items():
            self.scalar[name] = self.scalar.get(name, 0) + v

    def sub(self, other: Resource) -> None:
        self.milli_cpu -= other.milli_cpu
        self.memory -= other.memory
        self.ephemeral_storage -= other.ephemeral_storage
        self.allowed_pod_number -= other.allowed_pod_number
        for name, v in other.scalar.items():
            self.scalar[name] = self.scalar.get(name, 0) - v

    def clone(self) -> Resource:
        return Resource(
            self.milli_cpu,
            self.memory,
            self.ephemeral_storage,
            self.allowed_pod_number,
            dict(self.scalar),
        )

    def get(self, name: str) -> int:
        """One resource in scheduler units (cpu in millicores)."""
        if name == CPU:
            return self.milli_cpu
        if name == MEMORY:
            return self.memory
        if name == EPHEMERAL_STORAGE:
            return self.ephemeral_storage
        if name == PODS:
            return self.allowed_pod_number
        return self.scalar.get(name, 0)

    def is_zero(self) -> bool:
        return not (
            self.milli_cpu or self.memory or self.ephemeral_storage or any(self.scalar.values())
        )


def _container_requests(container: Obj) -> ResourceList:
    requests = (container.get("resources") or {}).get("requests") or {}
    return {name: quantity(v) for name, v in requests.items()}


def _add(into: ResourceList, more: Mapping[str, Decimal]) -> None:
    for name, q in more.items():
        into[name] = into.get(name, Decimal(0)) + q


def _max(into: ResourceList, other: Mapping[str, Decimal]) -> None:
    for name, q in other.items():
        if q > into.get(name, Decimal(-1)):
            into[name] = q


def _apply_non_missing(reqs: ResourceList, non_missing: Mapping[str, Decimal]) -> ResourceList:
    out = dict(reqs)
    for name, q in non_missing.items():
        if name not in reqs:
            out[name] = out.get(name, Decimal(0)) + q
    return out


def _is_restartable(container: Obj) -> bool:
    return container.get("restartPolicy") == "Always"


def pod_requests(pod: Obj, non_missing: Mapping[str, Decimal] | None = None) -> ResourceList:
    """resource.PodRequests: what the pod asks the node for, per resource.

    ``non_missing`` fills in requests a container leaves out (the scoring defaults);
    requests a container sets explicitly, even to 0, are kept.
    """
    spec = pod.get("spec") or {}
    reqs: ResourceList = {}
    for c in spec.get("containers") or []:
        cr = _container_requests(c)
        _add(reqs, _apply_non_missing(cr, non_missing) if non_missing else cr)
    restartable: ResourceList = {}
    init_max: ResourceList = {}
    for c in spec.get("initContainers") or []:
        cr = _container_requests(c)
        if non_missing:
            cr = _apply_non_missing(cr, non_missing)
        if _is_restartable(c):
            # a sidecar runs next to the app containers and every later init container
            _add(reqs, cr)
            _add(restartable, cr)
            effective = dict(restartable)
        else:
            effective = dict(cr)
            _add(effective, restartable)
        _max(init_max, effective)
    _max(reqs, init_max)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for name, v in pod_level.items():
        if name in _POD_LEVEL or is_hugepages(name):
            reqs[name] = quantity(v)
    _add(reqs, {n: quantity(v) for n, v in (spec.get("overhead") or {}).items()})
    return reqs


def pod_request(pod: Obj) -> Resource:
    """The pod's requests as a Resource (NodeResourcesFit's preFilterState)."""
    return Resource.from_list(pod_requests(pod))


NON_ZERO_DEFAULTS: Mapping[str, Decimal] = {
    CPU: Decimal(DEFAULT_MILLI_CPU_REQUEST) / 1000,
    MEMORY: Decimal(DEFAULT_MEMORY_REQUEST),
}


def pod_non_zero_request(pod: Obj) -> Resource:
    """The requests scoring counts: a container that asks no cpu/memory counts as
    100m / 200MB (NodeInfo's NonZeroRequested)."""
    reqs = pod_requests(pod, NON_ZERO_DEFAULTS)
    return Resource(
        milli_cpu=milli_value_of(reqs.get(CPU, Decimal(0))),
        memory=value_of(reqs.get(MEMORY, Decimal(0))),
    )


GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"


def pod_qos(pod: Obj) -> str:
    """v1qos.GetPodQOS: ``status.qosClass`` as the API server set it, else computed from
    the containers' cpu/memory requests and limits (ComputePodQOS)."""
    given = (pod.get("status") or {}).get("qosClass")
    if given:
        return str(given)
    spec = pod.get("spec") or {}
    requests: ResourceList = {}
    limits: ResourceList = {}
    guaranteed = True
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        res = c.get("resources") or {}
        for target, key in ((requests, "requests"), (limits, "limits")):
            for name, raw in (res.get(key) or {}).items():
                q = quantity(raw)
                if name in (CPU, MEMORY) and q > 0:
                    target[name] = target.get(name, Decimal(0)) + q
        found = {n for n, v in (res.get("limits") or {}).items() if quantity(v) > 0}
        if not {CPU, MEMORY} <= found:
            guaranteed = False
    if not requests and not limits:
        return BEST_EFFORT
    same = all(limits.get(n) == q for n, q in requests.items())
    if guaranteed and same and len(requests) == len(limits):
        return GUARANTEED
    return BURSTABLE
