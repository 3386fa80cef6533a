"""Coscheduling and the PodGroup controller (pure: fake informers, binder and IO)."""

from __future__ import annotations

import pytest
from framework_fakes import FakeBinder, FakeInformers, FakeIO, framework, scheduler

from gpulab.framework.events import (
    EVENT_ASSIGNED_POD_DELETE,
    NODE,
    ActionType,
    ClusterEvent,
)
from gpulab.framework.interface import CycleState, QueuedPodInfo
from gpulab.framework.objects import GPU, make_node, make_pod
from gpulab.framework.runtime import FrameworkError
from gpulab.framework.schedule_one import Scheduler
from gpulab.framework.snapshot import PodInfo, new_snapshot
from gpulab.informer import PODS
from gpulab.schedulerplugins import apis
from gpulab.schedulerplugins.commands import registry
from gpulab.schedulerplugins.controllers.podgroup import next_status
from gpulab.schedulerplugins.coscheduling.core import TTLSet, check_cluster_resource

NAME = "gpulab-scheduler"
NS = "default"


PROFILE = {
    "schedulerName": NAME,
    "plugins": {
        "multiPoint": {
            "enabled": [{"name": "Coscheduling"}],
            "disabled": [{"name": "PrioritySort"}],
        }
    },
    "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 5}}],
}


def build(
    nodes: list[dict], profile: dict = PROFILE
) -> tuple[Scheduler, FakeInformers, FakeBinder, FakeIO]:
    informers = FakeInformers()
    binder = FakeBinder()
    fwk = framework(profile, registry(), informers, binder)
    sched, io_ = scheduler(fwk, nodes, informers)
    return sched, informers, binder, io_


def gang(
    informers: FakeInformers,
    sched: Scheduler,
    name: str,
    members: int,
    want: int,
    gpus: int = 2,
    timeout: int | None = None,
    created: str = "2026-01-01T00:00:00Z",
) -> list[dict]:
    pg = apis.pod_group(name, NS, want, schedule_timeout_seconds=timeout)
    pg["metadata"]["creationTimestamp"] = created
    informers.add(apis.PODGROUPS, pg)
    pods = []
    for i in range(members):
        pod = make_pod(
            f"{name}-{i}",
            NS,
            requests={GPU: gpus},
            scheduler=NAME,
            labels={apis.POD_GROUP_LABEL: name},
        )
        informers.add(PODS, pod)
        sched.queue.Add(pod)
        pods.append(pod)
    return pods


def drain(sched: Scheduler, attempts: int) -> None:
    for _ in range(attempts):
        if not sched.ScheduleOne(timeout=0.05):
            break


def join(sched: Scheduler) -> None:
    for t in sched.binding_threads:
        t.join(10)


FOUR_GPU_NODES = [make_node(f"n{i}", allocatable={GPU: 4}) for i in range(2)]


def test_a_gang_that_fits_binds_whole_after_the_last_member_arrives() -> None:
    sched, informers, binder, _ = build(FOUR_GPU_NODES)
    pods = gang(informers, sched, "train", 4, 4)
    drain(sched, 3)
    fwk = sched.profiles[NAME]
    assert len(fwk.waiting_pods.list()) == 3 and not binder.bound
    drain(sched, 1)
    join(sched)
    assert sorted(binder.bound) == sorted(p["metadata"]["name"] for p in pods)


def test_a_gang_that_cannot_fit_is_rejected_whole_and_holds_nothing() -> None:
    sched, informers, binder, io_ = build(FOUR_GPU_NODES)
    blocker = make_pod("blocker", NS, requests={GPU: 2}, node_name="n0")
    sched.cache.AddPod(blocker)
    gang(informers, sched, "train", 4, 4)
    drain(sched, 4)  # 3 wait; the 4th fits nowhere: PostFilter rejects the waiting 3
    join(sched)
    assert not binder.bound
    assert not sched.profiles[NAME].waiting_pods.list()
    notes = [n for name, reason, n in io_.events if name == "train-3"]
    assert notes[-1] == (
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. PodGroup default/train gets "
        "rejected due to Pod train-3 is unschedulable even after PostFilter"
    )
    rejected = {name for name, reason, n in io_.events if "optimistic rejection in PostFilter" in n}
    assert rejected == {"train-0", "train-1", "train-2"}
    # nothing stays assumed: the node is free for the next attempt
    assert sched.cache.UpdateSnapshot().get("n1").requested.scalar.get(GPU, 0) == 0


def test_waiting_members_time_out_together() -> None:
    sched, informers, binder, io_ = build(FOUR_GPU_NODES)
    gang(informers, sched, "slow", 3, 4, timeout=3)  # a member is missing... until it isn't
    informers.store(PODS).apply(
        "ADDED", make_pod("slow-x", NS, labels={apis.POD_GROUP_LABEL: "slow"})
    )  # counts for the quorum, never scheduled here
    drain(sched, 3)
    assert len(sched.profiles[NAME].waiting_pods.list()) == 3
    join(sched)
    assert not binder.bound
    notes = {name: n for name, reason, n in io_.events if reason == "FailedScheduling"}
    assert set(notes) == {"slow-0", "slow-1", "slow-2"}
    # the first timer to fire (any of the three: they start within milliseconds) unreserves
    # and rejects the rest, unless their own timers fire first too
    timeout = "rejected due to timeout after waiting 3s at plugin Coscheduling"
    assert any(timeout in n for n in notes.values()), notes
    assert all(timeout in n or "rejection in Unreserve" in n for n in notes.values()), notes


def test_prefilter_needs_min_member_pods_and_a_known_podgroup() -> None:
    sched, informers, _, io_ = build(FOUR_GPU_NODES)
    gang(informers, sched, "small", 2, 3)
    drain(sched, 1)
    # as upstream, PostFilter runs after a PreFilter rejection too
    assert io_.events[-1][2] == (
        "0/2 nodes are available: pre-filter pod small-0 cannot find enough sibling pods, "
        "current pods number: 2, minMember of group: 3. PodGroup default/small gets rejected "
        "due to Pod small-0 is unschedulable even after PostFilter"
    )
    orphan = make_pod("orphan", NS, scheduler=NAME, labels={apis.POD_GROUP_LABEL: "ghost"})
    informers.add(PODS, orphan)
    sched.queue.Add(orphan)
    while sched.ScheduleOne(timeout=0.05):
        pass
    assert ("orphan", "FailedScheduling", "0/1 nodes are available: 1 PodGroup not found.") in (
        io_.events
    )


def test_queue_sort_keeps_a_group_together_and_failed_groups_step_back() -> None:
    sched, informers, _, _ = build(FOUR_GPU_NODES)
    fwk = sched.profiles[NAME]
    less = fwk.QueueSortFunc()
    a = gang(informers, sched, "a", 2, 2, created="2026-01-01T00:00:01Z")
    b = gang(informers, sched, "b", 2, 2, created="2026-01-01T00:00:00Z")
    order = sched.queue.PendingPods()["activeQ"]
    assert order == ["default/b-0", "default/b-1", "default/a-0", "default/a-1"]
    plugin = fwk.plugins["Coscheduling"]
    plugin.pg_mgr.MarkPodGroupScheduleFailure("default/b")  # b failed just now
    qa, qb = (sched.queue.get(p[0]) for p in (a, b))
    assert less(qa, qb)


def test_a_pod_of_no_group_sorts_by_when_it_entered_the_queue_not_its_creation() -> None:
    sched, *_ = build(FOUR_GPU_NODES)
    older = make_pod("older", NS, scheduler=NAME)
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    newer = make_pod("newer", NS, scheduler=NAME)
    newer["metadata"]["creationTimestamp"] = "2026-01-01T00:00:05Z"
    entered = {"older": 2000.0, "newer": 1000.0}  # newer was queued first
    less = sched.profiles[NAME].QueueSortFunc()
    qpis = {}
    for pod in (older, newer):
        qpi = QueuedPodInfo(PodInfo.of(pod), 0.0)
        qpi.initial_attempt_timestamp = entered[pod["metadata"]["name"]]
        qpis[pod["metadata"]["name"]] = qpi
    assert less(qpis["newer"], qpis["older"])
    assert not less(qpis["older"], qpis["newer"])


def test_a_gang_that_timed_out_waits_in_unschedulable_pods_for_its_own_events() -> None:
    """Permit rejected it (a timeout, a rejection in Unreserve): Coscheduling registered
    only Pod/Add and PodGroup Add|Update, so a node change or a deleted pod leaves it in
    unschedulablePods - no 1-10 s backoff loop - and a PodGroup update brings it back."""
    sched, informers, binder, io_ = build(FOUR_GPU_NODES)
    pods = gang(informers, sched, "slow", 3, 4, timeout=1)
    informers.store(PODS).apply(
        "ADDED", make_pod("slow-x", NS, labels={apis.POD_GROUP_LABEL: "slow"})
    )  # counts for the quorum, never scheduled here
    drain(sched, 3)
    join(sched)
    assert not binder.bound
    queue = sched.queue
    assert {queue.where(p) for p in pods} == {"unschedulablePods"}
    assert all(queue.get(p).unschedulable_plugins == {"Coscheduling"} for p in pods)
    relabeled = {**FOUR_GPU_NODES[0], "metadata": {**FOUR_GPU_NODES[0]["metadata"], "labels": {}}}
    label_change = ClusterEvent(NODE, ActionType.UPDATE_NODE_LABEL)
    assert queue.MoveAllToActiveOrBackoffQueue(label_change, FOUR_GPU_NODES[0], relabeled) == []
    gone = make_pod("gone", NS, requests={GPU: 2}, node_name="n1")
    assert queue.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, gone, None) == []
    assert {queue.where(p) for p in pods} == {"unschedulablePods"}
    pg = informers.store(apis.PODGROUPS).get(f"{NS}/slow")
    pg_update = ClusterEvent("podgroups.v1alpha1.scheduling.x-k8s.io", ActionType.UPDATE)
    moved = queue.MoveAllToActiveOrBackoffQueue(pg_update, pg, pg)
    assert sorted(moved) == sorted(f"{NS}/{p['metadata']['name']}" for p in pods)
    assert all(n.startswith("slow-") for n in io_.notes("FailedScheduling"))


def test_a_schedule_timeout_of_zero_means_permit_waiting_time() -> None:
    sched, informers, _, _ = build(FOUR_GPU_NODES)
    pods = gang(informers, sched, "zero", 2, 2, timeout=0)
    plugin = sched.profiles[NAME].plugins["Coscheduling"]
    status, wait = plugin.Permit(CycleState(), pods[0], "n0")
    assert status.is_wait() and wait == 5  # the profile's permitWaitingTimeSeconds
    assert apis.wait_time(informers.store(apis.PODGROUPS).get(f"{NS}/zero"), 5) == 0


def test_ttl_set_add_keeps_an_unexpired_members_expiry() -> None:
    now = [100.0]
    ttl = TTLSet(lambda: now[0])
    ttl.add("pg", 3)
    now[0] = 102.0
    ttl.add("pg", 3)  # go-cache Add: present and not expired, so no new expiry
    now[0] = 103.5
    assert "pg" not in ttl
    ttl.add("pg", 3)  # expired: added again
    assert "pg" in ttl


def test_min_resources_gap_is_checked_against_free_resources() -> None:
    nodes = new_snapshot(FOUR_GPU_NODES, [make_pod("x", requests={GPU: 3}, node_name="n0")])
    assert check_cluster_resource(nodes.list(), {GPU: 5, "pods": 2}, "default/g") == {}
    assert check_cluster_resource(nodes.list(), {GPU: 6}, "default/g") == {GPU: 1}


def test_bad_coscheduling_args_name_the_field() -> None:
    bad = {
        **PROFILE,
        "pluginConfig": [
            {
                "name": "Coscheduling",
                "args": {"permitWaitingTimeSeconds": -1, "podGroupRejectPercentage": 101},
            }
        ],
    }
    with pytest.raises(FrameworkError, match="permitWaitingTimeSeconds: -1 must be greater"):
        build(FOUR_GPU_NODES, bad)


def pods_in(*phases: str) -> list[dict]:
    return [make_pod(f"p{i}", phase=ph) for i, ph in enumerate(phases)]


@pytest.mark.parametrize(
    ("phase", "pods", "want"),
    [
        ("", pods_in(), "Pending"),
        ("Pending", pods_in("Pending"), "Pending"),
        ("Pending", pods_in("Pending", "Pending"), "Scheduling"),
        ("Scheduling", pods_in("Running", "Pending"), "Scheduling"),
        ("Scheduling", pods_in("Running", "Running"), "Running"),
        ("Running", pods_in("Running"), "Pending"),
        ("Running", pods_in("Running", "Failed"), "Failed"),
        ("Running", pods_in("Succeeded", "Succeeded"), "Finished"),
        ("Finished", pods_in(), "Finished"),
    ],
)
def test_podgroup_phase_follows_its_pods(phase: str, pods: list[dict], want: str) -> None:
    pg = apis.pod_group("g", NS, 2)
    pg["status"] = {"phase": phase} if phase else {}
    assert next_status(pg, pods)["phase"] == want


def test_status_counts_and_occupied_by() -> None:
    pg = apis.pod_group("g", NS, 2)
    pg["status"] = {"phase": "Pending"}
    pods = pods_in("Pending", "Pending")
    pods[0]["metadata"]["ownerReferences"] = [{"name": "job-b"}, {"name": "job-a"}]
    assert next_status(pg, pods)["occupiedBy"] == "default/job-a,default/job-b"
    pg["status"] = {"phase": "Scheduling"}
    status = next_status(pg, pods_in("Running", "Succeeded", "Failed"))
    assert (status["running"], status["succeeded"], status["failed"]) == (1, 1, 1)
    assert status["phase"] == "Failed"


def test_wait_time_precedence() -> None:
    assert apis.wait_time(apis.pod_group("g", NS, 1, schedule_timeout_seconds=7), 10) == 7
    assert apis.wait_time(apis.pod_group("g", NS, 1), 10) == 10
    assert apis.wait_time(None, None) == 60
