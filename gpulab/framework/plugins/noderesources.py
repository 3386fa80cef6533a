"""NodeResourcesFit: does the node have room for the pod's requests; score by what is left.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/noderesources/fit.go``
(``PreFilter`` computes the pod's requests once; ``Filter`` calls ``fitsRequest``: pod
count, cpu, memory, ephemeral-storage and every extended resource such as
``nvidia.com/gpu``, each missing one a reason "Insufficient <resource>", Unresolvable when
the request exceeds the node's allocatable; ``NodeResourcesFitArgs`` ``ignoredResources``,
``ignoredResourceGroups``, ``scoringStrategy``) with ``least_allocated.go`` /
``most_allocated.go`` scoring over ``resource_allocation.go`` (pods that ask nothing
count as 100m / 200MB when scoring).

Lab difference: the ``RequestedToCapacityRatio`` strategy is not implemented.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.interface import (
    MAX_NODE_SCORE,
    NODE,
    POD,
    SUCCESS,
    ActionType,
    ClusterEvent,
    Code,
    CycleState,
    PreFilterResult,
    Status,
)
from gpulab.framework.predicates import fits_request
from gpulab.framework.resources import CPU, MEMORY, Resource, pod_non_zero_request, pod_request
from gpulab.framework.runtime import FrameworkError
from gpulab.framework.snapshot import NodeInfo

NAME = "NodeResourcesFit"
PRE_FILTER_KEY = "PreFilter" + NAME
LEAST_ALLOCATED, MOST_ALLOCATED = "LeastAllocated", "MostAllocated"
DEFAULT_RESOURCES = ({"name": CPU, "weight": 1}, {"name": MEMORY, "weight": 1})

Obj = Mapping[str, Any]


def least_requested_score(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def most_requested_score(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    # a node over-committed by non-zero defaults still counts as full
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


class Fit:
    name = NAME

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.ignored_resources = frozenset(args.get("ignoredResources") or ())
        self.ignored_groups = frozenset(args.get("ignoredResourceGroups") or ())
        strategy = args.get("scoringStrategy") or {}
        self.strategy = strategy.get("type") or LEAST_ALLOCATED
        if self.strategy not in (LEAST_ALLOCATED, MOST_ALLOCATED):
            raise FrameworkError(
                f"{NAME}: scoringStrategy.type {self.strategy!r} is not supported; "
                f"use {LEAST_ALLOCATED} or {MOST_ALLOCATED}"
            )
        self.resources = [
            (r["name"], int(r.get("weight") or 1))
            for r in strategy.get("resources") or DEFAULT_RESOURCES
        ]

    def EventsToRegister(self) -> list[ClusterEvent]:
        return [
            ClusterEvent(POD, ActionType.DELETE | ActionType.UPDATE_POD_SCALE_DOWN),
            ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE),
        ]

    def PreFilter(
        self, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status]:
        state.write(PRE_FILTER_KEY, pod_request(pod))
        return None, SUCCESS

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        request: Resource = state.get(PRE_FILTER_KEY) or pod_request(pod)
        missing = fits_request(request, node, self.ignored_resources, self.ignored_groups)
        if not missing:
            return SUCCESS
        code = (
            Code.UNSCHEDULABLE_AND_UNRESOLVABLE
            if any(m.unresolvable for m in missing)
            else Code.UNSCHEDULABLE
        )
        return Status.of(code, *(m.reason for m in missing))

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        """The weighted mean over the configured resources the node has."""
        request = pod_request(pod)
        non_zero = pod_non_zero_request(pod)
        total = weights = 0
        for resource, weight in self.resources:
            capacity = node.allocatable.get(resource)
            if capacity == 0:
                continue
            if resource in (CPU, MEMORY):
                requested = node.non_zero_requested.get(resource) + non_zero.get(resource)
            else:
                requested = node.requested.get(resource) + request.get(resource)
            score = (
                least_requested_score(requested, capacity)
                if self.strategy == LEAST_ALLOCATED
                else most_requested_score(requested, capacity)
            )
            total += score * weight
            weights += weight
        return (total // weights if weights else 0), SUCCESS


def new(args: Mapping[str, Any], handle: Any) -> Fit:
    return Fit(args)
