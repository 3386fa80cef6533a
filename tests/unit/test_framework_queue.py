"""The scheduling queue (pure, with a fake clock): order, backoff, requeue on events."""

from __future__ import annotations

from gpulab.framework.interface import NODE, POD, ActionType, ClusterEvent, QueuedPodInfo
from gpulab.framework.objects import make_pod
from gpulab.framework.plugins.queuesort import PrioritySort
from gpulab.framework.queue import (
    ACTIVE_Q,
    BACKOFF_Q,
    UNSCHEDULABLE_Q,
    SchedulingQueue,
    is_pod_updated,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


EVENTS = [
    (ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_ALLOCATABLE), "NodeResourcesFit"),
    (ClusterEvent(POD, ActionType.DELETE), "NodeResourcesFit"),
    (ClusterEvent(NODE, ActionType.ADD | ActionType.UPDATE_NODE_TAINT), "TaintToleration"),
]


def queue(clock: Clock) -> SchedulingQueue:
    return SchedulingQueue(PrioritySort().Less, EVENTS, 1.0, 10.0, clock)


def fail(q: SchedulingQueue, qpi: QueuedPodInfo, *plugins: str) -> str:
    qpi.unschedulable_plugins = set(plugins)
    return q.AddUnschedulableIfNotPresent(qpi, q.SchedulingCycle())


def test_pop_order_is_priority_then_arrival() -> None:
    clock = Clock()
    q = queue(clock)
    for name, prio in (("low", 0), ("high", 100), ("low2", 0)):
        clock.now += 1
        q.Add(make_pod(name, priority=prio))
    assert q.PendingPods()[ACTIVE_Q] == ["default/high", "default/low", "default/low2"]
    assert [q.Pop(0).pod["metadata"]["name"] for _ in range(3)] == ["high", "low", "low2"]
    assert q.Pop(timeout=0.01) is None


def test_rejected_pod_waits_for_an_event_its_plugin_registered() -> None:
    clock = Clock()
    q = queue(clock)
    pod = make_pod("p")
    q.Add(pod)
    qpi = q.Pop(0)
    assert fail(q, qpi, "NodeResourcesFit") == UNSCHEDULABLE_Q
    # a taint change interests only TaintToleration: the pod stays
    assert q.MoveAllToActiveOrBackoffQueue(ClusterEvent(NODE, ActionType.UPDATE_NODE_TAINT)) == []
    # a deleted pod may free resources: back, through backoff (1s after one failure)
    assert q.MoveAllToActiveOrBackoffQueue(ClusterEvent("AssignedPod", ActionType.DELETE)) == [
        "default/p"
    ]
    assert q.where(pod) == BACKOFF_Q
    clock.now += 0.5
    q.flush_backoff_completed()
    assert q.where(pod) == BACKOFF_Q
    clock.now += 0.6
    q.flush_backoff_completed()
    assert q.where(pod) == ACTIVE_Q


def test_backoff_doubles_up_to_the_maximum() -> None:
    q = queue(Clock())
    assert [q.backoff_duration(n) for n in (0, 1, 2, 3, 4, 5, 9)] == [0, 1, 2, 4, 8, 10, 10]


def test_event_during_the_attempt_sends_the_pod_to_backoff_not_unschedulable() -> None:
    clock = Clock()
    q = queue(clock)
    q.Add(make_pod("p"))
    qpi = q.Pop(0)
    cycle = q.SchedulingCycle()
    q.MoveAllToActiveOrBackoffQueue(ClusterEvent(NODE, ActionType.ADD))  # while in flight
    qpi.unschedulable_plugins = {"NodeResourcesFit"}
    assert q.AddUnschedulableIfNotPresent(qpi, cycle) == BACKOFF_Q


def test_an_error_without_rejecting_plugins_goes_to_backoff() -> None:
    q = queue(Clock())
    q.Add(make_pod("p"))
    qpi = q.Pop(0)
    assert fail(q, qpi) == BACKOFF_Q
    assert qpi.consecutive_errors_count == 1


def test_activate_and_leftover_flush() -> None:
    clock = Clock()
    q = queue(clock)
    a, b = make_pod("a"), make_pod("b")
    q.Add(a)
    q.Add(b)
    fail(q, q.Pop(0), "X")
    fail(q, q.Pop(0), "X")
    assert q.Activate({"default/a": a}) == ["default/a"]
    assert q.where(a) == ACTIVE_Q and q.where(b) == UNSCHEDULABLE_Q
    clock.now += 301
    q.flush_unschedulable_leftover()
    assert q.where(b) == ACTIVE_Q


def test_updates_requeue_only_real_changes_and_gates_hold_pods() -> None:
    clock = Clock()
    q = queue(clock)
    pod = make_pod("p")
    q.Add(pod)
    qpi = q.Pop(0)
    fail(q, qpi, "NodeResourcesFit")
    status_only = {
        **pod,
        "status": {"conditions": [{"type": "PodScheduled"}]},
        "metadata": {**pod["metadata"], "resourceVersion": "9"},
    }
    assert not is_pod_updated(pod, status_only)
    q.Update(pod, status_only)
    assert q.where(pod) == UNSCHEDULABLE_Q
    relabeled = {**pod, "metadata": {**pod["metadata"], "labels": {"x": "y"}}}
    clock.now += 5
    q.Update(pod, relabeled)
    assert q.where(pod) == ACTIVE_Q
    gated = make_pod("g")
    gated["spec"]["schedulingGates"] = [{"name": "wait"}]
    q.Add(gated)
    assert q.where(gated) == UNSCHEDULABLE_Q
    ungated = {**gated, "spec": {**gated["spec"], "schedulingGates": []}}
    q.Update(gated, ungated)
    assert q.where(gated) == ACTIVE_Q


def test_in_flight_pods_are_not_queued_twice() -> None:
    q = queue(Clock())
    pod = make_pod("p")
    q.Add(pod)
    q.Pop(0)
    q.Add(pod)
    q.Update(pod, {**pod, "metadata": {**pod["metadata"], "labels": {"a": "b"}}})
    assert q.where(pod) is None
    q.Done(pod["metadata"]["uid"])
    q.Add(pod)
    assert q.where(pod) == ACTIVE_Q
