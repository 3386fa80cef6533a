"""The scheduling queue (pure, with a fake clock): order, backoff windows, PopFromBackoffQ,
queueing hints of the in-tree plugins, in-flight events, PreEnqueue gates."""

from __future__ import annotations

import functools

from gpulab.framework import objects
from gpulab.framework.events import (
    EVENT_ASSIGNED_POD_DELETE,
    EVENT_NODE_ADD,
    NODE,
    POD,
    UNSCHEDULED_POD,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    match_cluster_events,
    node_scheduling_properties_change,
    pod_scheduling_properties_change,
)
from gpulab.framework.interface import QueuedPodInfo
from gpulab.framework.objects import GPU, make_node
from gpulab.framework.plugins.nodeaffinity import NodeAffinity
from gpulab.framework.plugins.noderesources import Fit
from gpulab.framework.plugins.nodeunschedulable import NodeUnschedulable
from gpulab.framework.plugins.podtopologyspread import PodTopologySpread
from gpulab.framework.plugins.queuesort import PrioritySort
from gpulab.framework.plugins.schedulinggates import SchedulingGates
from gpulab.framework.plugins.tainttoleration import TaintToleration
from gpulab.framework.queue import (
    ACTIVE_Q,
    BACKOFF_Q,
    UNSCHEDULABLE_Q,
    SchedulingQueue,
    build_queueing_hint_map,
)

PROFILE = "default-scheduler"


make_pod = functools.partial(objects.make_pod, scheduler=PROFILE)  # a pod of the profile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Waits:
    """A Permit-like plugin that registered one event (no hint: always Queue)."""

    name = "Waits"

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        return [ClusterEventWithHint(ClusterEvent("podgroups.v1alpha1.x", ActionType.UPDATE))]


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def __call__(self, qpi: QueuedPodInfo, event: ClusterEvent, where: str, why: str) -> None:
        self.seen.append((qpi.key, event.label, where, why))


def queue(clock: Clock, recorder: Recorder | None = None) -> SchedulingQueue:
    plugins = [
        Fit({}),
        TaintToleration(),
        NodeAffinity({}),
        NodeUnschedulable(),
        PodTopologySpread({"defaultingType": "List"}, None),  # List without any: no listers
        SchedulingGates(),
        Waits(),
    ]
    hints = build_queueing_hint_map(plugins)
    return SchedulingQueue(
        PrioritySort().Less,
        {PROFILE: hints},
        {PROFILE: [SchedulingGates()]},
        1.0,
        10.0,
        clock,
        recorder,
    )


def fail(q: SchedulingQueue, qpi: QueuedPodInfo, *plugins: str, pending: str = "") -> str:
    qpi.unschedulable_plugins = set(plugins)
    qpi.pending_plugins = {pending} if pending else set()
    return q.AddUnschedulableIfNotPresent(qpi)


def rejected(q: SchedulingQueue, pod: dict, *plugins: str) -> QueuedPodInfo:
    q.Add(pod)
    qpi = q.Pop(0)
    assert qpi is not None and qpi.uid == pod["metadata"]["uid"]
    assert fail(q, qpi, *plugins) == UNSCHEDULABLE_Q
    return qpi


def test_pop_order_is_priority_then_arrival() -> None:
    clock = Clock()
    q = queue(clock)
    for name, prio in (("low", 0), ("high", 100), ("low2", 0)):
        clock.now += 1
        q.Add(make_pod(name, priority=prio))
    assert q.PendingPods()[ACTIVE_Q] == ["default/high", "default/low", "default/low2"]
    assert [q.Pop(0).pod["metadata"]["name"] for _ in range(3)] == ["high", "low", "low2"]
    assert q.Pop(timeout=0.01) is None


def test_a_pod_entering_active_q_gets_its_initial_attempt_timestamp() -> None:
    clock = Clock()
    q = queue(clock)
    pod = make_pod("p")
    q.Add(pod)
    assert q.get(pod).initial_attempt_timestamp == 1000.0
    clock.now += 5
    fail(q, q.Pop(0), "NodeResourcesFit")
    q.Activate({"default/p": pod})
    assert q.get(pod).initial_attempt_timestamp == 1000.0  # kept from the first entry


def test_a_deleted_pod_requeues_what_node_resources_fit_rejected_only_if_it_held_a_node() -> None:
    clock = Clock()
    recorder = Recorder()
    q = queue(clock, recorder)
    pod = make_pod("p", requests={GPU: 2})
    rejected(q, pod, "NodeResourcesFit")
    unscheduled = make_pod("never-bound", requests={GPU: 2})
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, unscheduled, None) == []
    assert recorder.seen[-1] == (
        "default/p",
        "AssignedPodDelete",
        UNSCHEDULABLE_Q,
        "NodeResourcesFit says QueueSkip",
    )
    bound = make_pod("bound", requests={GPU: 2}, node_name="n1")
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, bound, None) == ["default/p"]
    assert q.where(pod) == BACKOFF_Q  # one failure: backoff 1 s


def test_a_label_change_on_a_pod_node_resources_fit_rejected_does_not_requeue_it() -> None:
    clock = Clock()
    recorder = Recorder()
    q = queue(clock, recorder)
    pod = make_pod("p", requests={GPU: 2})
    rejected(q, pod, "NodeResourcesFit")
    clock.now += 30  # long past its backoff
    relabeled = {**pod, "metadata": {**pod["metadata"], "labels": {"x": "y"}}}
    q.Update(pod, relabeled)
    assert q.where(pod) == UNSCHEDULABLE_Q
    assert recorder.seen[-1][1:] == (
        "UnschedulablePodUpdatePodLabel",
        UNSCHEDULABLE_Q,
        "no rejector (NodeResourcesFit) registered for it",
    )
    # a new toleration for a pod TaintToleration rejected is what its hint waits for
    tainted_out = make_pod("t")
    rejected(q, tainted_out, "TaintToleration")
    clock.now += 30
    tolerating = {
        **tainted_out,
        "spec": {**tainted_out["spec"], "tolerations": [{"key": "x", "operator": "Exists"}]},
    }
    q.Update(tainted_out, tolerating)
    assert q.where(tainted_out) == ACTIVE_Q


def test_node_hints_of_fit_and_taint_toleration() -> None:
    clock = Clock()
    q = queue(clock)
    pod = make_pod("p", requests={GPU: 4})
    rejected(q, pod, "NodeResourcesFit")
    small = make_node("n", allocatable={GPU: 2})
    grown = make_node("n", allocatable={GPU: 8})
    relabeled = make_node("n", allocatable={GPU: 8}, labels={"a": "b"})
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_NODE_ADD, None, small) == []
    label_change = ClusterEvent(NODE, ActionType.UPDATE_NODE_LABEL)
    assert q.MoveAllToActiveOrBackoffQueue(label_change, grown, relabeled) == []
    grew = ClusterEvent(NODE, ActionType.UPDATE_NODE_ALLOCATABLE)
    assert q.MoveAllToActiveOrBackoffQueue(grew, small, grown) == ["default/p"]
    # upstream's mitigation for kubernetes#109437: a plugin registering Node/Add gets
    # Node/UpdateNodeTaint with the default hint, so any taint change requeues
    other = make_pod("o", requests={GPU: 4})
    rejected(q, other, "NodeResourcesFit")
    taint_change = ClusterEvent(NODE, ActionType.UPDATE_NODE_TAINT)
    assert q.MoveAllToActiveOrBackoffQueue(taint_change, small, small) == ["default/o"]
    # TaintToleration asks whether the node went from untolerated to tolerated
    t = make_pod("t")
    rejected(q, t, "TaintToleration")
    tainted = make_node("m", taints=[{"key": "k", "effect": "NoSchedule"}])
    still = make_node("m", taints=[{"key": "k", "effect": "NoExecute"}])
    clean = make_node("m")
    assert q.MoveAllToActiveOrBackoffQueue(taint_change, tainted, still) == []
    assert q.MoveAllToActiveOrBackoffQueue(taint_change, still, clean) == ["default/t"]


def test_node_hints_of_node_affinity_unschedulable_and_spread() -> None:
    clock = Clock()
    recorder = Recorder()
    q = queue(clock, recorder)

    def skipped_by(plugin: str) -> bool:
        return recorder.seen[-1][2:] == (UNSCHEDULABLE_Q, f"{plugin} says QueueSkip")

    # NodeAffinity asks whether the node went from not matching the pod to matching it
    label_change = ClusterEvent(NODE, ActionType.UPDATE_NODE_LABEL)
    rejected(q, make_pod("picky", node_selector={"zone": "a"}), "NodeAffinity")
    in_b, in_c = make_node("n", labels={"zone": "b"}), make_node("n", labels={"zone": "c"})
    assert q.MoveAllToActiveOrBackoffQueue(label_change, in_b, in_c) == []
    assert skipped_by("NodeAffinity")
    # a node that matched already: upstream's wasMatched -> QueueSkip
    in_a = make_node("m", labels={"zone": "a"})
    in_a_racked = make_node("m", labels={"zone": "a", "rack": "r1"})
    assert q.MoveAllToActiveOrBackoffQueue(label_change, in_a, in_a_racked) == []
    assert skipped_by("NodeAffinity")
    moved_to_a = make_node("n", labels={"zone": "a"})
    assert q.MoveAllToActiveOrBackoffQueue(label_change, in_b, moved_to_a) == ["default/picky"]

    # NodeUnschedulable: an uncordon (an UpdateNodeTaint event) helps, a cordoned new node not
    rejected(q, make_pod("cordoned-out"), "NodeUnschedulable")
    cordoned = make_node("c", unschedulable=True)
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_NODE_ADD, None, cordoned) == []
    assert skipped_by("NodeUnschedulable")
    uncordon = ClusterEvent(NODE, ActionType.UPDATE_NODE_TAINT)
    assert q.MoveAllToActiveOrBackoffQueue(uncordon, cordoned, make_node("c")) == [
        "default/cordoned-out"
    ]

    # PodTopologySpread counts the bound pods of the pod's own namespace only
    spread = make_pod("spread", labels={"app": "web"})
    spread["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    rejected(q, spread, "PodTopologySpread")
    elsewhere = make_pod("web-0", "other", labels={"app": "web"}, node_name="n")
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, elsewhere, None) == []
    assert skipped_by("PodTopologySpread")
    here = make_pod("web-1", labels={"app": "web"}, node_name="n")
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, here, None) == [
        "default/spread"
    ]


def test_backoff_doubles_up_to_the_maximum() -> None:
    q = queue(Clock())
    assert [q.backoff_duration(n) for n in (0, 1, 2, 3, 4, 5, 9)] == [0, 1, 2, 4, 8, 10, 10]


def test_backoff_expirations_are_aligned_to_one_second_windows() -> None:
    clock = Clock()
    q = queue(clock)
    pod = make_pod("p")
    q.Add(pod)
    qpi = q.Pop(0)
    clock.now = 1000.3
    fail(q, qpi)  # an error: 1 s of backoff, from 1000.3 -> the window of 1001
    assert q.where(pod) == BACKOFF_Q
    assert qpi.backoff_expiration == 1001.0
    clock.now = 1001.95  # the pod's own window is still the current one: backing off
    q.flush_backoff_completed()
    assert q.where(pod) == BACKOFF_Q
    clock.now = 1002.0
    q.flush_backoff_completed()
    assert q.where(pod) == ACTIVE_Q


def test_pop_takes_the_head_of_backoff_q_when_active_q_is_empty() -> None:
    clock = Clock()
    q = queue(clock)
    a, b, err = make_pod("a"), make_pod("b"), make_pod("err")
    for pod in (a, b, err):
        q.Add(pod)
    qa, qb, qe = q.Pop(0), q.Pop(0), q.Pop(0)
    fail(q, qb, "NodeResourcesFit")  # backoff window 1001
    clock.now += 1
    fail(q, qa, "NodeResourcesFit")  # window 1002
    fail(q, qe)  # an error: the error backoff queue, never popped early
    bound = make_pod("bound", node_name="n")
    q.MoveAllToActiveOrBackoffQueue(EVENT_ASSIGNED_POD_DELETE, bound, None)
    assert q.where(a) == q.where(b) == q.where(err) == BACKOFF_Q
    assert q.PendingPods()[ACTIVE_Q] == []
    # still backing off, but the scheduler would sit idle: b (earliest window) first
    assert q.Pop(0).key == "default/b"
    assert q.Pop(0).key == "default/a"
    assert q.Pop(timeout=0.01) is None
    assert q.where(err) == BACKOFF_Q


def test_an_event_seen_in_flight_is_replayed_through_the_hints() -> None:
    clock = Clock()
    q = queue(clock)
    helped, unhelped = make_pod("helped"), make_pod("unhelped")
    q.Add(helped)
    q.Add(unhelped)
    qh, qu = q.Pop(0), q.Pop(0)
    # while both are being scheduled, a node label changes and a bound pod goes away
    q.MoveAllToActiveOrBackoffQueue(ClusterEvent(NODE, ActionType.UPDATE_NODE_LABEL), None, None)
    q.MoveAllToActiveOrBackoffQueue(
        EVENT_ASSIGNED_POD_DELETE, make_pod("gone", node_name="n"), None
    )
    assert fail(q, qh, "NodeResourcesFit") == BACKOFF_Q  # the delete may help it
    assert fail(q, qu, "TaintToleration") == UNSCHEDULABLE_Q  # neither helps it


def test_a_pending_plugins_queue_hint_skips_backoff() -> None:
    clock = Clock()
    q = queue(clock)
    pod = make_pod("p")
    q.Add(pod)
    assert fail(q, q.Pop(0), pending="Waits") == UNSCHEDULABLE_Q
    q.MoveAllToActiveOrBackoffQueue(ClusterEvent("podgroups.v1alpha1.x", ActionType.UPDATE))
    assert q.where(pod) == ACTIVE_Q


def test_an_error_without_rejecting_plugins_goes_to_backoff() -> None:
    q = queue(Clock())
    q.Add(make_pod("p"))
    qpi = q.Pop(0)
    assert fail(q, qpi) == BACKOFF_Q
    assert qpi.consecutive_errors_count == 1


def test_activate_leftover_flush_and_force_activate_in_flight() -> None:
    clock = Clock()
    q = queue(clock)
    a, b, c = make_pod("a"), make_pod("b"), make_pod("c")
    for pod in (a, b, c):
        q.Add(pod)
    fail(q, q.Pop(0), "TaintToleration")
    fail(q, q.Pop(0), "TaintToleration")
    qc = q.Pop(0)  # in flight
    assert q.Activate({"default/a": a, "default/c": c}) == ["default/a"]
    assert q.where(a) == ACTIVE_Q and q.where(b) == UNSCHEDULABLE_Q
    # c was in flight: the ForceActivate it missed brings it back when it fails
    assert fail(q, qc, "TaintToleration") == BACKOFF_Q
    clock.now += 301
    q.flush_unschedulable_leftover()
    assert q.where(b) == ACTIVE_Q


def test_scheduling_gates_hold_a_pod_until_they_are_removed() -> None:
    clock = Clock()
    q = queue(clock)
    gated = make_pod("g")
    gated["spec"]["schedulingGates"] = [{"name": "wait"}]
    q.Add(gated)
    assert q.where(gated) == UNSCHEDULABLE_Q
    qpi = q.get(gated)
    assert qpi.gating_plugin == "SchedulingGates"
    assert q.MoveAllToActiveOrBackoffQueue(EVENT_NODE_ADD, None, make_node("n")) == []
    relabeled = {**gated, "metadata": {**gated["metadata"], "labels": {"a": "b"}}}
    q.Update(gated, relabeled)
    assert q.where(gated) == UNSCHEDULABLE_Q
    ungated = {**relabeled, "spec": {**relabeled["spec"], "schedulingGates": []}}
    q.Update(relabeled, ungated)
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


def test_cluster_events_match_the_same_or_a_more_specific_event() -> None:
    node_update = ClusterEvent(NODE, ActionType.UPDATE)
    label = ClusterEvent(NODE, ActionType.UPDATE_NODE_LABEL)
    assert match_cluster_events(node_update, label)
    assert not match_cluster_events(label, node_update)
    assert match_cluster_events(ClusterEvent(POD, ActionType.DELETE), EVENT_ASSIGNED_POD_DELETE)
    wildcard = ClusterEvent("*", ActionType.ALL, "UnschedulableTimeout")
    assert not match_cluster_events(node_update, wildcard)
    assert match_cluster_events(ClusterEvent("*", ActionType.ALL), label)


def test_what_counts_as_a_node_or_pod_change() -> None:
    node = make_node("n")
    node["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}
    ]
    beat = {
        **node,
        "status": {
            **node["status"],
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:10Z"}
            ],
        },
    }
    assert node_scheduling_properties_change(beat, node) == []
    same_cpu = {
        **node,
        "status": {
            **node["status"],
            "allocatable": {**node["status"]["allocatable"], "cpu": "32000m"},
        },
    }
    assert node_scheduling_properties_change(same_cpu, node) == []
    cordoned = {**node, "spec": {"unschedulable": True}}
    assert node_scheduling_properties_change(cordoned, node) == []  # only uncordon counts
    assert node_scheduling_properties_change(node, cordoned) == [
        ClusterEvent(NODE, ActionType.UPDATE_NODE_TAINT)
    ]
    pod = make_pod("p", requests={"cpu": "2"})
    status_only = {**pod, "status": {"phase": "Pending"}}
    assert pod_scheduling_properties_change(status_only, pod) == [
        ClusterEvent(UNSCHEDULED_POD, ActionType.UPDATE)
    ]
    smaller = make_pod("p", requests={"cpu": "1"}, labels={"a": "b"})
    assert {e.action_type for e in pod_scheduling_properties_change(smaller, pod)} == {
        ActionType.UPDATE_POD_LABEL,
        ActionType.UPDATE_POD_SCALE_DOWN,
    }
