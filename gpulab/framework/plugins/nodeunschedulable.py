"""NodeUnschedulable: a cordoned node (``spec.unschedulable``) takes only pods that
tolerate ``node.kubernetes.io/unschedulable:NoSchedule``.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/nodeunschedulable``
(``EventsToRegister``: Node Add|UpdateNodeTaint - Queue when the node is added
schedulable or stops being unschedulable - and Pod UpdatePodToleration - Queue when the
pod itself now tolerates the unschedulable taint).
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
from gpulab.framework.interface import SUCCESS, CycleState, Status, unresolvable
from gpulab.framework.predicates import (
    node_unschedulable_fits,
    pod_tolerations,
    tolerations_tolerate_taint,
)
from gpulab.framework.snapshot import NodeInfo, pod_uid

NAME = "NodeUnschedulable"
ERR_REASON_UNSCHEDULABLE = "node(s) were unschedulable"
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


class NodeUnschedulable:
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

    def Filter(self, state: CycleState, pod: Mapping[str, Any], node: NodeInfo) -> Status:
        if node_unschedulable_fits(pod, node.node):
            return SUCCESS
        return unresolvable(ERR_REASON_UNSCHEDULABLE)


def _unschedulable(node: Mapping[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def is_schedulable_after_node_change(
    pod: Mapping[str, Any], old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> QueueingHint:
    assert new is not None
    if not _unschedulable(new) and (old is None or _unschedulable(old)):
        return QueueingHint.QUEUE
    return QueueingHint.QUEUE_SKIP


def is_schedulable_after_pod_toleration_change(
    pod: Mapping[str, Any], old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> QueueingHint:
    assert new is not None
    if pod_uid(new) == pod_uid(pod) and tolerations_tolerate_taint(
        pod_tolerations(new), UNSCHEDULABLE_TAINT
    ):
        return QueueingHint.QUEUE
    return QueueingHint.QUEUE_SKIP


def new(args: Mapping[str, Any], handle: Any) -> NodeUnschedulable:
    return NodeUnschedulable()
