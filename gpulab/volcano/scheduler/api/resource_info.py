"""Volcano's resource arithmetic: a Resource of floats and comparisons dimension by dimension.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/api/resource_info.go`` (``NewResource``:
cpu in millicores, memory in bytes, ``pods`` in whole units, every other scalar resource -
``nvidia.com/gpu``, HAMi's ``nvidia.com/gpumem`` ... - in thousandths; ``LessEqual`` with a
0.1 tolerance and a default for dimensions one side lacks (``Zero`` or ``Infinity``);
``MinDimensionResource``, ``Diff``, ``ExceededPart``, ``Multi``) and ``pod_info.go``
``GetPodResourceRequest`` (what a pod asks for, plus one ``pods``).

GPU awareness is nothing special: ``nvidia.com/gpu`` and the vGPU resources are ordinary
scalar dimensions. The pod's requests are summed by the scheduling framework's
:func:`gpulab.framework.resources.pod_requests` (the same containers / init containers /
pod-level / overhead rule Volcano's ``aggregateAllContainerResourceRequests`` applies).

Lab differences: no ignored-device list (``IgnoredDevicesList``) and no oversubscription
resources; the in-place-resize status resources are not read (as the framework).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.framework.resources import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    PODS,
    is_extended_resource_name,
    is_hugepages,
    milli_value_of,
    pod_requests,
    value_of,
)
from gpulab.kueue.api import format_quantity, quantity

MIN_RESOURCE = 0.1  # minResource: below it a dimension counts as empty
ZERO, INFINITY = 0, -1  # DimensionDefaultValue
GPU = "nvidia.com/gpu"


def is_count_quota(name: str) -> bool:
    return name.startswith("count/")


def is_scalar_resource_name(name: str) -> bool:
    """k8s scheduler util IsScalarResourceName: extended, hugepages, prefixed native
    (``*kubernetes.io/*``) or attachable-volume resources."""
    return (
        is_extended_resource_name(name)
        or is_hugepages(name)
        or "kubernetes.io/" in name
        or name.startswith("attachable-volumes-")
    )


@dataclass
class Resource:
    milli_cpu: float = 0.0
    memory: float = 0.0
    scalar: dict[str, float] = field(default_factory=dict)
    max_task_num: int = 0  # only predicates read it

    # ---------------------------------------------------------------- building

    @classmethod
    def from_list(cls, resources: Mapping[str, Any] | None) -> Resource:
        """NewResource(rl): a ResourceList (quantity strings or Decimals)."""
        r = cls()
        for name, raw in (resources or {}).items():
            q = raw if isinstance(raw, Decimal) else quantity(raw)
            if name == CPU:
                r.milli_cpu += milli_value_of(q)
            elif name == MEMORY:
                r.memory += value_of(q)
            elif name == PODS:
                r.max_task_num += value_of(q)
                r.add_scalar(PODS, value_of(q))
            elif name == EPHEMERAL_STORAGE or (
                not is_count_quota(name) and is_scalar_resource_name(name)
            ):
                r.add_scalar(name, milli_value_of(q))
        return r

    def add_scalar(self, name: str, value: float) -> None:
        self.scalar[name] = self.scalar.get(name, 0.0) + value

    def clone(self) -> Resource:
        return Resource(self.milli_cpu, self.memory, dict(self.scalar), self.max_task_num)

    # ---------------------------------------------------------------- reading

    def get(self, name: str) -> float:
        if name == CPU:
            return self.milli_cpu
        if name == MEMORY:
            return self.memory
        return self.scalar.get(name, 0.0)

    def resource_names(self) -> list[str]:
        """Dimensions holding at least MIN_RESOURCE."""
        names = [n for n, v in ((CPU, self.milli_cpu), (MEMORY, self.memory)) if v >= MIN_RESOURCE]
        names.extend(n for n, v in self.scalar.items() if v >= MIN_RESOURCE)
        return names

    def is_empty(self) -> bool:
        """True when nothing but ``pods`` is at least MIN_RESOURCE (a BestEffort pod)."""
        if self.milli_cpu >= MIN_RESOURCE or self.memory >= MIN_RESOURCE:
            return False
        return all(v < MIN_RESOURCE for n, v in self.scalar.items() if n != PODS)

    # ---------------------------------------------------------------- arithmetic

    def add(self, other: Resource) -> Resource:
        self.milli_cpu += other.milli_cpu
        self.memory += other.memory
        for name, v in other.scalar.items():
            self.scalar[name] = self.scalar.get(name, 0.0) + v
        return self

    def sub(self, other: Resource) -> Resource:
        """Subtract (upstream asserts sufficiency; callers here keep it). Scalars are
        subtracted only from a resource that has any, as upstream's nil map check."""
        self.milli_cpu -= other.milli_cpu
        self.memory -= other.memory
        if self.scalar:
            for name, v in other.scalar.items():
                self.scalar[name] = self.scalar.get(name, 0.0) - v
        return self

    def multi(self, ratio: float) -> Resource:
        self.milli_cpu *= ratio
        self.memory *= ratio
        for name in self.scalar:
            self.scalar[name] *= ratio
        return self

    def set_max_resource(self, other: Resource) -> None:
        self.milli_cpu = max(self.milli_cpu, other.milli_cpu)
        self.memory = max(self.memory, other.memory)
        for name, v in other.scalar.items():
            if v > self.scalar.get(name, -math.inf):
                self.scalar[name] = v

    def min_dimension_resource(self, other: Resource, default: int) -> Resource:
        """Per dimension the smaller one; a scalar ``other`` lacks is kept (Infinity) or
        zeroed (Zero)."""
        self.milli_cpu = min(self.milli_cpu, other.milli_cpu)
        self.memory = min(self.memory, other.memory)
        for name, v in self.scalar.items():
            if name in other.scalar:
                self.scalar[name] = min(v, other.scalar[name])
            elif default != INFINITY:
                self.scalar[name] = 0.0
        return self

    def diff(self, other: Resource, default: int) -> tuple[Resource, Resource]:
        """(what self has more of, what other has more of), per dimension."""
        left, right = self.clone(), other.clone()
        for name in left.scalar:
            right.scalar.setdefault(name, float(default))
        for name in right.scalar:
            left.scalar.setdefault(name, float(default))
        inc, dec = Resource(), Resource()
        if left.milli_cpu > right.milli_cpu:
            inc.milli_cpu = left.milli_cpu - right.milli_cpu
        else:
            dec.milli_cpu = right.milli_cpu - left.milli_cpu
        if left.memory > right.memory:
            inc.memory = left.memory - right.memory
        else:
            dec.memory = right.memory - left.memory
        for name, lq in left.scalar.items():
            rq = right.scalar[name]
            if lq == float(INFINITY):
                inc.scalar[name] = lq
            elif rq == float(INFINITY):
                dec.scalar[name] = rq
            elif lq > rq:
                inc.scalar[name] = lq - rq
            else:
                dec.scalar[name] = rq - lq
        return inc, dec

    # ---------------------------------------------------------------- comparing

    def less_equal(self, other: Resource, default: int = ZERO) -> bool:
        return self.less_equal_with_names(other, default)[0]

    def less_equal_with_names(self, other: Resource, default: int = ZERO) -> tuple[bool, list[str]]:
        """LessEqualWithResourcesName: every dimension within 0.1 of or below ``other``'s;
        the names of those that are not."""
        short: list[str] = []
        if not _le(self.milli_cpu, other.milli_cpu):
            short.append(CPU)
        if not _le(self.memory, other.memory):
            short.append(MEMORY)
        for name, lv in self.scalar.items():
            if name not in other.scalar and default == INFINITY:
                continue
            if not _le(lv, other.scalar.get(name, 0.0)):
                short.append(name)
        return not short, short

    def less_partly(self, other: Resource, default: int = ZERO) -> bool:
        """LessPartly: some dimension of self is below ``other``'s (a scalar only ``other``
        has counts as below it with the Zero default)."""
        if self.milli_cpu < other.milli_cpu or self.memory < other.memory:
            return True
        if default == ZERO and any(name not in self.scalar for name in other.scalar):
            return True
        for name, lv in self.scalar.items():
            if name not in other.scalar and default == INFINITY:
                return True
            if lv < other.scalar.get(name, 0.0):
                return True
        return False

    def less_equal_with_dimension(self, other: Resource, req: Resource) -> tuple[bool, list[str]]:
        """LessEqualWithDimensionAndResourcesName: compare only the dimensions ``req``
        asks for (``pods`` ignored), without tolerance."""
        short: list[str] = []
        if req.milli_cpu > 0 and self.milli_cpu > other.milli_cpu:
            short.append(CPU)
        if req.memory > 0 and self.memory > other.memory:
            short.append(MEMORY)
        for name, q in req.scalar.items():
            if name == PODS or q <= 0:
                continue
            if self.scalar.get(name, 0.0) > other.scalar.get(name, 0.0):
                short.append(name)
        return not short, short

    # ---------------------------------------------------------------- printing

    def to_list(self) -> dict[str, str]:
        """util.ConvertRes2ResList: back to a ResourceList (scalars from thousandths)."""
        out: dict[str, str] = {}
        if self.milli_cpu:
            out[CPU] = format_quantity(Decimal(int(self.milli_cpu)) / 1000)
        if self.memory:
            out[MEMORY] = format_quantity(Decimal(int(self.memory)))
        for name, v in sorted(self.scalar.items()):
            if name == PODS:
                out[name] = str(int(v))
            elif v:
                out[name] = format_quantity(Decimal(int(v)) / 1000)
        return out

    def go_string(self) -> str:
        """Resource.String() as upstream prints it: ``cpu 500.00, memory 0.00,
        nvidia.com/gpu 4000.00`` (millicores, bytes, scalars in thousandths)."""
        parts = [f"cpu {self.milli_cpu:0.2f}", f"memory {self.memory:0.2f}"]
        parts.extend(f"{name} {self.scalar[name]:0.2f}" for name in sorted(self.scalar))
        return ", ".join(parts)

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_list().items()) or "<none>"


def _le(left: float, right: float) -> bool:
    return left < right or abs(left - right) < MIN_RESOURCE


def exceeded_part(left: Resource, right: Resource) -> Resource:
    """ExceededPart: what ``left`` has beyond ``right``."""
    return left.diff(right, ZERO)[0]


def res_max(left: Resource, right: Resource) -> Resource:
    """helpers.Max: per dimension the larger (negative scalars dropped)."""
    out = Resource(max(left.milli_cpu, right.milli_cpu), max(left.memory, right.memory))
    for name, v in left.scalar.items():
        if v >= 0:
            out.scalar[name] = v
    for name, v in right.scalar.items():
        if v >= 0:
            out.scalar[name] = max(v, out.scalar.get(name, 0.0))
    return out


def share(allocated: float, total: float) -> float:
    """helpers.Share."""
    if total == 0:
        return 0.0 if allocated == 0 else 1.0
    return allocated / total


def pod_resource_request(pod: Mapping[str, Any]) -> Resource:
    """GetPodResourceRequest: the pod's requests plus one ``pods``."""
    r = Resource.from_list(pod_requests(pod))
    r.add_scalar(PODS, 1)
    return r


def total(resources: Iterable[Resource]) -> Resource:
    out = Resource()
    for r in resources:
        out.add(r)
    return out
