"""NodeResourceTopologyMatch: place pods where one NUMA node can hold what they ask.

Mirrors scheduler-plugins v0.35.4-devel ``pkg/noderesourcetopology/plugin.go``
(``TopologyMatch``: Filter, Score, Reserve/Unreserve, PostBind; ``NodeResourceTopologyMatchArgs``
``scoringStrategy`` {type LeastAllocated (default) | MostAllocated | BalancedAllocation |
LeastNUMANodes, resources (default cpu, memory, weight 1)}, ``discardReservedNodes``;
``EventsToRegister``: pod deletes, node adds and allocatable changes, NRT adds and
updates) and the NRT caches of ``cache/``: ``Passthrough`` (the default: the NRT as the
informer has it) and ``DiscardReserved`` (a node with a pod reserved but not yet bound is
skipped: "invalid node topology data").

Filter and Score themselves are in filter.py and score.py (pure: the demo draws its
per-zone table with the same functions).

Lab differences: the ``OverReserve`` cache (``cacheResyncPeriodSeconds``, foreign-pod
detection, pod fingerprints) is not implemented; an NRT with zones the plugin cannot use
(another type than Node, a name that is not node-<id>) gets a Warning Event
"UnusableZones" on it once per version (upstream only logs and skips them).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpulab.framework.events import NODE, POD, ActionType, ClusterEvent, ClusterEventWithHint
from gpulab.framework.interface import (
    MAX_NODE_SCORE,
    SUCCESS,
    CycleState,
    Status,
    error,
    unschedulable,
)
from gpulab.framework.resources import BEST_EFFORT, GUARANTEED, pod_qos
from gpulab.framework.runtime import Framework, FrameworkError, results_of
from gpulab.framework.snapshot import NodeInfo, pod_uid
from gpulab.informer import resource_version
from gpulab.schedulerplugins.noderesourcetopology import score
from gpulab.schedulerplugins.noderesourcetopology.filter import FilterInfo, filter_numa
from gpulab.schedulerplugins.noderesourcetopology.numaresources import (
    CONTAINER_SCOPE,
    NODE_RESOURCE_TOPOLOGIES,
    POD_SCOPE,
    SINGLE_NUMA_NODE,
    create_numa_node_list,
    ignored_zones,
    include_non_native,
    pod_effective_request,
    topology_manager_of,
)
from gpulab.trace import ObjectRef

NAME = "NodeResourceTopologyMatch"

Obj = Mapping[str, Any]


class TopologyMatch:
    name = NAME

    def __init__(self, args: Mapping[str, Any], handle: Framework) -> None:
        strategy = args.get("scoringStrategy") or {}
        self.strategy = strategy.get("type") or score.LEAST_ALLOCATED
        if self.strategy not in score.STRATEGIES:
            raise FrameworkError(
                f"{NAME} args: scoringStrategy.type {self.strategy!r}: illegal scoring "
                f"strategy; use one of {', '.join(score.STRATEGIES)}"
            )
        resources = strategy.get("resources") or [{"name": "cpu"}, {"name": "memory"}]
        self.weights = {r["name"]: int(r.get("weight") or 1) for r in resources}
        if args.get("cacheResyncPeriodSeconds"):
            raise FrameworkError(
                f"{NAME} args: cacheResyncPeriodSeconds (the OverReserve cache) is not "
                "implemented; leave it out (Passthrough) or set discardReservedNodes"
            )
        self.discard_reserved = bool(args.get("discardReservedNodes"))
        self.handle = handle
        self.nrts = handle.informer(
            NODE_RESOURCE_TOPOLOGIES, on_add=self._check_zones, on_update=self._updated
        )
        self._reserved: dict[str, set[str]] = {}  # node -> pod UIDs (DiscardReserved)
        self._lock = threading.Lock()

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        """No hint functions: each registered event requeues the pods this plugin
        rejected (the Node/Add registration also brings Node/UpdateNodeTaint, as the
        framework adds it to any plugin registering Node/Add without it)."""
        r = NODE_RESOURCE_TOPOLOGIES
        nrt = f"{r.plural}.{r.version}.{r.group}"
        return [
            ClusterEventWithHint(ClusterEvent(POD, ActionType.DELETE)),
            ClusterEventWithHint(
                ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE)
            ),
            ClusterEventWithHint(ClusterEvent(nrt, ActionType.ADD | ActionType.UPDATE)),
        ]

    # ------------------------------------------------------------------ the NRT cache

    def _nrt(self, node: str) -> tuple[Obj | None, bool]:
        """GetCachedNRTCopy: (the node's NRT or None, fresh?)."""
        if self.discard_reserved:
            with self._lock:
                if self._reserved.get(node):
                    return None, False
        return self.nrts.get(node), True

    def _updated(self, old: Obj, new: Obj) -> None:
        if resource_version(old) != resource_version(new):
            self._check_zones(new)

    def _check_zones(self, nrt: Obj) -> None:
        unusable = ignored_zones(list(nrt.get("zones") or []))
        if unusable:
            ref = ObjectRef.of({"kind": "NodeResourceTopology", **nrt})
            self.handle.tracer.step(
                "UnusableZones",
                ref,
                "; ".join(unusable) + ": only zones of type Node named node-<NUMA id> count; "
                "the others are ignored (fix the topology updater that published them)",
                warning=True,
            )

    # ------------------------------------------------------------------ Filter / Score

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        qos = pod_qos(pod)
        if qos == BEST_EFFORT and not include_non_native(pod):
            return SUCCESS
        nrt, fresh = self._nrt(node.name)
        if not fresh:
            return unschedulable("invalid node topology data")
        if nrt is None:
            return SUCCESS
        conf = topology_manager_of(nrt)
        info = FilterInfo(node, conf, create_numa_node_list(list(nrt.get("zones") or [])), qos)
        status, _ = filter_numa(pod, info)
        return status

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        qos = pod_qos(pod)
        if qos != GUARANTEED:
            return MAX_NODE_SCORE, SUCCESS
        nrt, fresh = self._nrt(node.name)
        if not fresh or nrt is None:
            return 0, SUCCESS
        conf = topology_manager_of(nrt)
        numa_nodes = create_numa_node_list(list(nrt.get("zones") or []))
        if self.strategy == score.LEAST_NUMA_NODES:
            fn = (
                score.least_numa_pod_scope
                if conf.scope == POD_SCOPE
                else score.least_numa_container_scope
            )
            return fn(pod, qos, numa_nodes, conf.max_numa_nodes), SUCCESS
        if conf.policy != SINGLE_NUMA_NODE:
            return 0, SUCCESS
        strategy = score.FUNCTIONS[self.strategy]
        if conf.scope == POD_SCOPE:
            result = score.pod_scope_score(pod, numa_nodes, strategy, self.weights)
        elif conf.scope == CONTAINER_SCOPE:
            result = score.container_scope_score(pod, numa_nodes, strategy, self.weights)
        else:
            return 0, error(f"unknown topology manager scope {conf.scope!r}")
        results_of(state).score_notes.append(
            (node.name, self._score_note(pod, node.name, nrt, numa_nodes, strategy, result))
        )
        return result, SUCCESS

    def _score_note(
        self,
        pod: Obj,
        node: str,
        nrt: Obj,
        numa_nodes: list[Any],
        strategy: score.Strategy,
        result: int,
    ) -> str:
        """The lab's trace of one node's Score (upstream logs it at -v=6): the zones read
        from the node's NRT (what is available of what the pod asks), each zone's score
        for the pod's request, the node's score."""
        request = pod_effective_request(pod)
        zones = "; ".join(
            f"{z['name']} "
            + ", ".join(
                f"{r['name'].removeprefix('nvidia.com/')} {_short(r['name'], r['available'])}"
                for r in z.get("resources") or []
                if r["name"] in request
            )
            for z in nrt.get("zones") or []
        )
        per_zone = score.numa_scores(request, numa_nodes, strategy, self.weights)
        zone_scores = ", ".join(f"node-{numa} {s}" for numa, s in sorted(per_zone.items()))
        return (
            f"{NAME} on {node}: NRT {node} zones available ({zones}); {self.strategy} per "
            f"zone {zone_scores}: the lowest non-zero -> {result}/{MAX_NODE_SCORE}"
        )

    # ------------------------------------------------------------------ Reserve / PostBind

    def Reserve(self, state: CycleState, pod: Obj, node_name: str) -> Status:
        if self.discard_reserved:
            with self._lock:
                self._reserved.setdefault(node_name, set()).add(pod_uid(pod))
        return SUCCESS

    def Unreserve(self, state: CycleState, pod: Obj, node_name: str) -> None:
        self._release(node_name, pod)

    def PostBind(self, state: CycleState, pod: Obj, node_name: str) -> None:
        self._release(node_name, pod)

    def _release(self, node_name: str, pod: Obj) -> None:
        with self._lock:
            self._reserved.get(node_name, set()).discard(pod_uid(pod))


def new(args: Mapping[str, Any], handle: Framework) -> TopologyMatch:
    return TopologyMatch(args, handle)


def _short(resource: str, quantity: str) -> str:
    """A zone's quantity as a reader takes it in: memory in GiB, the rest as published."""
    if resource == "memory" and quantity.isdigit():
        return f"{int(quantity) / 2**30:g}Gi"
    return quantity
