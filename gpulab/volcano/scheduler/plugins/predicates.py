"""predicates: can this pod go on this node at all (besides resources)?

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/predicates/predicates.go``:
``Predicate`` first checks the node's pod count (``node(s) pod number exceeded``), then
runs Kubernetes' own filters, as upstream builds them from the in-tree plugins:
NodeUnschedulable, NodeAffinity (``predicate.NodeAffinityEnable``) and TaintToleration
(``predicate.TaintTolerationEnable``), each failure an UnschedulableAndUnresolvable
status with kube-scheduler's reason. Resources are not its business: allocate compares
the task's request with the node's FutureIdle itself. Its event handlers keep the
session's k8s NodeInfos (the NodeMap) current as tasks are allocated and released.

The filters are the scheduling-framework chapter's pure fit functions
(gpulab.framework.predicates), as upstream calls the in-tree plugins.

Lab differences: NodePorts, InterPodAffinity, volume (limits, zone, binding),
PodTopologySpread and DRA filters and the predicate cache are not implemented.
"""

from __future__ import annotations

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

NAME = "predicates"
NODE_AFFINITY_ENABLE = "predicate.NodeAffinityEnable"
TAINT_TOLERATION_ENABLE = "predicate.TaintTolerationEnable"


class PredicatesPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.node_affinity = arguments.get_bool(NODE_AFFINITY_ENABLE, True)
        self.taint_toleration = arguments.get_bool(TAINT_TOLERATION_ENABLE, True)

    def on_session_open(self, ssn: Session) -> None:
        node_map = ssn.node_map

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
            if statuses:
                raise FitError(task.key, node.name, statuses)

        ssn.add_predicate_fn(NAME, predicate)

        def on_allocate(event: Event) -> None:
            info = node_map.get(event.task.node_name)
            if info is not None:
                info.add_pod(PodInfo.of(event.task.pod))

        def on_deallocate(event: Event) -> None:
            info = node_map.get(event.task.node_name)
            if info is not None:
                info.remove_pod(event.task.uid)

        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))

    def on_session_close(self, ssn: Session) -> None:
        pass
