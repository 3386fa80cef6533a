"""NUMA zones as the NodeResourceTopologyMatch plugin reads them from an NRT object.

Mirrors scheduler-plugins v0.35.4-devel ``pkg/noderesourcetopology``: ``pluginhelpers.go``
(``createNUMANodeList``: zones of type ``Node`` named ``node-<id>``, resources =
``available``, costs by zone), ``numaresources.go`` (``isHostLevelResource``,
``isNUMAAffineResource``, ``isResourceSetSuitable``: for a pod that is not Guaranteed,
cpu/memory/hugepages always fit a NUMA node - they come from the shared pool),
``nodeconfig/topologymanager.go`` (policy and scope from the attributes
``topologyManagerPolicy``/``topologyManagerScope``, else from the deprecated
``topologyPolicies``; defaults none/container, 8 NUMA nodes), ``resourcerequests``
(``IncludeNonNative``) and ``pkg/util/resource.go`` (``GetPodEffectiveRequest``), with
k8stopologyawareschedwg/noderesourcetopology-api v0.1.2 names (zone type ``Node``,
``helper/numanode`` ``node-<id>``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.framework.resources import (
    CPU,
    EPHEMERAL_STORAGE,
    GUARANTEED,
    MEMORY,
    is_hugepages,
    is_native_resource,
    quantity,
)
from gpulab.informer import Resource

NODE_RESOURCE_TOPOLOGIES = Resource(
    "topology.node.k8s.io",
    "v1alpha2",
    "noderesourcetopologies",
    "NodeResourceTopology",
    namespaced=False,
)
ZONE_TYPE_NUMA_NODE = "Node"
MAX_NUMA_ID = 64
DEFAULT_MAX_NUMA_NODES = 8
LIMIT_NUMA_NODES = 1024
SINGLE_NUMA_NODE = "single-numa-node"
CONTAINER_SCOPE, POD_SCOPE = "container", "pod"
_POLICIES = ("none", "best-effort", "restricted", SINGLE_NUMA_NODE)
_DEPRECATED = {  # topologyPolicies -> (policy, scope)
    "SingleNUMANodePodLevel": (SINGLE_NUMA_NODE, POD_SCOPE),
    "SingleNUMANodeContainerLevel": (SINGLE_NUMA_NODE, CONTAINER_SCOPE),
    "BestEffortPodLevel": ("best-effort", POD_SCOPE),
    "BestEffortContainerLevel": ("best-effort", CONTAINER_SCOPE),
    "RestrictedPodLevel": ("restricted", POD_SCOPE),
    "RestrictedContainerLevel": ("restricted", CONTAINER_SCOPE),
}
_NUMA_NAME = re.compile(r"^node-(\d+)$")

Obj = Mapping[str, Any]
ResourceList = dict[str, Decimal]


@dataclass
class NUMANode:
    id: int
    resources: ResourceList
    costs: dict[int, int] = field(default_factory=dict)

    def copy(self) -> NUMANode:
        return NUMANode(self.id, dict(self.resources), dict(self.costs))


def numa_id(name: str) -> int | None:
    """numanode.NameToID: ``node-3`` -> 3; anything else -> None."""
    m = _NUMA_NAME.match(name or "")
    return int(m.group(1)) if m else None


def create_numa_node_list(zones: list[Obj]) -> list[NUMANode]:
    """The NUMA nodes of an NRT's zones: type Node, a valid name, resources = available."""
    out = []
    for zone in zones:
        if zone.get("type") != ZONE_TYPE_NUMA_NODE:
            continue
        nid = numa_id(zone.get("name", ""))
        if nid is None or nid > MAX_NUMA_ID:
            continue
        resources = {
            r["name"]: quantity(r.get("available", 0)) for r in zone.get("resources") or []
        }
        costs = {
            cid: int(c.get("value", 0))
            for c in zone.get("costs") or []
            if (cid := numa_id(c.get("name", ""))) is not None
        }
        out.append(NUMANode(nid, resources, costs))
    return out


def ignored_zones(zones: list[Obj]) -> list[str]:
    """Zones the plugin cannot use (another type than Node, or a name not node-<id>),
    described for the lab's warning."""
    out = []
    for zone in zones:
        name, kind = zone.get("name", ""), zone.get("type", "")
        if kind != ZONE_TYPE_NUMA_NODE:
            out.append(f"zone {name!r} has type {kind!r}")
        elif numa_id(name) is None:
            out.append(f"zone {name!r} is not named node-<NUMA id>")
    return out


@dataclass(frozen=True)
class TopologyManagerConf:
    policy: str = "none"
    scope: str = CONTAINER_SCOPE
    max_numa_nodes: int = DEFAULT_MAX_NUMA_NODES


def topology_manager_of(nrt: Obj) -> TopologyManagerConf:
    """TopologyManagerFromNodeResourceTopology: deprecated topologyPolicies first, then
    the attributes (which win); invalid values are ignored."""
    policy, scope, max_numa = "none", CONTAINER_SCOPE, DEFAULT_MAX_NUMA_NODES
    policies = nrt.get("topologyPolicies") or []
    if policies and policies[0] in _DEPRECATED:
        policy, scope = _DEPRECATED[policies[0]]
    for attr in nrt.get("attributes") or []:
        name, value = attr.get("name"), str(attr.get("value"))
        if name == "topologyManagerScope" and value in (CONTAINER_SCOPE, POD_SCOPE):
            scope = value
        elif name == "topologyManagerPolicy" and value in _POLICIES:
            policy = value
        elif name == "topologyManagerMaxNUMANodes" and value.isdigit() and int(value) > 1:
            max_numa = min(int(value), LIMIT_NUMA_NODES)
    return TopologyManagerConf(policy, scope, max_numa)


def is_host_level_resource(name: str) -> bool:
    """May not be bound to a NUMA node: (ephemeral) storage and non-native resources."""
    return name in (EPHEMERAL_STORAGE, "storage") or not is_native_resource(name)


def is_numa_affine_resource(name: str) -> bool:
    return name in (CPU, MEMORY) or is_hugepages(name)


def is_resource_set_suitable(qos: str, name: str, want: Decimal, numa_have: Decimal) -> bool:
    if qos != GUARANTEED and is_numa_affine_resource(name):
        return True
    return numa_have >= want


def requests_of(container: Obj) -> ResourceList:
    requests = (container.get("resources") or {}).get("requests") or {}
    return {name: quantity(v) for name, v in requests.items()}


def include_non_native(pod: Obj) -> bool:
    """resourcerequests.IncludeNonNative: a container requests e.g. nvidia.com/gpu."""
    spec = pod.get("spec") or {}
    return any(
        not is_native_resource(name)
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        for name in requests_of(c)
    )


def pod_effective_request(pod: Obj) -> ResourceList:
    """util.GetPodEffectiveRequest: max(sum of app containers, largest init container),
    plus the pod's overhead."""
    spec = pod.get("spec") or {}
    init: ResourceList = {}
    for c in spec.get("initContainers") or []:
        for name, q in requests_of(c).items():
            if q > init.get(name, Decimal(-1)):
                init[name] = q
    out: ResourceList = {}
    for c in spec.get("containers") or []:
        for name, q in requests_of(c).items():
            out[name] = out.get(name, Decimal(0)) + q
    for name, q in init.items():
        if q > out.get(name, Decimal(-1)):
            out[name] = q
    for name, v in (spec.get("overhead") or {}).items():
        out[name] = out.get(name, Decimal(0)) + quantity(v)
    return out
