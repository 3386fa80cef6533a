"""NodeResourceTopologyMatch's Filter: can one NUMA node hold it, as the kubelet will ask?

Mirrors scheduler-plugins v0.35.4-devel ``pkg/noderesourcetopology/filter.go``:

- a BestEffort pod asking only native resources passes; a node without an NRT passes;
- only the ``single-numa-node`` policy filters: container scope checks the init
  containers one by one, then the app containers one by one, each taking its share from
  the NUMA node chosen for it (``subtractResourcesFromNUMANodeList``); pod scope checks
  the pod's effective request at once;
- ``resourcesAvailableInAnyNUMANodes``: for each requested resource, the NUMA nodes that
  have enough (cpu/memory of a non-Guaranteed pod always fit; a resource no zone lists
  but the node has at all - a device without NUMA affinity - is fine); the NUMA nodes
  left for every resource are the candidates, and the lowest id is the one kubelet
  picks. A resource the node lacks altogether fails at once.
- Verdicts: "cannot align init container" / "cannot align sidecar container" /
  "cannot align container" / "cannot align pod" (Unschedulable).

:func:`explain` returns the same decision with every zone's figures, for the trace and
the demo's table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.framework.interface import SUCCESS, Code, Status, unschedulable
from gpulab.framework.snapshot import NodeInfo
from gpulab.schedulerplugins.noderesourcetopology.numaresources import (
    CONTAINER_SCOPE,
    POD_SCOPE,
    SINGLE_NUMA_NODE,
    NUMANode,
    TopologyManagerConf,
    is_host_level_resource,
    is_numa_affine_resource,
    is_resource_set_suitable,
    pod_effective_request,
    requests_of,
)

Obj = Mapping[str, Any]


@dataclass
class FilterInfo:
    node: NodeInfo
    conf: TopologyManagerConf
    numa_nodes: list[NUMANode]
    qos: str
    # what the decision looked at: (container, numa id) -> "fits" or the missing resource
    trace: dict[str, dict[int, str]] = field(default_factory=dict)


def _node_has(node: NodeInfo, name: str) -> bool:
    """util.ResourceList(nodeInfo.Allocatable): cpu, memory, pods, ephemeral-storage are
    always listed; other resources when the node has them."""
    if name in ("cpu", "memory", "pods", "ephemeral-storage"):
        return True
    return name in node.allocatable.scalar


def resources_available_in_any_numa_node(
    info: FilterInfo, resources: Mapping[str, Decimal], who: str = "pod"
) -> tuple[int, bool, str]:
    """(the NUMA id kubelet would pick, fits?, the resource that did not fit)."""
    candidates = {n.id for n in info.numa_nodes}
    seen = info.trace.setdefault(who, {n.id: "fits" for n in info.numa_nodes})
    for name, want in sorted(resources.items()):
        if want == 0:
            continue
        if not _node_has(info.node, name):
            return -1, False, name
        has_affinity = False
        fit = set()
        for numa in info.numa_nodes:
            if name not in numa.resources:
                continue
            has_affinity = True
            if is_resource_set_suitable(info.qos, name, want, numa.resources[name]):
                fit.add(numa.id)
            elif seen.get(numa.id) == "fits":
                seen[numa.id] = f"{name}: {numa.resources[name]} available < {want}"
        if not has_affinity and is_host_level_resource(name):
            continue
        candidates &= fit
        if not candidates:
            return info.conf.max_numa_nodes, False, name
    return min(candidates), True, "generic"


def subtract(
    numa_nodes: list[NUMANode], numa_id: int, qos: str, requests: Mapping[str, Decimal]
) -> None:
    """subtractResourcesFromNUMANodeList: the container's share leaves its NUMA node."""
    for numa in numa_nodes:
        if numa.id != numa_id:
            continue
        for name, q in requests.items():
            if (qos != "Guaranteed" and is_numa_affine_resource(name)) or q == 0:
                continue
            if name in numa.resources:
                numa.resources[name] -= q


def _container_kind(c: Obj) -> str:
    return "sidecar" if c.get("restartPolicy") == "Always" else "init"


def single_numa_container_level(pod: Obj, info: FilterInfo) -> tuple[Status, dict[str, int]]:
    """Every container on one NUMA node; returns the NUMA node per app container."""
    spec = pod.get("spec") or {}
    for c in spec.get("initContainers") or []:
        _, ok, _ = resources_available_in_any_numa_node(info, requests_of(c), c["name"])
        if not ok:
            return unschedulable(f"cannot align {_container_kind(c)} container"), {}
    chosen = {}
    for c in spec.get("containers") or []:
        reqs = requests_of(c)
        numa, ok, _ = resources_available_in_any_numa_node(info, reqs, c["name"])
        if not ok:
            return unschedulable("cannot align container"), chosen
        subtract(info.numa_nodes, numa, info.qos, reqs)
        chosen[c["name"]] = numa
    return SUCCESS, chosen


def single_numa_pod_level(pod: Obj, info: FilterInfo) -> tuple[Status, dict[str, int]]:
    numa, ok, _ = resources_available_in_any_numa_node(info, pod_effective_request(pod))
    if not ok:
        return unschedulable("cannot align pod"), {}
    return SUCCESS, {"": numa}


def filter_numa(pod: Obj, info: FilterInfo) -> tuple[Status, dict[str, int]]:
    """The Filter's decision for a node with an NRT under its topology manager config."""
    if info.conf.policy != SINGLE_NUMA_NODE:
        return SUCCESS, {}
    if info.conf.scope == POD_SCOPE:
        return single_numa_pod_level(pod, info)
    if info.conf.scope == CONTAINER_SCOPE:
        return single_numa_container_level(pod, info)
    return Status(Code.SUCCESS), {}
