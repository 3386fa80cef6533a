"""NodeName: a pod that names its node fits only there.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/nodename/node_name.go``
(``EventsToRegister``: Node Add, no hint - always Queue).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.events import NODE, ActionType, ClusterEvent, ClusterEventWithHint
from gpulab.framework.interface import SUCCESS, CycleState, Status, unresolvable
from gpulab.framework.predicates import node_name_fits
from gpulab.framework.snapshot import NodeInfo

NAME = "NodeName"
ERR_REASON = "node(s) didn't match the requested node name"


class NodeName:
    name = NAME

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        return [ClusterEventWithHint(ClusterEvent(NODE, ActionType.ADD))]

    def Filter(self, state: CycleState, pod: Mapping[str, Any], node: NodeInfo) -> Status:
        return SUCCESS if node_name_fits(pod, node.node) else unresolvable(ERR_REASON)


def new(args: Mapping[str, Any], handle: Any) -> NodeName:
    return NodeName()
