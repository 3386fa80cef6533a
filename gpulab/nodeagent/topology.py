"""kubelet's Topology Manager for the node agent: one NUMA node per container (or pod).

Mirrors kubernetes v1.36.3 ``pkg/kubelet/cm/topologymanager`` (``policy_single_numa_node.go``:
only hints naming a single NUMA node are admissible, the lowest NUMA id among them wins;
``scope_container.go`` / ``scope_pod.go``: one decision per container, init containers
first, or one for the whole pod; a pod that cannot be aligned is rejected with
``TopologyAffinityError`` "Resources cannot be allocated with Topology locality") and the
hint providers it merges: the device manager (``devicemanager/topology_hints.go``: NUMA
nodes with enough free devices of the resource, from each device's ListAndWatch
topology), the static CPU manager (exclusive CPUs for Guaranteed containers asking whole
CPUs) and the Static memory manager (memory of Guaranteed containers). The device manager
then allocates only devices on the chosen NUMA node (``filterByAffinity``).

Configuration comes from the node's KubeletConfiguration (``topologyManagerPolicy``,
``topologyManagerScope``, ``cpuManagerPolicy``, ``memoryManagerPolicy``) at
``<kubelet root>/config.yaml``; the machine's NUMA nodes (what cAdvisor reads from sysfs)
from ``<kubelet root>/machine.yaml``. Without them the policy is ``none``: nothing
changes. The lab writes both for each GPU node (harness/addons/scheduling.py), and the
topology updater reads the same files, so the zones the scheduler sees are this
machine's.

Lab differences: only containers that ask for devices are aligned (their CPUs and memory
are pinned to the same NUMA node when Guaranteed; a CPU-only Guaranteed pod is not
pinned, which the static CPU manager would do); the choice per container is recorded
on the pod in the annotation ``gpulab.io/topology-affinity`` (kubelet keeps it in its
cpu_manager_state / memory_manager_state checkpoints, which the podresources API
exposes to topology updaters); the ``best-effort`` and ``restricted`` policies are
treated as ``none``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils.quantity import parse_quantity

from gpulab.fakegpu import profiles
from gpulab.framework.resources import GUARANTEED, pod_qos
from gpulab.nodeagent import policy

Obj = Mapping[str, Any]

KUBELET_CONFIG = "config.yaml"
MACHINE_INFO = "machine.yaml"
AFFINITY_ANNOTATION = "gpulab.io/topology-affinity"
SINGLE_NUMA_NODE = "single-numa-node"
CONTAINER_SCOPE, POD_SCOPE = "container", "pod"
TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
LOCAL_DISTANCE, REMOTE_DISTANCE = 10, 20  # what a two-socket machine's SLIT says


class TopologyAffinityError(policy.AdmissionError):
    """The pod cannot get all its resources from one NUMA node."""

    reason = TOPOLOGY_AFFINITY_ERROR

    def __init__(self) -> None:
        super().__init__(TOPOLOGY_AFFINITY_MESSAGE)


# -- configuration and machine --------------------------------------------------------------


@dataclass(frozen=True)
class KubeletConfig:
    """The KubeletConfiguration fields the Topology Manager and its providers read."""

    topology_manager_policy: str = "none"
    topology_manager_scope: str = CONTAINER_SCOPE
    cpu_manager_policy: str = "none"
    memory_manager_policy: str = "None"

    @classmethod
    def load(cls, path: Path) -> KubeletConfig:
        if not path.exists():
            return cls()
        data = yaml.safe_load(path.read_text()) or {}
        return cls(
            data.get("topologyManagerPolicy", "none"),
            data.get("topologyManagerScope", CONTAINER_SCOPE),
            data.get("cpuManagerPolicy", "none"),
            data.get("memoryManagerPolicy", "None"),
        )

    def to_yaml(self) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "topologyManagerPolicy": self.topology_manager_policy,
                "topologyManagerScope": self.topology_manager_scope,
                "cpuManagerPolicy": self.cpu_manager_policy,
                "memoryManagerPolicy": self.memory_manager_policy,
            },
            sort_keys=False,
        )


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: int  # whole CPUs
    memory: int  # bytes
    distances: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class MachineInfo:
    """The node's NUMA nodes and which device (GPU UUID) sits on which."""

    numa_nodes: tuple[NumaNode, ...]
    devices: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, node_name: str, profile: str | None, cpus: int, memory: int) -> MachineInfo:
        """Split the node's CPUs and memory evenly over the NUMA nodes its GPUs sit on."""
        gpus = profiles.load(profile).gpus if profile else ()
        ids = sorted({g.numa_node for g in gpus} | {0})
        per_cpu, per_mem = cpus // len(ids), memory // len(ids)
        nodes = tuple(
            NumaNode(
                i, per_cpu, per_mem, {j: LOCAL_DISTANCE if i == j else REMOTE_DISTANCE for j in ids}
            )
            for i in ids
        )
        devices = {profiles.gpu_uuid(node_name, g.index): g.numa_node for g in gpus}
        return cls(nodes, devices)

    @classmethod
    def load(cls, path: Path) -> MachineInfo | None:
        if not path.exists():
            return None
        data = yaml.safe_load(path.read_text()) or {}
        nodes = tuple(
            NumaNode(
                int(n["id"]),
                int(n["cpus"]),
                int(n["memory"]),
                {int(k): int(v) for k, v in (n.get("distances") or {}).items()},
            )
            for n in data.get("numaNodes") or []
        )
        return cls(nodes, {str(k): int(v) for k, v in (data.get("devices") or {}).items()})

    def to_yaml(self) -> str:
        return yaml.safe_dump(
            {"numaNodes": [asdict(n) for n in self.numa_nodes], "devices": self.devices},
            sort_keys=False,
        )


def device_numa(device_id: str, machine: MachineInfo) -> int | None:
    """The NUMA node of a device ID (a replica ``<uuid>::<n>`` is its GPU's)."""
    return machine.devices.get(device_id.split("::", 1)[0])


# -- what a container asks for --------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """One container's NUMA node and the CPUs/memory pinned there (0: shared pool)."""

    numa: int
    cpus: int = 0
    memory: int = 0


def _quantities(container: Obj, key: str) -> dict[str, Any]:
    return dict(((container.get("resources") or {}).get(key)) or {})


def pinned(pod: Obj, container: Obj, config: KubeletConfig) -> tuple[int, int]:
    """(exclusive CPUs, NUMA-bound memory bytes) the static CPU/memory managers give."""
    if pod_qos(pod) != GUARANTEED:
        return 0, 0
    requests = {**_quantities(container, "limits"), **_quantities(container, "requests")}
    cpus = 0
    if config.cpu_manager_policy == "static" and "cpu" in requests:
        value = parse_quantity(requests["cpu"])
        cpus = int(value) if value == int(value) else 0
    memory = 0
    if config.memory_manager_policy == "Static" and "memory" in requests:
        memory = math.ceil(parse_quantity(requests["memory"]))
    return cpus, memory


# -- the Topology Manager -------------------------------------------------------------------


class TopologyManager:
    """Admission-time NUMA decisions for one node, kept per pod until it is gone."""

    def __init__(self, config: KubeletConfig, machine: MachineInfo | None) -> None:
        self.config = config
        self.machine = machine
        self.assignments: dict[str, dict[str, Assignment]] = {}  # pod key -> container

    @classmethod
    def load(cls, kubelet_root: Path) -> TopologyManager:
        return cls(
            KubeletConfig.load(kubelet_root / KUBELET_CONFIG),
            MachineInfo.load(kubelet_root / MACHINE_INFO),
        )

    @property
    def enabled(self) -> bool:
        return self.config.topology_manager_policy == SINGLE_NUMA_NODE and self.machine is not None

    def free_cpu_memory(self, exclude: str | None = None) -> dict[int, list[int]]:
        """NUMA id -> [free exclusive CPUs, free memory] after the pods admitted so far."""
        assert self.machine is not None
        free = {n.id: [n.cpus, n.memory] for n in self.machine.numa_nodes}
        for key, containers in self.assignments.items():
            if key == exclude:
                continue
            for a in containers.values():
                free[a.numa][0] -= a.cpus
                free[a.numa][1] -= a.memory
        return free

    def Admit(
        self,
        pod: Obj,
        needs: Sequence[policy.ContainerNeed],
        free_devices: Mapping[str, Iterable[str]],
    ) -> dict[str, Assignment]:
        """Pick a NUMA node for each container in ``needs`` (or one for the pod) and
        remember it; raise TopologyAffinityError when none holds everything.

        ``free_devices``: resource -> the healthy device IDs no other pod holds.
        """
        key = policy.pod_key(pod)
        if not self.enabled or not needs:
            return {}
        if key in self.assignments:
            return self.assignments[key]
        assert self.machine is not None
        containers = {
            c["name"]: c
            for c in [
                *((pod.get("spec") or {}).get("initContainers") or []),
                *((pod.get("spec") or {}).get("containers") or []),
            ]
        }
        devices = {
            r: [d for d in ids if device_numa(d, self.machine) is not None]
            for r, ids in free_devices.items()
        }
        free = self.free_cpu_memory(exclude=key)
        wants = [(n.name, n.resources, pinned(pod, containers[n.name], self.config)) for n in needs]
        if self.config.topology_manager_scope == POD_SCOPE:
            wants = [("", pod_effective(needs), _sum_pinned(w[2] for w in wants))]
        chosen: dict[str, Assignment] = {}
        for name, resources, (cpus, memory) in wants:
            numa = self._best_hint(resources, cpus, memory, devices, free)
            if numa is None:
                raise TopologyAffinityError()
            for r, n in resources.items():
                on_numa = [d for d in devices.get(r, []) if device_numa(d, self.machine) == numa]
                taken = set(on_numa[:n])
                devices[r] = [d for d in devices.get(r, []) if d not in taken]
            free[numa][0] -= cpus
            free[numa][1] -= memory
            chosen[name] = Assignment(numa, cpus, memory)
        if "" in chosen:  # pod scope: every container on the pod's NUMA node
            chosen = {n.name: chosen[""] for n in needs}
        self.assignments[key] = chosen
        return chosen

    def _best_hint(
        self,
        resources: Mapping[str, int],
        cpus: int,
        memory: int,
        devices: Mapping[str, Sequence[str]],
        free: Mapping[int, list[int]],
    ) -> int | None:
        """Merge the providers' single-NUMA hints: the lowest NUMA id every one accepts."""
        assert self.machine is not None
        for numa in sorted(n.id for n in self.machine.numa_nodes):
            fits_devices = all(
                sum(1 for d in devices.get(r, []) if device_numa(d, self.machine) == numa) >= n
                for r, n in resources.items()
            )
            if fits_devices and free[numa][0] >= cpus and free[numa][1] >= memory:
                return numa
        return None

    def Aligned(
        self, pod_key: str, container: str, resource: str, available: Sequence[str], n: int
    ) -> list[str]:
        """filterByAffinity: the available devices on the container's NUMA node (all of
        them when the container has no NUMA node)."""
        a = self.assignments.get(pod_key, {}).get(container)
        if a is None or self.machine is None:
            return list(available)
        aligned = [d for d in available if device_numa(d, self.machine) == a.numa]
        if len(aligned) < n:
            raise TopologyAffinityError()
        return aligned

    def annotations(self, pod_key: str) -> dict[str, str]:
        containers = self.assignments.get(pod_key)
        if not containers:
            return {}
        return {AFFINITY_ANNOTATION: encode(containers)}

    def adopt(self, pods: Iterable[Obj]) -> None:
        """After a restart: take over the choices recorded on the active pods."""
        for p in pods:
            key = policy.pod_key(p)
            if key not in self.assignments and not policy.is_terminal(p) and decode(p):
                self.assignments[key] = decode(p)

    def forget(self, pod_key: str) -> None:
        self.assignments.pop(pod_key, None)


def pod_effective(needs: Sequence[policy.ContainerNeed]) -> dict[str, int]:
    """GetPodEffectiveRequest over device counts: max(sum of app containers, each init)."""
    out: dict[str, int] = {}
    for n in needs:
        if not n.init:
            for r, v in n.resources.items():
                out[r] = out.get(r, 0) + v
    for n in needs:
        if n.init:
            for r, v in n.resources.items():
                out[r] = max(out.get(r, 0), v)
    return out


def _sum_pinned(items: Iterable[tuple[int, int]]) -> tuple[int, int]:
    items = list(items)
    return sum(c for c, _ in items), sum(m for _, m in items)


def encode(containers: Mapping[str, Assignment]) -> str:
    return json.dumps({c: asdict(a) for c, a in containers.items()}, sort_keys=True)


def decode(pod: Obj) -> dict[str, Assignment]:
    """The assignments recorded on a pod (empty if none or unreadable)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(AFFINITY_ANNOTATION)
    if not raw:
        return {}
    try:
        return {c: Assignment(**a) for c, a in json.loads(raw).items()}
    except (ValueError, TypeError):
        return {}
