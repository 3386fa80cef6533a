"""Helpers the actions share: a priority queue, predicate and score sweeps, victims.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/util``: ``priority_queue.go``
(``PriorityQueue`` over a less function), ``predicate_helper.go`` (``PredicateNodes`` with
the per-role error cache: a task whose role already failed on a node fails there again
without re-running the predicates), ``scheduler_helper.go``
(``CalculateNumOfFeasibleNodesToFind``, ``PrioritizeNodes``, ``SortNodes``,
``SelectBestNodeAndScore``, ``ValidateVictims``).

Lab differences: nodes are checked in one thread, in name order starting where the
previous task stopped (upstream: 16 goroutines); ties between best nodes go to the first
by name instead of a random one, so runs repeat.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from gpulab.volcano.scheduler.api.job_info import FitErrors, TaskInfo
from gpulab.volcano.scheduler.api.node_info import NodeInfo

T = TypeVar("T")

# options.ServerOpts defaults (cmd/scheduler/app/options)
MIN_NODES_TO_FIND = 100
MIN_PERCENTAGE_OF_NODES_TO_FIND = 5
BASELINE_PERCENTAGE_OF_NODES_TO_FIND = 50


class PriorityQueue(Generic[T]):
    """util.PriorityQueue: pops the item ``less`` puts first; equal items in push order."""

    def __init__(self, less: Callable[[Any, Any], bool]) -> None:
        self._less = less
        self._heap: list[_Item[T]] = []
        self._seq = itertools.count()

    def push(self, item: T) -> None:
        heapq.heappush(self._heap, _Item(item, next(self._seq), self._less))

    def pop(self) -> T:
        return heapq.heappop(self._heap).item

    def empty(self) -> bool:
        return not self._heap

    def __len__(self) -> int:
        return len(self._heap)


class _Item(Generic[T]):
    __slots__ = ("item", "less", "seq")

    def __init__(self, item: T, seq: int, less: Callable[[Any, Any], bool]) -> None:
        self.item, self.seq, self.less = item, seq, less

    def __lt__(self, other: _Item[T]) -> bool:
        if self.less(self.item, other.item):
            return True
        if self.less(other.item, self.item):
            return False
        return self.seq < other.seq


def num_feasible_nodes_to_find(num_all: int) -> int:
    """CalculateNumOfFeasibleNodesToFind with the default options."""
    if num_all <= MIN_NODES_TO_FIND:
        return num_all
    percentage = max(
        BASELINE_PERCENTAGE_OF_NODES_TO_FIND - num_all // 125, MIN_PERCENTAGE_OF_NODES_TO_FIND
    )
    return max(num_all * percentage // 100, MIN_NODES_TO_FIND)


PredicateFn = Callable[[TaskInfo, NodeInfo], None]  # raises FitError (or another error)


class PredicateHelper:
    """util.NewPredicateHelper: predicate sweeps sharing a per-role error cache."""

    def __init__(self) -> None:
        self._error_cache: dict[str, dict[str, Exception]] = {}
        self._next = 0

    def predicate_nodes(
        self,
        task: TaskInfo,
        nodes: list[NodeInfo],
        fn: PredicateFn,
        enable_error_cache: bool = True,
    ) -> tuple[list[NodeInfo], FitErrors]:
        """The nodes ``task`` fits (at most the number to find) and why the others fail."""
        errors = FitErrors()
        if not nodes:
            return [], errors
        # an empty role would share one cache among unrelated pods (volcano issue 3527)
        enable_error_cache = enable_error_cache and bool(task.task_role)
        group = f"{task.job}/{task.task_role}"
        cache = self._error_cache.get(group)
        failed_before = cache is not None
        cache = cache if cache is not None else {}
        want = num_feasible_nodes_to_find(len(nodes))
        found: list[NodeInfo] = []
        start, processed = self._next % len(nodes), 0
        for i in range(len(nodes)):
            node = nodes[(start + i) % len(nodes)]
            processed += 1
            if enable_error_cache and failed_before and node.name in cache:
                errors.set_node_error(node.name, cache[node.name])
                continue
            try:
                fn(task, node)
            except Exception as err:
                cache[node.name] = err
                self._error_cache[group] = cache
                errors.set_node_error(node.name, err)
                continue
            found.append(node)
            if len(found) >= want:
                break
        self._next = start + processed
        return found, errors


ScoreMap = dict[str, float]


def prioritize_nodes(
    task: TaskInfo,
    nodes: list[NodeInfo],
    batch_fn: Callable[[TaskInfo, list[NodeInfo]], ScoreMap],
    map_fn: Callable[[TaskInfo, NodeInfo], float],
) -> dict[float, list[NodeInfo]]:
    """PrioritizeNodes: per node the sum of the plugins' node-order and batch scores,
    grouped by score."""
    batch = batch_fn(task, nodes)
    scores: dict[float, list[NodeInfo]] = {}
    for node in nodes:
        score = map_fn(task, node) + batch.get(node.name, 0.0)
        scores.setdefault(score, []).append(node)
    return scores


def sort_nodes(scores: dict[float, list[NodeInfo]]) -> list[NodeInfo]:
    """SortNodes: best score first."""
    return [n for s in sorted(scores, reverse=True) for n in scores[s]]


def select_best_node(scores: dict[float, list[NodeInfo]]) -> tuple[NodeInfo | None, float]:
    """SelectBestNodeAndScore (ties: the first node by name)."""
    if not scores:
        return None, 0.0
    best = max(scores)
    return min(scores[best], key=lambda n: n.name), best


class VictimsError(Exception):
    pass


def validate_victims(preemptor: TaskInfo, node: NodeInfo, victims: Iterable[TaskInfo]) -> None:
    """ValidateVictims: would the node's future idle plus the victims fit the preemptor?
    (No victims may still be fine: the node may have room already.)"""
    future = node.future_idle()
    for victim in victims:
        future.add(victim.resreq)
    if not preemptor.init_resreq.less_equal(future):
        raise VictimsError(
            f"not enough resources: requested <{preemptor.init_resreq}>, but future idle <{future}>"
        )
