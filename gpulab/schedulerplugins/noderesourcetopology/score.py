"""NodeResourceTopologyMatch's Score: how well the pod sits in the node's NUMA zones.

Mirrors scheduler-plugins v0.35.4-devel ``pkg/noderesourcetopology/score.go`` with
``least_allocated.go``, ``most_allocated.go``, ``balanced_allocation.go`` and
``least_numa.go``:

- a pod that is not Guaranteed scores the maximum everywhere; a node without an NRT
  scores 0; only ``single-numa-node`` nodes are scored by the three resource strategies;
- ``LeastAllocated`` / ``MostAllocated`` / ``BalancedAllocation`` score each NUMA node
  for the requested resources (weights from ``scoringStrategy.resources``, default 1;
  a resource the zone lacks scores 0) and keep the *lowest* non-zero NUMA score
  (``scoreForEachNUMANode``); container scope averages over the containers;
- ``LeastNUMANodes`` (any policy): the fewer NUMA nodes the pod needs - and the closer
  they are (NUMA distances) - the higher: ``100 - n * (100 / maxNUMANodes)`` plus half a
  step when the combination has the minimal average distance.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from gpulab.framework.interface import MAX_NODE_SCORE, MIN_NODE_SCORE
from gpulab.framework.resources import value_of
from gpulab.schedulerplugins.noderesourcetopology.numaresources import (
    NUMANode,
    is_resource_set_suitable,
    pod_effective_request,
    requests_of,
)

Obj = Mapping[str, Any]
LEAST_ALLOCATED, MOST_ALLOCATED = "LeastAllocated", "MostAllocated"
BALANCED_ALLOCATION, LEAST_NUMA_NODES = "BalancedAllocation", "LeastNUMANodes"
STRATEGIES = (LEAST_ALLOCATED, MOST_ALLOCATED, BALANCED_ALLOCATION, LEAST_NUMA_NODES)
MAX_DISTANCE = 255

Weights = Mapping[str, int]
Strategy = Callable[[Mapping[str, Decimal], Mapping[str, Decimal], Weights], int]


def _weight(weights: Weights, name: str) -> int:
    w = weights.get(name, 1)
    return w if w >= 1 else 1


def least_allocated(
    requested: Mapping[str, Decimal], numa: Mapping[str, Decimal], weights: Weights
) -> int:
    total = weight_sum = 0
    for name, want in requested.items():
        have = numa.get(name, Decimal(0))
        score = 0
        if have != 0 and want <= have:
            # Quantity.Value() rounds a fraction up: 500m of cpu is 1
            score = (value_of(have) - value_of(want)) * MAX_NODE_SCORE // value_of(have)
        total += score * _weight(weights, name)
        weight_sum += _weight(weights, name)
    return total // weight_sum if weight_sum else 0


def most_allocated(
    requested: Mapping[str, Decimal], numa: Mapping[str, Decimal], weights: Weights
) -> int:
    total = weight_sum = 0
    for name, want in requested.items():
        have = numa.get(name, Decimal(0))
        score = 0
        if have != 0 and want <= have:
            score = value_of(want) * MAX_NODE_SCORE // value_of(have)
        total += score * _weight(weights, name)
        weight_sum += _weight(weights, name)
    return total // weight_sum if weight_sum else 0


def balanced_allocation(
    requested: Mapping[str, Decimal], numa: Mapping[str, Decimal], weights: Weights
) -> int:
    fractions = []
    for name, want in requested.items():
        have = numa.get(name, Decimal(0))
        fraction = 1.0 if value_of(have) == 0 else value_of(want) / value_of(have)
        if fraction > 1:
            return 0
        fractions.append(fraction)
    variance = statistics.variance(fractions) if len(fractions) > 1 else 0.0
    return int((1 - variance) * MAX_NODE_SCORE)


FUNCTIONS: dict[str, Strategy] = {
    LEAST_ALLOCATED: least_allocated,
    MOST_ALLOCATED: most_allocated,
    BALANCED_ALLOCATION: balanced_allocation,
}


def numa_scores(
    requested: Mapping[str, Decimal], numa_nodes: list[NUMANode], fn: Strategy, weights: Weights
) -> dict[int, int]:
    """Each NUMA node's score for ``requested`` (by NUMA id)."""
    return {numa.id: fn(requested, numa.resources, weights) for numa in numa_nodes}


def score_for_each_numa_node(
    requested: Mapping[str, Decimal], numa_nodes: list[NUMANode], fn: Strategy, weights: Weights
) -> int:
    """The lowest non-zero NUMA score (a zero NUMA node would not be picked by kubelet)."""
    lowest = 0
    for s in numa_scores(requested, numa_nodes, fn, weights).values():
        if lowest == 0 or (s != 0 and s < lowest):
            lowest = s
    return lowest


def pod_scope_score(pod: Obj, numa_nodes: list[NUMANode], fn: Strategy, weights: Weights) -> int:
    return score_for_each_numa_node(pod_effective_request(pod), numa_nodes, fn, weights)


def container_scope_score(
    pod: Obj, numa_nodes: list[NUMANode], fn: Strategy, weights: Weights
) -> int:
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    scores = [score_for_each_numa_node(requests_of(c), numa_nodes, fn, weights) for c in containers]
    return int(statistics.mean(scores)) if scores else 0


# -- LeastNUMANodes -------------------------------------------------------------------------


def _avg_distance(numa_nodes: list[NUMANode], combo: tuple[int, ...]) -> float:
    if not combo:
        return MAX_DISTANCE
    total = 0
    for a in combo:
        for b in combo:
            total += numa_nodes[a].costs.get(numa_nodes[b].id, MAX_DISTANCE)
    return total / (len(combo) * len(combo))


def numa_nodes_required(
    qos: str, numa_nodes: list[NUMANode], resources: Mapping[str, Decimal]
) -> tuple[list[int] | None, bool]:
    """The smallest set of NUMA nodes (ids) that holds ``resources``, preferring the
    closest; and whether it has the minimal average distance among its size."""
    for size in range(1, len(numa_nodes) + 1):
        combos = list(itertools.combinations(range(len(numa_nodes)), size))
        min_avg = min(_avg_distance(numa_nodes, c) for c in combos)
        best, best_distance = None, 256.0
        for combo in combos:
            if not all(name in numa_nodes[i].resources for i in combo for name in resources):
                continue
            merged: dict[str, Decimal] = {}
            for i in combo:
                for name, q in numa_nodes[i].resources.items():
                    merged[name] = merged.get(name, Decimal(0)) + q
            fits = all(
                q == 0 or is_resource_set_suitable(qos, name, q, merged.get(name, Decimal(0)))
                for name, q in resources.items()
            )
            if not fits:
                continue
            distance = _avg_distance(numa_nodes, combo)
            if distance == min_avg:
                return [numa_nodes[i].id for i in combo], True
            if distance < best_distance:
                best, best_distance = combo, distance
        if best is not None:
            return [numa_nodes[i].id for i in best], False
    return None, False


def normalize_least_numa(count: int, is_min_distance: bool, max_numa_nodes: int) -> int:
    step = MAX_NODE_SCORE // max_numa_nodes
    score = MAX_NODE_SCORE - count * step
    return score + step // 2 if is_min_distance else score


def _only_non_numa(numa_nodes: list[NUMANode], resources: Mapping[str, Decimal]) -> bool:
    return not any(name in n.resources for name in resources for n in numa_nodes)


def least_numa_pod_scope(pod: Obj, qos: str, numa_nodes: list[NUMANode], max_numa: int) -> int:
    resources = pod_effective_request(pod)
    if _only_non_numa(numa_nodes, resources):
        return MAX_NODE_SCORE
    nodes, is_min = numa_nodes_required(qos, numa_nodes, resources)
    if nodes is None:
        return MIN_NODE_SCORE
    return normalize_least_numa(len(nodes), is_min, max_numa)


def least_numa_container_scope(
    pod: Obj, qos: str, numa_nodes: list[NUMANode], max_numa: int
) -> int:
    spec = pod.get("spec") or {}
    most, all_min = 0, True
    nodes_left = [n.copy() for n in numa_nodes]
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        reqs = requests_of(c)
        if _only_non_numa(nodes_left, reqs):
            continue
        nodes, is_min = numa_nodes_required(qos, nodes_left, reqs)
        if nodes is None:
            return MIN_NODE_SCORE
        all_min = all_min and is_min
        most = max(most, len(nodes))
        _subtract_from_numas(reqs, nodes_left, nodes)
    if most == 0:
        return MAX_NODE_SCORE
    return normalize_least_numa(most, all_min, max_numa)


def _subtract_from_numas(
    requests: Mapping[str, Decimal], numa_nodes: list[NUMANode], ids: list[int]
) -> None:
    """subtractFromNUMAs: take the container's requests from the chosen NUMA nodes in turn."""
    for name, q in requests.items():
        left = q
        for numa in numa_nodes:
            if numa.id not in ids or left == 0 or name not in numa.resources:
                continue
            take = min(left, numa.resources[name])
            numa.resources[name] -= take
            left -= take
