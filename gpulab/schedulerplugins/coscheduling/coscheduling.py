"""Coscheduling: a PodGroup's pods are bound all together or not at all.

Mirrors scheduler-plugins v0.35.4-devel ``pkg/coscheduling/coscheduling.go``:

- ``Less`` (QueueSort): priority, then the group's creation time (or last failure) - for
  a pod of no group its first entry into activeQ - then ``namespace/name``, so a
  group's pods leave the queue together.
- ``PreFilter``: the manager's checks; a failure is UnschedulableAndUnresolvable (no
  preemption for it).
- ``PostFilter``: a pod of the group fits nowhere - unless enough of the group is bound
  already, or the missing share is within ``podGroupRejectPercentage`` - reject every
  waiting sibling ("optimistic rejection in PostFilter"), so no half of a group holds
  resources, and mark the group failed (it moves back in the queue order).
- ``Permit``: Wait (``scheduleTimeoutSeconds`` of the group - 0 or unset means
  ``permitWaitingTimeSeconds``) until ``minMember`` pods got this far, then Allow every
  waiting sibling at once; a pod naming a missing PodGroup is Unschedulable
  ("PodGroup not found").
- ``Reserve`` does nothing; ``Unreserve`` (a timeout, a rejection, a failed bind) rejects
  every waiting sibling ("rejection in Unreserve") and marks the group failed.
- ``EventsToRegister``: Pod Add, PodGroup Add|Update, without hint functions. A pod
  Coscheduling rejected (a timeout at Permit, a rejection in Unreserve or PostFilter)
  therefore waits in unschedulablePods for one of those - or for a sibling's Permit to
  activate it - and sits out any other event (a node change, a pod deleted).

The lab's trace: Permit and PostFilter decisions show in gpulab-scheduler's steps
(``Permit: Coscheduling: Wait (30s)`` ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.framework.events import POD, ActionType, ClusterEvent, ClusterEventWithHint
from gpulab.framework.interface import (
    SUCCESS,
    Code,
    CycleState,
    PostFilterResult,
    PreFilterResult,
    QueuedPodInfo,
    Status,
    unresolvable,
    unschedulable,
)
from gpulab.framework.plugins.queuesort import pod_priority
from gpulab.framework.runtime import Framework, FrameworkError, WaitingPod
from gpulab.framework.snapshot import NodeInfo, pod_key
from gpulab.informer import PODS
from gpulab.schedulerplugins.apis import (
    PODGROUPS,
    min_member,
    pod_group_full_name,
    pod_group_label,
    wait_time,
)
from gpulab.schedulerplugins.coscheduling.core import (
    PERMIT_STATE_KEY,
    PermitStatus,
    PodGroupManager,
)

NAME = "Coscheduling"
DEFAULT_PERMIT_WAITING_TIME_SECONDS = 60
DEFAULT_POD_GROUP_BACKOFF_SECONDS = 0
DEFAULT_POD_GROUP_REJECT_PERCENTAGE = 10

Obj = Mapping[str, Any]


class Coscheduling:
    name = NAME

    def __init__(self, args: Mapping[str, Any], handle: Framework) -> None:
        wait = args.get("permitWaitingTimeSeconds", DEFAULT_PERMIT_WAITING_TIME_SECONDS)
        backoff = args.get("podGroupBackoffSeconds", DEFAULT_POD_GROUP_BACKOFF_SECONDS)
        reject = args.get("podGroupRejectPercentage", DEFAULT_POD_GROUP_REJECT_PERCENTAGE)
        problems = []
        if not isinstance(wait, int) or wait < 0:
            problems.append(f"permitWaitingTimeSeconds: {wait!r} must be greater than 0")
        if not isinstance(backoff, int) or backoff < 0:
            problems.append(f"podGroupBackoffSeconds: {backoff!r} must be greater than 0")
        if not isinstance(reject, int) or not 0 <= reject <= 100:
            problems.append(f"podGroupRejectPercentage: {reject!r} must be between 0 and 100")
        if problems:
            raise FrameworkError(f"{NAME} args: " + "; ".join(problems))
        self.handle = handle
        self.schedule_timeout = float(wait)
        self.pg_backoff = float(backoff)
        self.pg_reject_threshold = reject / 100.0
        self.pg_mgr = PodGroupManager(
            handle.informer(PODS),
            handle.informer(PODGROUPS),
            handle.snapshot,
            self.schedule_timeout,
        )

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        """A pod added (in 1.36: a pod bound - an unscheduled pod's add is no cluster
        event), or a PodGroup added or updated; no hint functions, so each such event
        requeues the pods Coscheduling rejected."""
        pg = f"{PODGROUPS.plural}.{PODGROUPS.version}.{PODGROUPS.group}"
        return [
            ClusterEventWithHint(ClusterEvent(POD, ActionType.ADD)),
            ClusterEventWithHint(ClusterEvent(pg, ActionType.ADD | ActionType.UPDATE)),
        ]

    def Less(self, a: QueuedPodInfo, b: QueuedPodInfo) -> bool:
        pa, pb = pod_priority(a.pod), pod_priority(b.pod)
        if pa != pb:
            return pa > pb
        # the queue stamps InitialAttemptTimestamp when a pod first enters activeQ
        assert a.initial_attempt_timestamp is not None
        assert b.initial_attempt_timestamp is not None
        ta = self.pg_mgr.GetCreationTimestamp(a.pod, a.initial_attempt_timestamp)
        tb = self.pg_mgr.GetCreationTimestamp(b.pod, b.initial_attempt_timestamp)
        if ta == tb:
            return pod_key(a.pod) < pod_key(b.pod)
        return ta < tb

    def PreFilter(
        self, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status]:
        reason = self.pg_mgr.PreFilter(pod)
        if reason is not None:
            return None, unresolvable(reason)
        return None, SUCCESS

    def PostFilter(
        self, state: CycleState, pod: Obj, node_to_status: Mapping[str, Status]
    ) -> tuple[PostFilterResult | None, Status]:
        full, pg = self.pg_mgr.GetPodGroup(pod)
        if pg is None:
            return PostFilterResult(), unschedulable("can not find pod group")
        assigned = self.pg_mgr.GetAssignedPodCount(full)
        want = min_member(pg)
        if assigned >= want:
            return PostFilterResult(), Status(Code.UNSCHEDULABLE)
        if want and (want - assigned) / want <= self.pg_reject_threshold:
            return PostFilterResult(), Status(Code.UNSCHEDULABLE)
        self._reject_waiting(pod, "optimistic rejection in PostFilter")
        if self.pg_backoff and len(self.pg_mgr.siblings(pod)) >= want:
            self.pg_mgr.BackoffPodGroup(full, self.pg_backoff)
        self.pg_mgr.DeletePermittedPodGroup(full)
        self.pg_mgr.MarkPodGroupScheduleFailure(full)
        name = (pod.get("metadata") or {}).get("name")
        return PostFilterResult(), unschedulable(
            f"PodGroup {full} gets rejected due to Pod {name} is unschedulable even after "
            "PostFilter"
        )

    def Permit(self, state: CycleState, pod: Obj, node_name: str) -> tuple[Status, float]:
        result = self.pg_mgr.Permit(state, pod)
        if result == PermitStatus.POD_GROUP_NOT_SPECIFIED:
            return SUCCESS, 0.0
        if result == PermitStatus.POD_GROUP_NOT_FOUND:
            return unschedulable("PodGroup not found"), 0.0
        full = pod_group_full_name(pod)
        if result == PermitStatus.WAIT:
            _, pg = self.pg_mgr.GetPodGroup(pod)
            activated = self.pg_mgr.ActivateSiblings(pod, state)
            if activated:  # the lab's trace: the CycleState hand-over, Permit to the queue
                self.handle.trace(
                    "ActivateSiblings",
                    pod,
                    f"CycleState {PERMIT_STATE_KEY} written by this Permit (the first of "
                    f"{full} to arrive): {len(activated)} siblings to activeQ "
                    f"({', '.join(activated)})",
                )
            # a group's scheduleTimeoutSeconds of 0 means permitWaitingTimeSeconds
            return Status(Code.WAIT), wait_time(pg, self.schedule_timeout) or self.schedule_timeout
        self.pg_mgr.ClearPodGroupScheduleFailure(full)

        def allow(wp: WaitingPod) -> None:
            if pod_group_full_name(wp.pod) == full:
                wp.Allow(NAME)

        self.handle.IterateOverWaitingPods(allow)
        return SUCCESS, 0.0

    def Reserve(self, state: CycleState, pod: Obj, node_name: str) -> Status:
        return SUCCESS

    def Unreserve(self, state: CycleState, pod: Obj, node_name: str) -> None:
        full, pg = self.pg_mgr.GetPodGroup(pod)
        if pg is None:
            return
        self.pg_mgr.Unreserve(pod)
        self._reject_waiting(pod, "rejection in Unreserve")
        self.pg_mgr.DeletePermittedPodGroup(full)
        self.pg_mgr.MarkPodGroupScheduleFailure(full)

    def _reject_waiting(self, pod: Obj, message: str) -> None:
        ns, group = (pod.get("metadata") or {}).get("namespace"), pod_group_label(pod)

        def reject(wp: WaitingPod) -> None:
            if (wp.pod.get("metadata") or {}).get("namespace") == ns and (
                pod_group_label(wp.pod) == group
            ):
                wp.Reject(NAME, message)

        self.handle.IterateOverWaitingPods(reject)


def new(args: Mapping[str, Any], handle: Framework) -> Coscheduling:
    plugin = Coscheduling(args, handle)
    handle.informer(PODS, on_add=plugin.pg_mgr.on_pod_add, on_delete=plugin.pg_mgr.on_pod_delete)
    handle.trace_start(
        "New",
        f"{NAME}: PodGroup informer ({PODGROUPS.plural}.{PODGROUPS.group}) and pod informer "
        "from framework.Handle, started with the scheduler's; permitWaitingTimeSeconds "
        f"{plugin.schedule_timeout:g}, podGroupRejectPercentage "
        f"{plugin.pg_reject_threshold * 100:g}",
    )
    return plugin
