"""NodeResourcesBalancedAllocation: prefer the node whose cpu and memory stay balanced.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/noderesources/
balanced_allocation.go`` over ``resource_allocation.go`` (``useRequested``: actual
requests, no non-zero defaults):

- ``PreScore`` works out the pod's requests for ``NodeResourcesBalancedAllocationArgs``
  ``resources`` (default cpu and memory, weight 1) and Skips a pod that asks for none of
  them (a BestEffort pod would otherwise pile onto one node);
- ``Score``: for each resource the node has, the fraction used (capped at 1); the
  balance is ``(1 - std) * 100`` (for two resources ``std = |f1 - f2| / 2``), computed
  with the pod and without it, and the score rewards the improvement:
  ``50 + (50 + with - without) // 2`` (75 when the pod changes nothing).

Lab difference: no DRA extended resources.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpulab.framework.interface import MAX_NODE_SCORE, SUCCESS, Code, CycleState, Status
from gpulab.framework.plugins.noderesources import (
    DEFAULT_RESOURCES,
    node_allocatable_request,
    pod_resource_requests,
)
from gpulab.framework.snapshot import NodeInfo

NAME = "NodeResourcesBalancedAllocation"
PRE_SCORE_KEY = "PreScore" + NAME

Obj = Mapping[str, Any]


def balanced_resource_score(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    """balancedResourceScore: (1 - the standard deviation of the used fractions) * 100."""
    fractions = [min(r / a, 1.0) for r, a in zip(requested, allocatable, strict=True) if a]
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)


def balanced_resource_scorer(
    requested: Sequence[int], allocated: Sequence[int], allocatable: Sequence[int]
) -> int:
    """balancedResourceScorer: the balance with the pod against the balance without it,
    brought back into [50, 100]."""
    with_pod = balanced_resource_score(requested, allocatable)
    without_pod = balanced_resource_score(allocated, allocatable)
    # both lie in [50, 100], so the sum divided is never negative (// is Go's /)
    return MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without_pod) // 2


class BalancedAllocation:
    name = NAME

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.resources = [r["name"] for r in args.get("resources") or DEFAULT_RESOURCES]

    def PreScore(self, state: CycleState, pod: Obj, nodes: list[NodeInfo]) -> Status:
        requests = pod_resource_requests(pod, self.resources, use_requested=True)
        if not any(requests):
            return Status.of(Code.SKIP)
        state.write(PRE_SCORE_KEY, requests)
        return SUCCESS

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        pod_reqs = state.get(PRE_SCORE_KEY)
        if pod_reqs is None:
            pod_reqs = pod_resource_requests(pod, self.resources, use_requested=True)
            if not any(pod_reqs):
                return 0, SUCCESS
        requested, allocated, allocatable = node_allocatable_request(
            node, self.resources, pod_reqs, use_requested=True
        )
        return balanced_resource_scorer(requested, allocated, allocatable), SUCCESS


def new(args: Mapping[str, Any], handle: Any) -> BalancedAllocation:
    return BalancedAllocation(args)
