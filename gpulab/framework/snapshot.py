"""The scheduler's picture of the cluster: nodes, the pods on them, what is left.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/types.go`` (``PodInfo``,
``NodeInfo`` with ``Requested``, ``NonZeroRequested``, ``Allocatable``, ``AddPod``,
``RemovePod``) and ``pkg/scheduler/backend/cache/snapshot.go`` (``Snapshot``: the
NodeInfos one scheduling cycle reads, unchanged while it runs).

A stable, reusable part (the Volcano chapter builds its Session from it):

    snapshot = new_snapshot(nodes, pods)      # pure: node and pod JSON dicts
    info = snapshot.get("gpu-a100")           # NodeInfo
    info.requested.scalar["nvidia.com/gpu"]   # what the pods on it asked for
    info.add_pod(PodInfo.of(pod))             # an in-memory placement (assume)

Only pods that hold a node count: bound (``spec.nodeName``) and not finished
(``Succeeded``/``Failed``), as the scheduler's informer sees them (its field selector
leaves finished pods out).

Lab difference: upstream keeps NodeInfos incrementally (generation numbers, a node
tree spreading zones); here a snapshot is rebuilt from the cache each cycle, nodes in
name order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.framework.resources import Resource, pod_non_zero_request, pod_request

Obj = Mapping[str, Any]
TERMINAL_PHASES = ("Succeeded", "Failed")


def pod_key(pod: Obj) -> str:
    """``namespace/name``."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def pod_uid(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("uid") or pod_key(pod))


def node_name_of(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def holds_node(pod: Obj) -> bool:
    """A pod whose requests count against its node: bound and not finished."""
    return bool(node_name_of(pod)) and not is_terminal(pod)


@dataclass(frozen=True)
class PodInfo:
    """A pod with its requests worked out once (framework.PodInfo)."""

    pod: Obj
    request: Resource
    non_zero_request: Resource

    @classmethod
    def of(cls, pod: Obj) -> PodInfo:
        return cls(pod, pod_request(pod), pod_non_zero_request(pod))

    @property
    def key(self) -> str:
        return pod_key(self.pod)

    @property
    def uid(self) -> str:
        return pod_uid(self.pod)


@dataclass
class NodeInfo:
    """One node and the pods on it (framework.NodeInfo)."""

    node: Obj
    pods: list[PodInfo] = field(default_factory=list)
    requested: Resource = field(default_factory=Resource)
    non_zero_requested: Resource = field(default_factory=Resource)
    allocatable: Resource = field(default_factory=Resource)

    @classmethod
    def of(cls, node: Obj, pods: Iterable[PodInfo] = ()) -> NodeInfo:
        status = node.get("status") or {}
        info = cls(node, allocatable=Resource.from_list(status.get("allocatable")))
        for p in pods:
            info.add_pod(p)
        return info

    @property
    def name(self) -> str:
        return str((self.node.get("metadata") or {}).get("name"))

    def add_pod(self, pod: PodInfo) -> None:
        self.pods.append(pod)
        self.requested.add(pod.request)
        self.non_zero_requested.add(pod.non_zero_request)

    def remove_pod(self, uid: str) -> bool:
        for i, p in enumerate(self.pods):
            if p.uid == uid:
                del self.pods[i]
                self.requested.sub(p.request)
                self.non_zero_requested.sub(p.non_zero_request)
                return True
        return False

    def clone(self) -> NodeInfo:
        return NodeInfo(
            self.node,
            list(self.pods),
            self.requested.clone(),
            self.non_zero_requested.clone(),
            self.allocatable.clone(),
        )


@dataclass
class Snapshot:
    """The NodeInfos of one scheduling cycle, by node name (a SharedLister)."""

    node_infos: dict[str, NodeInfo] = field(default_factory=dict)

    def list(self) -> list[NodeInfo]:
        return list(self.node_infos.values())

    def get(self, name: str) -> NodeInfo | None:
        return self.node_infos.get(name)

    def __len__(self) -> int:
        return len(self.node_infos)

    def __iter__(self) -> Iterator[NodeInfo]:
        return iter(self.node_infos.values())

    def clone(self) -> Snapshot:
        return Snapshot({name: info.clone() for name, info in self.node_infos.items()})


def new_snapshot(nodes: Iterable[Obj], pods: Iterable[Obj | PodInfo]) -> Snapshot:
    """A Snapshot of ``nodes`` with every pod that holds one of them (pure)."""
    by_node: dict[str, list[PodInfo]] = {}
    for p in pods:
        info = p if isinstance(p, PodInfo) else PodInfo.of(p)
        if holds_node(info.pod):
            by_node.setdefault(node_name_of(info.pod), []).append(info)
    ordered = sorted(nodes, key=lambda n: str((n.get("metadata") or {}).get("name")))
    infos = {}
    for node in ordered:
        name = str((node.get("metadata") or {}).get("name"))
        infos[name] = NodeInfo.of(node, by_node.get(name, ()))
    return Snapshot(infos)
