"""binpack: prefer the node that is fullest after placing the task.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/binpack/binpack.go``
(``calculateWeight``: ``binpack.weight`` 1, ``binpack.cpu`` 1, ``binpack.memory`` 1,
``binpack.resources: nvidia.com/gpu, ...`` with ``binpack.resources.<name>`` weights;
``BinPackingScore``: for each resource the task asks for, (used + request) / allocatable
times its weight, averaged and scaled to 0..100 times ``binpack.weight``; a node the task
would overflow scores 0).
"""

from __future__ import annotations

from gpulab.framework.interface import MAX_NODE_SCORE
from gpulab.volcano.scheduler.api.job_info import TaskInfo
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.api.resource_info import CPU, MEMORY
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.session import Session

NAME = "binpack"
RESOURCES = "binpack.resources"


def weights_of(args: Arguments) -> tuple[int, dict[str, int]]:
    """(binpack.weight, weight per resource)."""
    weight = args.get_int("binpack.weight", 1)
    per: dict[str, int] = {}
    for name in str(args.get(RESOURCES) or "").split(","):
        name = name.strip()
        if name:
            w = args.get_int(f"{RESOURCES}.{name}", 1)
            per[name] = w if w >= 0 else 1
    cpu, memory = args.get_int("binpack.cpu", 1), args.get_int("binpack.memory", 1)
    per[CPU] = cpu if cpu >= 0 else 1
    per[MEMORY] = memory if memory >= 0 else 1
    return weight, per


def bin_packing_score(task: TaskInfo, node: NodeInfo, weight: int, per: dict[str, int]) -> float:
    score, weight_sum = 0.0, 0
    for resource in task.resreq.resource_names():
        request = task.resreq.get(resource)
        if request == 0 or resource not in per:
            continue
        capacity, used = node.allocatable.get(resource), node.used.get(resource)
        if capacity == 0 or per[resource] == 0:
            continue
        if request + used > capacity:
            return 0.0
        score += (request + used) * per[resource] / capacity
        weight_sum += per[resource]
    if weight_sum > 0:
        score /= weight_sum
    return score * MAX_NODE_SCORE * weight


class BinpackPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.weight, self.per = weights_of(arguments)

    def on_session_open(self, ssn: Session) -> None:
        if self.weight != 0:
            ssn.add_node_order_fn(
                NAME, lambda task, node: bin_packing_score(task, node, self.weight, self.per)
            )

    def on_session_close(self, ssn: Session) -> None:
        pass
