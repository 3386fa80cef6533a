"""A node as Volcano's session sees it: Idle, Used, Releasing, Pipelined.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/api/node_info.go``: ``NewNodeInfo``
(allocatable from ``status.allocatable``), ``AddTask`` / ``RemoveTask`` / ``UpdateTask``
(a Releasing task still uses the node but its resources come back; a Pipelined task only
books ``Pipelined``; a Binding task must fit ``Idle``), ``FutureIdle`` = Idle + Releasing
- Pipelined. ``setNodeState`` ignores the node's conditions ("because of
taint/toleration"): a NotReady node is in the session and its GPUs count in the total
(proportion's deserved and realCapability, overcommit's idle); what keeps pods off it
are its taints (``node.kubernetes.io/not-ready``, ``unreachable``) and
``spec.unschedulable``, which the predicates check.

Lab differences: no oversubscription, revocable zones, shared-device registries (the
HAMi vGPU resources are plain scalars here) or NUMA information.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.volcano.scheduler.api.job_info import TaskInfo, TaskStatus
from gpulab.volcano.scheduler.api.resource_info import Resource

Obj = Mapping[str, Any]


class NodeError(Exception):
    pass


@dataclass(eq=False)  # one object per node per session, compared by identity
class NodeInfo:
    name: str
    node: Obj
    allocatable: Resource
    idle: Resource
    used: Resource = field(default_factory=Resource)
    releasing: Resource = field(default_factory=Resource)
    pipelined: Resource = field(default_factory=Resource)
    tasks: dict[str, TaskInfo] = field(default_factory=dict)  # by pod key

    @classmethod
    def of(cls, node: Obj) -> NodeInfo:
        alloc = Resource.from_list((node.get("status") or {}).get("allocatable"))
        name = str((node.get("metadata") or {}).get("name"))
        return cls(name, node, alloc, alloc.clone())

    def future_idle(self) -> Resource:
        return self.idle.clone().add(self.releasing).sub(self.pipelined)

    def add_task(self, task: TaskInfo) -> None:
        if task.node_name and task.node_name != self.name:
            raise NodeError(f"task <{task.key}> already on different node <{task.node_name}>")
        if task.key in self.tasks:
            raise NodeError(f"task <{task.key}> already on node <{self.name}>")
        held = task.clone()
        if held.status == TaskStatus.RELEASING:
            self.idle.sub(held.resreq)
            self.releasing.add(held.resreq)
            self.used.add(held.resreq)
        elif held.status == TaskStatus.PIPELINED:
            self.pipelined.add(held.resreq)
        else:
            if held.status == TaskStatus.BINDING:
                fits, names = held.resreq.less_equal_with_names(self.idle)
                if not fits:
                    raise NodeError(
                        f"node {self.name} resources {names} are not enough to put task "
                        f"<{held.key}>, idle: {self.idle}, req: {held.resreq}"
                    )
            self.idle.sub(held.resreq)
            self.used.add(held.resreq)
        task.node_name = held.node_name = self.name
        self.tasks[held.key] = held

    def remove_task(self, task: TaskInfo) -> None:
        held = self.tasks.pop(task.key, None)
        if held is None:
            return
        if held.status == TaskStatus.RELEASING:
            self.releasing.sub(held.resreq)
            self.idle.add(held.resreq)
            self.used.sub(held.resreq)
        elif held.status == TaskStatus.PIPELINED:
            self.pipelined.sub(held.resreq)
        else:
            self.idle.add(held.resreq)
            self.used.sub(held.resreq)

    def update_task(self, task: TaskInfo) -> None:
        self.remove_task(task)
        self.add_task(task)

    def pods(self) -> list[Obj]:
        return [t.pod for t in self.tasks.values()]

    def clone(self) -> NodeInfo:
        info = NodeInfo.of(self.node)
        for task in self.tasks.values():
            info.add_task(task.clone())
        return info

    def __str__(self) -> str:
        return f"Node {self.name}: idle {self.idle}, used {self.used}"
