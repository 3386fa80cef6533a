"""predicates: can this pod go on this node at all (besides resources)?

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/predicates/predicates.go``:
``PrePredicate`` runs the PreFilters once per task (NodePorts: the pod's host ports;
InterPodAffinity: the topology counts over every node's pods); ``Predicate`` first
checks the node's pod count (``node(s) pod number exceeded``), then runs Kubernetes' own
filters, as upstream builds them from the in-tree plugins: the stable ones -
NodeUnschedulable, NodeAffinity (``predicate.NodeAffinityEnable``) and TaintToleration
(``predicate.TaintTolerationEnable``), whose failure is UnschedulableAndUnresolvable and
ends the check - then NodePorts (``predicate.NodePortsEnable``, Unschedulable) and
InterPodAffinity (``predicate.PodAffinityEnable``: the pod's affinity unresolvable, an
anti-affinity either way Unschedulable), each with kube-scheduler's reason. Resources
are not its business: allocate compares the task's request with the node's FutureIdle
itself. Its event handlers keep the session's k8s NodeInfos (the NodeMap) current as
tasks are allocated and released, so a gang's second pod sees the first's ports and
labels.

The filters are the scheduling-framework chapter's pure fit functions
(gpulab.framework.predicates) and podfilters.py, as upstream calls the in-tree plugins.

Lab differences: volume (limits, zone, binding), PodTopologySpread and DRA filters and
the predicate cache are not implemented.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.framework.plugins.nodeaffinity import ERR_REASON_POD
from gpulab.framework.plugins.nodeunschedulable import ERR_REASON_UNSCHEDULABLE
from gpulab.framework.plugins.tainttoleration import ERR_REASON as ERR_REASON_TAINT
from gpulab.framework.predicates import (
    node_affinity_matches,
    node_unschedulable_fits,
    untolerated_taint,
)
from gpulab.framework.snapshot import PodInfo
from gpulab.volcano.scheduler.api.job_info import (
    NODE_POD_NUMBER_EXCEEDED,
    UNSCHEDULABLE,
    UNSCHEDULABLE_AND_UNRESOLVABLE,
    FitError,
    Status,
    TaskInfo,
)
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.interface import Event, EventHandler
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.plugins import podfilters

Obj = Mapping[str, Any]
NAME = "predicates"


NODE_AFFINITY_ENABLE = "predicate.NodeAffinityEnable"
NODE_PORTS_ENABLE = "predicate.NodePortsEnable"
TAINT_TOLERATION_ENABLE = "predicate.TaintTolerationEnable"
POD_AFFINITY_ENABLE = "predicate.PodAffinityEnable"


@dataclass(frozen=True)
class PreFiltered:
    """What PrePredicate worked out for one task: its host ports (NodePorts) and the
    InterPodAffinity state (None: the plugin skips, as upstream's Skip status)."""

    ports: list[tuple[str, str, int]]
    affinity: podfilters.AffinityState | None


class PredicatesPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.node_affinity = arguments.get_bool(NODE_AFFINITY_ENABLE, True)
        self.node_ports = arguments.get_bool(NODE_PORTS_ENABLE, True)
        self.taint_toleration = arguments.get_bool(TAINT_TOLERATION_ENABLE, True)
        self.pod_affinity = arguments.get_bool(POD_AFFINITY_ENABLE, True)
        self._cycle: dict[str, PreFiltered] = {}  # the CycleState of each task, by uid

    def on_session_open(self, ssn: Session) -> None:
        node_map = ssn.node_map
        self._cycle = {}
        # node -> uid -> pod, for the pods with required anti-affinity (kept with the map)
        anti: dict[str, dict[str, Obj]] = {}
        for info in node_map:
            for p in info.pods:
                if podfilters.required_terms(p.pod, "podAntiAffinity"):
                    anti.setdefault(info.name, {})[p.uid] = p.pod

        def with_anti_affinity() -> list[tuple[Obj, list[Obj]]]:
            out = []
            for name, pods in anti.items():
                info = node_map.get(name)
                if pods and info is not None:
                    out.append((info.node, list(pods.values())))
            return out

        def pre_predicate(task: TaskInfo) -> None:
            ports = podfilters.host_ports(task.pod) if self.node_ports else []
            affinity = None
            if self.pod_affinity:
                state = podfilters.pre_filter(
                    task.pod,
                    with_anti_affinity(),
                    lambda: [(n.node, [p.pod for p in n.pods]) for n in node_map],
                )
                affinity = None if state.skip() else state
            self._cycle[task.uid] = PreFiltered(ports, affinity)

        def predicate(task: TaskInfo, node: NodeInfo) -> None:
            k8s = node_map.get(node.name)
            statuses: list[Status] = []
            pods = len(k8s.pods) if k8s is not None else len(node.tasks)
            if node.allocatable.max_task_num <= pods:
                statuses.append(Status(UNSCHEDULABLE, NODE_POD_NUMBER_EXCEEDED, NAME))
            pod, obj = task.pod, node.node
            if not node_unschedulable_fits(pod, obj):
                statuses.append(
                    Status(UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_UNSCHEDULABLE, NAME)
                )
            elif self.node_affinity and not node_affinity_matches(pod, obj):
                statuses.append(Status(UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_POD, NAME))
            elif self.taint_toleration and untolerated_taint(pod, obj) is not None:
                statuses.append(Status(UNSCHEDULABLE_AND_UNRESOLVABLE, ERR_REASON_TAINT, NAME))
            if statuses and statuses[-1].code == UNSCHEDULABLE_AND_UNRESOLVABLE:
                raise FitError(task.key, node.name, statuses)
            if task.uid not in self._cycle:
                pre_predicate(task)
            cycle = self._cycle[task.uid]
            if cycle.ports and podfilters.ports_conflict(
                cycle.ports, [p.pod for p in k8s.pods] if k8s is not None else node.pods()
            ):
                statuses.append(Status(UNSCHEDULABLE, podfilters.ERR_REASON_PORTS, NAME))
            failed = podfilters.affinity_filter(cycle.affinity, obj) if cycle.affinity else None
            if failed is not None:
                reason, unresolvable = failed
                code = UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else UNSCHEDULABLE
                statuses.append(Status(code, reason, NAME))
            if statuses:
                raise FitError(task.key, node.name, statuses)

        ssn.add_pre_predicate_fn(NAME, pre_predicate)
        ssn.add_predicate_fn(NAME, predicate)

        def on_allocate(event: Event) -> None:
            info = node_map.get(event.task.node_name)
            if info is not None:
                info.add_pod(PodInfo.of(event.task.pod))
                if podfilters.required_terms(event.task.pod, "podAntiAffinity"):
                    anti.setdefault(info.name, {})[event.task.uid] = event.task.pod

        def on_deallocate(event: Event) -> None:
            info = node_map.get(event.task.node_name)
            if info is not None:
                info.remove_pod(event.task.uid)
                anti.get(info.name, {}).pop(event.task.uid, None)

        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))

    def on_session_close(self, ssn: Session) -> None:
        pass
