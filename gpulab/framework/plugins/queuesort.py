"""PrioritySort: higher priority first, then the pod that entered the queue first.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/queuesort/priority_sort.go``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.interface import QueuedPodInfo

NAME = "PrioritySort"


def pod_priority(pod: Mapping[str, Any]) -> int:
    """corev1helpers.PodPriority: ``spec.priority`` (set by the Priority admission), or 0."""
    return int((pod.get("spec") or {}).get("priority") or 0)


class PrioritySort:
    name = NAME

    def Less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        pa, pb = pod_priority(a.pod), pod_priority(b.pod)
        return pa > pb or (pa == pb and a.timestamp < b.timestamp)


def new(args: Mapping[str, Any], handle: Any) -> PrioritySort:
    return PrioritySort()
