"""SchedulingGates: a pod with ``spec.schedulingGates`` waits outside activeQ.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/schedulinggates/
scheduling_gates.go``: a PreEnqueue plugin (the queue runs it before a pod enters activeQ
or backoffQ) that answers UnschedulableAndUnresolvable "waiting for scheduling gates:
[name ...]" while any gate is left; ``EventsToRegister``: the pod's own
UpdatePodSchedulingGatesEliminated, which its hint answers Queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.events import (
    POD,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    QueueingHint,
)
from gpulab.framework.interface import SUCCESS, Status, unresolvable
from gpulab.framework.snapshot import pod_uid

NAME = "SchedulingGates"

Obj = Mapping[str, Any]


class SchedulingGates:
    name = NAME

    def PreEnqueue(self, pod: Obj) -> Status:
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        if not gates:
            return SUCCESS
        names = " ".join(str(g.get("name")) for g in gates)
        return unresolvable(f"waiting for scheduling gates: [{names}]")

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(
                ClusterEvent(POD, ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED),
                is_schedulable_after_gates_eliminated,
            )
        ]


def is_schedulable_after_gates_eliminated(
    pod: Obj, old: Obj | None, new: Obj | None
) -> QueueingHint:
    assert new is not None
    return QueueingHint.QUEUE if pod_uid(new) == pod_uid(pod) else QueueingHint.QUEUE_SKIP


def new(args: Mapping[str, Any], handle: Any) -> SchedulingGates:
    return SchedulingGates()
