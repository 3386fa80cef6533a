"""conformance: never evict critical pods.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/conformance/conformance.go``:
``Preemptable`` and ``Reclaimable`` leave out pods of PriorityClass
``system-cluster-critical`` / ``system-node-critical`` and pods in ``kube-system``.
"""

from __future__ import annotations

from gpulab.volcano.scheduler.api.job_info import TaskInfo
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.session import PERMIT, Session

NAME = "conformance"
CRITICAL = ("system-cluster-critical", "system-node-critical")


def evictable(_evictor: TaskInfo, evictees: list[TaskInfo]) -> tuple[list[TaskInfo], int]:
    victims = [
        t
        for t in evictees
        if (t.pod.get("spec") or {}).get("priorityClassName") not in CRITICAL
        and t.namespace != "kube-system"
    ]
    return victims, PERMIT


class ConformancePlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments

    def on_session_open(self, ssn: Session) -> None:
        ssn.add_preemptable_fn(NAME, evictable)
        ssn.add_reclaimable_fn(NAME, evictable)

    def on_session_close(self, ssn: Session) -> None:
        pass
