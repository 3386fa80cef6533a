"""The scheduling.x-k8s.io/v1alpha1 PodGroup API, as scheduler-plugins spells it.

Mirrors scheduler-plugins v0.35.4-devel ``apis/scheduling/v1alpha1/types.go``
(``PodGroupSpec``: ``minMember`` (>= 1 by the CRD's validation), ``minResources``,
``scheduleTimeoutSeconds``; ``PodGroupStatus``: ``phase``, ``occupiedBy``, ``running``,
``succeeded``, ``failed``, ``scheduleStartTime``; phases Pending, Scheduling, Running,
Finished, Failed, Unknown; the pod label ``scheduling.x-k8s.io/pod-group``) and
``pkg/util/podgroup.go`` (``GetPodGroupLabel``, ``GetPodGroupFullName``,
``GetWaitTimeDuration``: the group's ``scheduleTimeoutSeconds``, else the plugin's
``permitWaitingTimeSeconds``, else 60 s).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpulab.informer import Resource

GROUP = "scheduling.x-k8s.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PODGROUPS = Resource(GROUP, VERSION, "podgroups", "PodGroup")
POD_GROUP_LABEL = f"{GROUP}/pod-group"

PENDING = "Pending"
SCHEDULING = "Scheduling"
RUNNING = "Running"
FINISHED = "Finished"
FAILED = "Failed"
UNKNOWN = "Unknown"

DEFAULT_WAIT_TIME = 60.0

Obj = Mapping[str, Any]


def pod_group_label(pod: Obj) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(POD_GROUP_LABEL) or "")


def pod_group_full_name(pod: Obj) -> str:
    """``namespace/pod-group`` of a pod, or "" when it names none."""
    name = pod_group_label(pod)
    return f"{(pod.get('metadata') or {}).get('namespace')}/{name}" if name else ""


def min_member(pg: Obj) -> int:
    return int((pg.get("spec") or {}).get("minMember") or 0)


def wait_time(pg: Obj | None, schedule_timeout: float | None) -> float:
    timeout = ((pg or {}).get("spec") or {}).get("scheduleTimeoutSeconds")
    if timeout is not None:
        return float(timeout)
    if schedule_timeout:
        return schedule_timeout
    return DEFAULT_WAIT_TIME


def timestamp(value: str | None) -> float | None:
    """An RFC 3339 API timestamp as seconds since the epoch."""
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_group(
    name: str,
    namespace: str,
    min_member: int,
    *,
    min_resources: Mapping[str, Any] | None = None,
    schedule_timeout_seconds: int | None = None,
) -> dict[str, Any]:
    """A PodGroup manifest."""
    spec: dict[str, Any] = {"minMember": min_member}
    if min_resources:
        spec["minResources"] = {k: str(v) for k, v in min_resources.items()}
    if schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = schedule_timeout_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
