"""Zones of one node: what each NUMA node has and what the node's pods hold of it.

Mirrors node-feature-discovery v0.19.0 ``pkg/resourcemonitor/noderesourcesaggregator.go``
(``Aggregate``: per NUMA node, ``capacity``/``allocatable`` from the machine, ``available``
= allocatable minus what the pods' containers were given on that node - exclusive CPUs,
NUMA-bound memory, devices by their NUMA affinity; zones named ``node-<id>``, type
``Node``, with ``costs`` from the NUMA distances) and ``nfd-topology-updater.go``
(attributes ``topologyManagerPolicy`` / ``topologyManagerScope`` from the kubelet
configuration, and the deprecated ``topologyPolicies`` as ``pkg/topologypolicy`` words
them).

The pods' allocations come from what the node agent records on them - the devices
(``gpulab.io/allocate-<container>``) and the NUMA pinning (``gpulab.io/topology-affinity``)
- where nfd-topology-updater asks kubelet's podresources API.

Lab differences: devices are whole GPUs (``nvidia.com/gpu``; a time-sliced replica
counts on its GPU's NUMA node, MIG devices are not reported); allocatable equals
capacity (no reserved CPUs, unhealthy GPUs are still counted); no pod-set fingerprint
attribute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpulab.nodeagent import policy, topology

GPU = "nvidia.com/gpu"
ZONE_TYPE_NODE = "Node"
Obj = Mapping[str, Any]

_POLICY_NAMES = {  # topologypolicy.DetectTopologyPolicy
    ("single-numa-node", "container"): "SingleNUMANodeContainerLevel",
    ("single-numa-node", "pod"): "SingleNUMANodePodLevel",
    ("restricted", "container"): "RestrictedContainerLevel",
    ("restricted", "pod"): "RestrictedPodLevel",
    ("best-effort", "container"): "BestEffortContainerLevel",
    ("best-effort", "pod"): "BestEffortPodLevel",
}


def zone_name(numa: int) -> str:
    return f"node-{numa}"


def aggregate(machine: topology.MachineInfo, pods: Iterable[Obj]) -> list[dict[str, Any]]:
    """The zones of the node ``machine`` describes, with the active ``pods`` subtracted."""
    gpus = {n.id: 0 for n in machine.numa_nodes}
    for numa in machine.devices.values():
        gpus[numa] = gpus.get(numa, 0) + 1
    used = {n.id: {"cpu": 0, "memory": 0, GPU: 0} for n in machine.numa_nodes}
    for pod in pods:
        if policy.is_terminal(pod):
            continue
        for a in topology.decode(pod).values():
            used[a.numa]["cpu"] += a.cpus
            used[a.numa]["memory"] += a.memory
        for record in policy.recorded(pod).values():
            for device in record.devices.get(GPU, ()):
                numa = topology.device_numa(device, machine)
                if numa is not None:
                    used[numa][GPU] += 1
    zones = []
    for n in machine.numa_nodes:
        have = {"cpu": n.cpus, "memory": n.memory, GPU: gpus[n.id]}
        zones.append(
            {
                "name": zone_name(n.id),
                "type": ZONE_TYPE_NODE,
                "costs": [
                    {"name": zone_name(other), "value": d}
                    for other, d in sorted(n.distances.items())
                ],
                "resources": [
                    {
                        "name": r,
                        "capacity": str(v),
                        "allocatable": str(v),
                        "available": str(max(v - used[n.id][r], 0)),
                    }
                    for r, v in have.items()
                    if r != GPU or v
                ],
            }
        )
    return zones


def node_resource_topology(
    node: str, config: topology.KubeletConfig, zones: list[dict[str, Any]]
) -> dict[str, Any]:
    """The NodeResourceTopology (topology.node.k8s.io/v1alpha2) for ``node``."""
    policy_name = _POLICY_NAMES.get(
        (config.topology_manager_policy, config.topology_manager_scope), "None"
    )
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "topologyPolicies": [policy_name],
        "attributes": [
            {"name": "topologyManagerPolicy", "value": config.topology_manager_policy},
            {"name": "topologyManagerScope", "value": config.topology_manager_scope},
        ],
        "zones": zones,
    }
