"""NodeUnschedulable: a cordoned node (``spec.unschedulable``) takes only pods that
tolerate ``node.kubernetes.io/unschedulable:NoSchedule``.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/nodeunschedulable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.interface import (
    NODE,
    SUCCESS,
    ActionType,
    ClusterEvent,
    CycleState,
    Status,
    unresolvable,
)
from gpulab.framework.predicates import node_unschedulable_fits
from gpulab.framework.snapshot import NodeInfo

NAME = "NodeUnschedulable"
ERR_REASON_UNSCHEDULABLE = "node(s) were unschedulable"


class NodeUnschedulable:
    name = NAME

    def EventsToRegister(self) -> list[ClusterEvent]:
        return [ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_TAINT)]

    def Filter(self, state: CycleState, pod: Mapping[str, Any], node: NodeInfo) -> Status:
        if node_unschedulable_fits(pod, node.node):
            return SUCCESS
        return unresolvable(ERR_REASON_UNSCHEDULABLE)


def new(args: Mapping[str, Any], handle: Any) -> NodeUnschedulable:
    return NodeUnschedulable()
