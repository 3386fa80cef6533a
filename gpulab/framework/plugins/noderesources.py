"""NodeResourcesFit: does the node have room for the pod's requests; score by what is left.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/noderesources/fit.go``
(``PreFilter`` computes the pod's requests once; ``Filter`` calls ``fitsRequest``: pod
count, cpu, memory, ephemeral-storage and every extended resource such as
``nvidia.com/gpu``, each missing one a reason "Insufficient <resource>", Unresolvable when
the request exceeds the node's allocatable; ``NodeResourcesFitArgs`` ``ignoredResources``,
``ignoredResourceGroups``, ``scoringStrategy``; ``EventsToRegister`` with the hints
``isSchedulableAfterPodEvent`` and ``isSchedulableAfterNodeChange``) with
``least_allocated.go`` / ``most_allocated.go`` scoring over ``resource_allocation.go``
(``calculatePodResourceRequestList``, ``calculateNodeAllocatableRequest``: a container
that asks no cpu/memory counts as 100m / 200MB when Fit scores; an extended resource the
pod does not ask for, or one the node lacks, is left out of the weighted mean).
NodeResourcesBalancedAllocation (balancedallocation.py) scores over the same helpers.

Lab differences: the ``RequestedToCapacityRatio`` strategy is not implemented; no DRA
extended resources (DeviceClass events, DRA-backed allocatable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
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
    Code,
    CycleState,
    PreFilterResult,
    Status,
)
from gpulab.framework.predicates import fits_request
from gpulab.framework.resources import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    NON_ZERO_DEFAULTS,
    Resource,
    milli_value_of,
    pod_request,
    pod_requests,
    value_of,
)
from gpulab.framework.runtime import FrameworkError
from gpulab.framework.snapshot import NodeInfo, node_name_of, pod_uid

NAME = "NodeResourcesFit"
PRE_FILTER_KEY = "PreFilter" + NAME
PRE_SCORE_KEY = "PreScore" + NAME
LEAST_ALLOCATED, MOST_ALLOCATED = "LeastAllocated", "MostAllocated"
DEFAULT_RESOURCES = ({"name": CPU, "weight": 1}, {"name": MEMORY, "weight": 1})

Obj = Mapping[str, Any]


# -- resource_allocation.go ----------------------------------------------------------------


def pod_resource_requests(pod: Obj, names: Sequence[str], use_requested: bool) -> list[int]:
    """calculatePodResourceRequestList: the pod's request per scoring resource (cpu in
    millicores); without ``use_requested`` a container's missing cpu/memory request
    counts as the non-zero default."""
    reqs = pod_requests(pod, None if use_requested else NON_ZERO_DEFAULTS)
    zero = Decimal(0)
    return [
        milli_value_of(reqs.get(n, zero)) if n == CPU else value_of(reqs.get(n, zero))
        for n in names
    ]


def _allocatable_and_allocated(node: NodeInfo, name: str, use_requested: bool) -> tuple[int, int]:
    """calculateResourceAllocatableRequest."""
    requested = node.requested if use_requested else node.non_zero_requested
    if name in (CPU, MEMORY):
        return node.allocatable.get(name), requested.get(name)
    if name == EPHEMERAL_STORAGE:
        return node.allocatable.ephemeral_storage, node.requested.ephemeral_storage
    if name in node.allocatable.scalar:
        return node.allocatable.scalar[name], node.requested.scalar.get(name, 0)
    return 0, 0


def node_allocatable_request(
    node: NodeInfo, names: Sequence[str], pod_reqs: Sequence[int], use_requested: bool
) -> tuple[list[int], list[int], list[int]]:
    """calculateNodeAllocatableRequest: per scoring resource (requested with the pod,
    allocated without it, allocatable); all 0 for an extended resource the pod does not
    ask for and for a resource the node does not have."""
    requested, allocated, allocatable = [0] * len(names), [0] * len(names), [0] * len(names)
    for i, name in enumerate(names):
        if pod_reqs[i] == 0 and name not in (CPU, MEMORY, EPHEMERAL_STORAGE):
            continue
        alloc, used = _allocatable_and_allocated(node, name, use_requested)
        if alloc == 0:
            continue
        allocatable[i], allocated[i], requested[i] = alloc, used, used + pod_reqs[i]
    return requested, allocated, allocatable


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

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        """A pod deleted or scaled down may free room; a node added or grown may have
        it (InPlacePodVerticalScaling is GA, hence UpdatePodScaleDown)."""
        return [
            ClusterEventWithHint(
                ClusterEvent(POD, ActionType.DELETE | ActionType.UPDATE_POD_SCALE_DOWN),
                is_schedulable_after_pod_event,
            ),
            ClusterEventWithHint(
                ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE),
                is_schedulable_after_node_change,
            ),
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

    def PreScore(self, state: CycleState, pod: Obj, nodes: list[NodeInfo]) -> Status:
        names = [name for name, _ in self.resources]
        state.write(PRE_SCORE_KEY, pod_resource_requests(pod, names, use_requested=False))
        return SUCCESS

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        """leastResourceScorer / mostResourceScorer: the weighted mean over the scoring
        resources that count for this pod and node."""
        names = [name for name, _ in self.resources]
        pod_reqs = state.get(PRE_SCORE_KEY) or pod_resource_requests(pod, names, False)
        requested, _, allocatable = node_allocatable_request(node, names, pod_reqs, False)
        score_fn = (
            least_requested_score if self.strategy == LEAST_ALLOCATED else most_requested_score
        )
        total = weights = 0
        for i, (_, weight) in enumerate(self.resources):
            if allocatable[i] == 0:
                continue
            total += score_fn(requested[i], allocatable[i]) * weight
            weights += weight
        return (total // weights if weights else 0), SUCCESS


# -- queueing hints ------------------------------------------------------------------------


def is_schedulable_after_pod_event(pod: Obj, old: Obj | None, new: Obj | None) -> QueueingHint:
    """isSchedulableAfterPodEvent: a deleted pod that held (or was nominated to) a node,
    or a pod that got smaller in a resource this pod asks for."""
    if new is None:
        assert old is not None
        held = node_name_of(old) or (old.get("status") or {}).get("nominatedNodeName")
        return QueueingHint.QUEUE if held else QueueingHint.QUEUE_SKIP
    assert old is not None
    if pod_uid(new) == pod_uid(pod):
        return QueueingHint.QUEUE
    if not node_name_of(new):
        return QueueingHint.QUEUE_SKIP
    before, after = pod_request(old), pod_request(new)
    for name, q in pod_requests(pod).items():
        if q and before.get(name) > after.get(name):
            return QueueingHint.QUEUE
    return QueueingHint.QUEUE_SKIP


def is_schedulable_after_node_change(pod: Obj, old: Obj | None, new: Obj | None) -> QueueingHint:
    """isSchedulableAfterNodeChange: the node (empty) would fit the pod, and it is new or
    grew in something the pod asks for (or in pods)."""
    assert new is not None
    if fits_request(pod_request(pod), NodeInfo.of(new)):
        return QueueingHint.QUEUE_SKIP
    if old is None:
        return QueueingHint.QUEUE
    return QueueingHint.QUEUE if _requested_grew(pod, old, new) else QueueingHint.QUEUE_SKIP


def _requested_grew(pod: Obj, old: Obj, new: Obj) -> bool:
    """haveAnyRequestedResourcesIncreased."""
    request = pod_request(pod)
    before = NodeInfo.of(old).allocatable
    after = NodeInfo.of(new).allocatable
    if after.allowed_pod_number > before.allowed_pod_number:
        return True
    if request.is_zero() and not request.scalar:
        return False
    for name in (CPU, MEMORY, EPHEMERAL_STORAGE, *request.scalar):
        if request.get(name) > 0 and after.get(name) > before.get(name):
            return True
    return False


def new(args: Mapping[str, Any], handle: Any) -> Fit:
    return Fit(args)
