"""NodeAffinity: ``spec.nodeSelector`` and required node affinity filter; preferred terms
score.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go``
(``PreFilter`` skips pods without either and narrows the nodes to those named by
``metadata.name In`` field terms; Filter reason "node(s) didn't match Pod's node
affinity/selector"; ``NodeAffinityArgs.addedAffinity`` applies to every pod of the
profile; Score sums matching preferred weights, NormalizeScore scales to 0..100;
``EventsToRegister``: Node Add|UpdateNodeLabel with ``isSchedulableAfterNodeChange`` -
Queue when an added node matches the pod's required affinity and the profile's, or an
updated one starts matching).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.events import (
    NODE,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    QueueingHint,
)
from gpulab.framework.interface import (
    MAX_NODE_SCORE,
    SUCCESS,
    Code,
    CycleState,
    NodeScore,
    PreFilterResult,
    Status,
    unresolvable,
)
from gpulab.framework.plugins.helper import default_normalize_score
from gpulab.framework.predicates import (
    node_affinity_matches,
    node_selector_matches,
    preferred_affinity_score,
    preferred_node_affinity,
    required_node_affinity,
)
from gpulab.framework.snapshot import NodeInfo

NAME = "NodeAffinity"
ERR_REASON_POD = "node(s) didn't match Pod's node affinity/selector"
ERR_REASON_ENFORCED = "node(s) didn't match scheduler-enforced node affinity"
ERR_REASON_CONFLICT = "pod affinity terms conflict"

Obj = Mapping[str, Any]


def _term_node_names(term: Obj) -> set[str] | None:
    """Node names a term pins with ``metadata.name In``; None if it pins none."""
    names: set[str] | None = None
    for req in term.get("matchFields") or []:
        if req.get("key") == "metadata.name" and req.get("operator") == "In":
            values = set(req.get("values") or [])
            names = values if names is None else names & values
    return names


class NodeAffinity:
    name = NAME

    def __init__(self, args: Mapping[str, Any]) -> None:
        added = args.get("addedAffinity") or {}
        self.added_required = added.get("requiredDuringSchedulingIgnoredDuringExecution")
        self.added_preferred = list(
            added.get("preferredDuringSchedulingIgnoredDuringExecution") or []
        )

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        return [
            ClusterEventWithHint(
                ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_LABEL),
                self.is_schedulable_after_node_change,
            )
        ]

    def is_schedulable_after_node_change(
        self, pod: Obj, old: Obj | None, new: Obj | None
    ) -> QueueingHint:
        assert new is not None
        if self.added_required is not None and not node_selector_matches(new, self.added_required):
            return QueueingHint.QUEUE_SKIP
        if not node_affinity_matches(pod, new):
            return QueueingHint.QUEUE_SKIP
        if old is None:
            return QueueingHint.QUEUE
        return QueueingHint.QUEUE_SKIP if node_affinity_matches(pod, old) else QueueingHint.QUEUE

    def PreFilter(
        self, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status]:
        required = required_node_affinity(pod)
        if (
            required is None
            and self.added_required is None
            and not (pod.get("spec") or {}).get("nodeSelector")
        ):
            return None, Status.of(Code.SKIP)
        terms = (required or {}).get("nodeSelectorTerms") or []
        if not terms:
            return None, SUCCESS
        names: set[str] = set()
        for term in terms:
            pinned = _term_node_names(term)
            if pinned is None:
                return None, SUCCESS  # a term without a name pin may match any node
            names |= pinned
        if not names:
            return None, unresolvable(ERR_REASON_CONFLICT)
        return PreFilterResult(frozenset(names)), SUCCESS

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        if self.added_required is not None and not node_selector_matches(
            node.node, self.added_required
        ):
            return unresolvable(ERR_REASON_ENFORCED)
        return SUCCESS if node_affinity_matches(pod, node.node) else unresolvable(ERR_REASON_POD)

    def PreScore(self, state: CycleState, pod: Obj, nodes: list[NodeInfo]) -> Status:
        """Skip Score when neither the pod nor the profile prefers anything."""
        if not preferred_node_affinity(pod) and not self.added_preferred:
            return Status.of(Code.SKIP)
        return SUCCESS

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        added = {
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": self.added_preferred
                    }
                }
            }
        }
        return preferred_affinity_score(pod, node.node) + preferred_affinity_score(
            added, node.node
        ), SUCCESS

    def NormalizeScore(self, state: CycleState, pod: Obj, scores: list[NodeScore]) -> Status:
        return default_normalize_score(MAX_NODE_SCORE, False, scores)


def new(args: Mapping[str, Any], handle: Any) -> NodeAffinity:
    return NodeAffinity(args)
