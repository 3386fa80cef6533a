"""TaintToleration: NoSchedule/NoExecute taints keep pods that do not tolerate them
off; fewer untolerated PreferNoSchedule taints score higher.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go``
(Filter reason "node(s) had untolerated taint(s)"; Score counts intolerable
PreferNoSchedule taints and NormalizeScore reverses it to 0..100).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.interface import (
    MAX_NODE_SCORE,
    NODE,
    SUCCESS,
    ActionType,
    ClusterEvent,
    CycleState,
    NodeScore,
    Status,
    unresolvable,
)
from gpulab.framework.plugins.helper import default_normalize_score
from gpulab.framework.predicates import count_intolerable_prefer_no_schedule, untolerated_taint
from gpulab.framework.snapshot import NodeInfo

NAME = "TaintToleration"
ERR_REASON = "node(s) had untolerated taint(s)"

Obj = Mapping[str, Any]


class TaintToleration:
    name = NAME

    def EventsToRegister(self) -> list[ClusterEvent]:
        return [ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_TAINT)]

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        return SUCCESS if untolerated_taint(pod, node.node) is None else unresolvable(ERR_REASON)

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        return count_intolerable_prefer_no_schedule(pod, node.node), SUCCESS

    def NormalizeScore(self, state: CycleState, pod: Obj, scores: list[NodeScore]) -> Status:
        return default_normalize_score(MAX_NODE_SCORE, True, scores)


def new(args: Mapping[str, Any], handle: Any) -> TaintToleration:
    return TaintToleration()
