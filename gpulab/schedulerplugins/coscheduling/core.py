"""The PodGroup manager behind Coscheduling: quorum checks, Permit counting, backoff.

Mirrors scheduler-plugins v0.35.4-devel ``pkg/coscheduling/core/core.go``
(``PodGroupManager``):

- ``PreFilter``: a group that failed recently (``podGroupBackoffSeconds``) is refused;
  fewer pods than ``minMember`` exist -> "pre-filter pod X cannot find enough sibling
  pods, current pods number: N, minMember of group: M"; gated siblings count against the
  quorum; with ``minResources``, the cluster must have them free, counting what the
  group's own pods already hold as free (``CheckClusterResource``; the verdict is cached
  for the schedule timeout in ``permittedPG``).
- ``Permit``: the pod joins ``assignedPodsByPG``; once that reaches ``minMember`` the
  answer is Success, else Wait - and the first waiting pod asks for its siblings to be
  activated (``ActivateSiblings`` through the cycle's PodsToActivate).
- ``Unreserve`` drops the pod from the count; bound pods seen by the informer are added
  (and removed when deleted), so a restarted scheduler counts what is already bound.
- ``GetCreationTimestamp`` orders groups in the queue by the PodGroup's creation time -
  or, after a failure, by the time of that failure, so a group that cannot fit does
  not block the ones behind it (head-of-line blocking).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from gpulab.framework.interface import PODS_TO_ACTIVATE_KEY, CycleState, PodsToActivate
from gpulab.framework.resources import PODS, Resource
from gpulab.framework.snapshot import NodeInfo, Snapshot, node_name_of, pod_key, pod_uid
from gpulab.informer import Store
from gpulab.schedulerplugins.apis import (
    min_member,
    pod_group_full_name,
    pod_group_label,
    timestamp,
)

Obj = Mapping[str, Any]
PERMIT_STATE_KEY = "PermitCoscheduling"


class PermitStatus(StrEnum):
    POD_GROUP_NOT_SPECIFIED = "PodGroup not specified"
    POD_GROUP_NOT_FOUND = "PodGroup not found"
    SUCCESS = "Success"
    WAIT = "Wait"


class TTLSet:
    """A set whose members expire (the go-cache caches of the manager; ``add`` is
    go-cache's ``Add``: a member that has not expired keeps its expiry)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._until: dict[str, float] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def add(self, key: str, ttl: float) -> None:
        with self._lock:
            now = self._clock()
            if self._until.get(key, now) > now:
                return
            self._until[key] = now + ttl

    def __contains__(self, key: object) -> bool:
        with self._lock:
            until = self._until.get(str(key))
            if until is None:
                return False
            if until <= self._clock():
                del self._until[str(key)]
                return False
            return True

    def delete(self, key: str) -> None:
        with self._lock:
            self._until.pop(key, None)


class PodGroupManager:
    def __init__(
        self,
        pods: Store,
        podgroups: Store,
        snapshot: Callable[[], Snapshot],
        schedule_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.pods = pods
        self.podgroups = podgroups
        self.snapshot = snapshot
        self.schedule_timeout = schedule_timeout
        self.wall = wall
        self.permitted_pg = TTLSet(clock)
        self.backed_off_pg = TTLSet(clock)
        self.last_failed: dict[str, float] = {}
        self.assigned_pods_by_pg: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ informer handlers

    def on_pod_add(self, pod: Obj) -> None:
        """AddPodFactory: a pod that arrives bound counts for its group."""
        full = pod_group_full_name(pod)
        if not node_name_of(pod) or not full:
            return
        with self._lock:
            self.assigned_pods_by_pg.setdefault(full, set()).add(_name(pod))

    def on_pod_delete(self, pod: Obj) -> None:
        if node_name_of(pod):
            self.Unreserve(pod)

    # ------------------------------------------------------------------ lookups

    def GetPodGroup(self, pod: Obj) -> tuple[str, Obj | None]:
        name = pod_group_label(pod)
        if not name:
            return "", None
        full = pod_group_full_name(pod)
        return full, self.podgroups.get(full)

    def siblings(self, pod: Obj) -> list[Obj]:
        """The pods (any phase the informer holds) labelled with the pod's group."""
        ns, name = (pod.get("metadata") or {}).get("namespace"), pod_group_label(pod)
        return [
            p
            for p in self.pods.list()
            if (p.get("metadata") or {}).get("namespace") == ns and pod_group_label(p) == name
        ]

    def GetAssignedPodCount(self, full_name: str) -> int:
        with self._lock:
            return len(self.assigned_pods_by_pg.get(full_name, ()))

    def GetCreationTimestamp(self, pod: Obj, default: float) -> float:
        """What orders the pod's group in the queue (wall-clock seconds)."""
        name = pod_group_label(pod)
        if not name:
            return default
        full = pod_group_full_name(pod)
        with self._lock:
            if full in self.last_failed:
                return self.last_failed[full]
        pg = self.podgroups.get(full)
        created = timestamp((pg or {}).get("metadata", {}).get("creationTimestamp"))
        return default if created is None else created

    # ------------------------------------------------------------------ bookkeeping

    def BackoffPodGroup(self, full_name: str, seconds: float) -> None:
        if seconds > 0:
            self.backed_off_pg.add(full_name, seconds)

    def MarkPodGroupScheduleFailure(self, full_name: str) -> None:
        with self._lock:
            self.last_failed[full_name] = self.wall()

    def ClearPodGroupScheduleFailure(self, full_name: str) -> None:
        with self._lock:
            self.last_failed.pop(full_name, None)

    def DeletePermittedPodGroup(self, full_name: str) -> None:
        self.permitted_pg.delete(full_name)

    def ActivateSiblings(self, pod: Obj, state: CycleState) -> list[str]:
        """Ask the queue to move the pod's siblings to activeQ at the end of this cycle,
        if this cycle's Permit wrote ``PERMIT_STATE_KEY`` into the CycleState; the names
        of the siblings asked for."""
        permit = state.get(PERMIT_STATE_KEY)
        if not pod_group_label(pod) or not permit:
            return []
        to_activate: PodsToActivate | None = state.get(PODS_TO_ACTIVATE_KEY)
        if to_activate is None:
            return []
        uid = pod_uid(pod)
        names = []
        with to_activate.lock:
            for sibling in self.siblings(pod):
                if pod_uid(sibling) != uid:
                    to_activate.pods[pod_key(sibling)] = sibling
                    names.append(_name(sibling))
        return sorted(names)

    # ------------------------------------------------------------------ extension points

    def PreFilter(self, pod: Obj) -> str | None:
        """Why the pod's group cannot be scheduled now, or None."""
        full, pg = self.GetPodGroup(pod)
        if pg is None:
            return None
        if full in self.backed_off_pg:
            return f"podGroup {full} failed recently"
        pods = self.siblings(pod)
        want = min_member(pg)
        gap = want - len(pods)
        if gap > 0:
            return (
                f"pre-filter pod {_name(pod)} cannot find enough sibling pods, "
                f"current pods number: {len(pods)}, minMember of group: {want}"
            )
        for p in pods:
            if (p.get("spec") or {}).get("schedulingGates"):
                gap += 1
            if gap > 0:
                return (
                    f"pre-filter pod {_name(pod)} cannot proceed due to gated pods "
                    "in the same PodGroup"
                )
        min_resources = (pg.get("spec") or {}).get("minResources")
        if not min_resources or full in self.permitted_pg:
            return None
        request = {**_units(min_resources), PODS: want}
        gap_left = check_cluster_resource(self.snapshot().list(), request, full)
        if gap_left:
            return f"resource gap: {_format_gap(gap_left)}"
        self.permitted_pg.add(full, self.schedule_timeout)
        return None

    def Permit(self, state: CycleState, pod: Obj) -> PermitStatus:
        full, pg = self.GetPodGroup(pod)
        if not full:
            return PermitStatus.POD_GROUP_NOT_SPECIFIED
        if pg is None:
            return PermitStatus.POD_GROUP_NOT_FOUND
        with self._lock:
            assigned = self.assigned_pods_by_pg.setdefault(full, set())
            assigned.add(_name(pod))
            if len(assigned) >= min_member(pg):
                return PermitStatus.SUCCESS
            if len(assigned) == 1:
                # the first pod of the group to get here wakes up its siblings
                state.write(PERMIT_STATE_KEY, True)
            return PermitStatus.WAIT

    def Unreserve(self, pod: Obj) -> None:
        full = pod_group_full_name(pod)
        if not full:
            return
        with self._lock:
            assigned = self.assigned_pods_by_pg.get(full)
            if assigned is not None:
                assigned.discard(_name(pod))
                if not assigned:
                    del self.assigned_pods_by_pg[full]


def _name(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def _units(resources: Mapping[str, Any]) -> dict[str, int]:
    r = Resource.from_list(resources)
    return {name: r.get(name) for name in resources}


def node_left(info: NodeInfo, pg_full_name: str) -> dict[str, int]:
    """getNodeResource: what the node has free if the group's own pods were not there."""
    others = [p for p in info.pods if pod_group_full_name(p.pod) != pg_full_name]
    requested = Resource()
    for p in others:
        requested.add(p.request)
    alloc = info.allocatable
    left = {
        PODS: alloc.allowed_pod_number - len(others),
        "cpu": alloc.milli_cpu - requested.milli_cpu,
        "memory": alloc.memory - requested.memory,
        "ephemeral-storage": alloc.ephemeral_storage - requested.ephemeral_storage,
    }
    for name, v in alloc.scalar.items():
        left[name] = v - requested.scalar.get(name, 0)
    return left


def check_cluster_resource(
    nodes: list[NodeInfo], request: Mapping[str, int], pg_full_name: str
) -> dict[str, int]:
    """CheckClusterResource: subtract node after node's free resources from the request;
    what is left is the gap (empty: the cluster has room)."""
    gap = dict(request)
    for info in nodes:
        left = node_left(info, pg_full_name)
        for name in list(gap):
            remaining = gap[name] - left.get(name, 0)
            if remaining <= 0:
                del gap[name]
            else:
                gap[name] = remaining
        if not gap:
            return {}
    return gap


def _format_gap(gap: Mapping[str, int]) -> str:
    def unit(name: str, v: int) -> str:
        return f"{v}m" if name == "cpu" else str(v)

    return "map[" + " ".join(f"{k}:{unit(k, v)}" for k, v in sorted(gap.items())) + "]"
