"""nodeorder: score nodes with Kubernetes' own score functions, weighted.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/nodeorder/nodeorder.go``
(``calculateWeight`` and ``InitPlugin``): a batch score per node, the sum over
- ``leastrequested.weight`` (1): NodeResourcesFit LeastAllocated over cpu and memory
  (weights 50/50);
- ``mostrequested.weight`` (0): MostAllocated over cpu and memory;
- ``balancedresource.weight`` (1): BalancedAllocation over cpu, memory, nvidia.com/gpu;
- ``nodeaffinity.weight`` (2): preferred node affinity, normalised to 0..100;
- ``tainttoleration.weight`` (3): fewer intolerable PreferNoSchedule taints, normalised.
The k8s view of the nodes is the session's NodeMap (requests of the pods on them, what
the session has placed included).

Lab differences: ImageLocality, InterPodAffinity and PodTopologySpread scores are not
implemented (their weights are read and ignored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulab.framework.interface import MAX_NODE_SCORE, NodeScore
from gpulab.framework.plugins.helper import default_normalize_score
from gpulab.framework.plugins.noderesources import least_requested_score, most_requested_score
from gpulab.framework.predicates import (
    count_intolerable_prefer_no_schedule,
    preferred_affinity_score,
)
from gpulab.framework.resources import (
    CPU,
    MEMORY,
    Resource,
    pod_non_zero_request,
    pod_request,
)
from gpulab.framework.snapshot import NodeInfo as K8sNodeInfo
from gpulab.volcano.scheduler.api.job_info import TaskInfo
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.session import Session

NAME = "nodeorder"
GPU = "nvidia.com/gpu"
WEIGHTS = {
    "leastrequested.weight": 1,
    "mostrequested.weight": 0,
    "balancedresource.weight": 1,
    "nodeaffinity.weight": 2,
    "tainttoleration.weight": 3,
}


@dataclass(frozen=True)
class PodRequest:
    """The pod's requests as scoring counts them, worked out once per task."""

    request: Resource
    non_zero: Resource

    @classmethod
    def of(cls, task: TaskInfo) -> PodRequest:
        return cls(pod_request(task.pod), pod_non_zero_request(task.pod))


def _requested(node: K8sNodeInfo, pod: PodRequest, resource: str) -> tuple[int, int]:
    """(allocatable, requested with the pod) as resource_allocation.go counts them."""
    if resource in (CPU, MEMORY):
        return node.allocatable.get(resource), (
            node.non_zero_requested.get(resource) + pod.non_zero.get(resource)
        )
    request = pod.request.get(resource)
    if request == 0:  # an extended resource the pod does not ask for is not scored
        return 0, 0
    return node.allocatable.get(resource), node.requested.get(resource) + request


def resource_allocation_score(
    node: K8sNodeInfo, pod: PodRequest, resources: dict[str, int], most: bool
) -> int:
    total = weights = 0
    for resource, weight in resources.items():
        capacity, requested = _requested(node, pod, resource)
        if capacity == 0:
            continue
        score = (most_requested_score if most else least_requested_score)(requested, capacity)
        total += score * weight
        weights += weight
    return total // weights if weights else 0


def balanced_allocation_score(node: K8sNodeInfo, pod: PodRequest) -> int:
    """balancedResourceScorer: (1 - std of the requested fractions) * 100."""
    fractions = []
    for resource in (CPU, MEMORY, GPU):
        capacity, requested = _requested(node, pod, resource)
        if capacity == 0:
            continue
        fractions.append(min(requested / capacity, 1.0))
    std = 0.0
    if len(fractions) == 2:
        std = abs(fractions[0] - fractions[1]) / 2
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) ** 2 for f in fractions) / len(fractions))
    return int((1 - std) * MAX_NODE_SCORE)


class NodeOrderPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.weights = {k: arguments.get_int(k, v) for k, v in WEIGHTS.items()}

    def on_session_open(self, ssn: Session) -> None:
        node_map = ssn.node_map
        w = self.weights

        def batch(task: TaskInfo, nodes: list[NodeInfo]) -> dict[str, float]:
            pod = PodRequest.of(task)
            infos = [(n.name, node_map.get(n.name)) for n in nodes]
            scores = dict.fromkeys((name for name, _ in infos), 0.0)
            affinity: list[NodeScore] = []
            taints: list[NodeScore] = []
            for name, info in infos:
                if info is None:
                    continue
                if w["leastrequested.weight"]:
                    scores[name] += w["leastrequested.weight"] * resource_allocation_score(
                        info, pod, {CPU: 50, MEMORY: 50}, most=False
                    )
                if w["mostrequested.weight"]:
                    scores[name] += w["mostrequested.weight"] * resource_allocation_score(
                        info, pod, {CPU: 1, MEMORY: 1}, most=True
                    )
                if w["balancedresource.weight"]:
                    scores[name] += w["balancedresource.weight"] * balanced_allocation_score(
                        info, pod
                    )
                affinity.append(NodeScore(name, preferred_affinity_score(task.pod, info.node)))
                taints.append(
                    NodeScore(name, count_intolerable_prefer_no_schedule(task.pod, info.node))
                )
            for weight, reverse, node_scores in (
                (w["nodeaffinity.weight"], False, affinity),
                (w["tainttoleration.weight"], True, taints),
            ):
                if not weight:
                    continue
                default_normalize_score(MAX_NODE_SCORE, reverse, node_scores)
                for s in node_scores:
                    scores[s.name] += weight * s.score
            return scores

        ssn.add_batch_node_order_fn(NAME, batch)

    def on_session_close(self, ssn: Session) -> None:
        pass
