"""TaintToleration: NoSchedule/NoExecute taints keep pods that do not tolerate them
off; fewer untolerated PreferNoSchedule taints score higher.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go``
(Filter reason "node(s) had untolerated taint(s)"; Score counts intolerable
PreferNoSchedule taints and NormalizeScore reverses it to 0..100; ``EventsToRegister``:
Node Add|UpdateNodeTaint with ``isSchedulableAfterNodeChange`` - Queue only when the node
went from untolerated to tolerated - and Pod UpdatePodToleration with
``isSchedulableAfterPodTolerationChange`` - Queue for the pod's own new toleration).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.events import (
    NODE,
    POD,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    QueueingHint,
)
from gpulab.framework.interface import (
    MAX_NODE_SCORE,
    SUCCESS,
    CycleState,
    NodeScore,
    Status,
    unresolvable,
)
from gpulab.framework.plugins.helper import default_normalize_score
from gpulab.framework.predicates import count_intolerable_prefer_no_schedule, untolerated_taint
from gpulab.framework.snapshot import NodeInfo, pod_uid

NAME = "TaintToleration"
ERR_REASON = "node(s) had untolerated taint(s)"

Obj = Mapping[str, Any]


class TaintToleration:
    name = NAME

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(
                ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_TAINT),
                is_schedulable_after_node_change,
            ),
            ClusterEventWithHint(
                ClusterEvent(POD, ActionType.UPDATE_POD_TOLERATION),
                is_schedulable_after_pod_toleration_change,
            ),
        ]

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        return SUCCESS if untolerated_taint(pod, node.node) is None else unresolvable(ERR_REASON)

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        return count_intolerable_prefer_no_schedule(pod, node.node), SUCCESS

    def NormalizeScore(self, state: CycleState, pod: Obj, scores: list[NodeScore]) -> Status:
        return default_normalize_score(MAX_NODE_SCORE, True, scores)


def is_schedulable_after_node_change(pod: Obj, old: Obj | None, new: Obj | None) -> QueueingHint:
    assert new is not None
    was_untolerated = old is None or untolerated_taint(pod, old) is not None
    if was_untolerated and untolerated_taint(pod, new) is None:
        return QueueingHint.QUEUE
    return QueueingHint.QUEUE_SKIP


def is_schedulable_after_pod_toleration_change(
    pod: Obj, old: Obj | None, new: Obj | None
) -> QueueingHint:
    assert new is not None
    return QueueingHint.QUEUE if pod_uid(new) == pod_uid(pod) else QueueingHint.QUEUE_SKIP


def new(args: Mapping[str, Any], handle: Any) -> TaintToleration:
    return TaintToleration()
