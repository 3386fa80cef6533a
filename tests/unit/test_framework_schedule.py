"""gpulab/framework's scheduling cycle over a snapshot: profiles, FitError messages, the
default scorers, the binding cycle, Permit waits and nominatedNodeName (no cluster: fake
binder and IO)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import pytest
from framework_fakes import FakeBinder, FakeInformers, scheduler
from framework_fakes import framework as build_framework

from gpulab.framework import config
from gpulab.framework.interface import (
    SUCCESS,
    Code,
    CycleState,
    NodePluginScores,
    NodeScore,
    Status,
    unschedulable,
)
from gpulab.framework.objects import GPU, make_node, make_pod, preferred_affinity
from gpulab.framework.plugins import in_tree_registry
from gpulab.framework.plugins.balancedallocation import BalancedAllocation
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT, FINAL_SCORE_RESULT
from gpulab.framework.plugins.imagelocality import ImageLocality
from gpulab.framework.queue import ACTIVE_Q, UNSCHEDULABLE_Q
from gpulab.framework.runtime import Framework, FrameworkError, Registry, go_duration
from gpulab.framework.schedule_one import Algorithm, FitError, filter_line, score_line
from gpulab.framework.snapshot import NodeInfo, PodInfo, new_snapshot
from gpulab.informer import PODS, SERVICES
from gpulab.trace import Tracer

NAME = "gpulab-scheduler"


def framework(
    profile: dict | None = None,
    registry: Registry | None = None,
    binder: FakeBinder | None = None,
    informers: FakeInformers | None = None,
) -> Framework:
    return build_framework(
        {"schedulerName": NAME, **(profile or {})},
        registry or in_tree_registry(),
        informers or FakeInformers(),
        binder,
    )


NODES = [
    make_node("gpu-a", allocatable={GPU: 4}, labels={"zone": "a"}),
    make_node("gpu-b", allocatable={GPU: 8}, labels={"zone": "b"}),
    make_node("tainted", allocatable={GPU: 8}, taints=[{"key": "x", "effect": "NoSchedule"}]),
    make_node("cpu", labels={"zone": "a"}),
]


def schedule(pod: dict, pods: list[dict] = (), fwk: Framework | None = None) -> str:
    fwk = fwk or framework()
    snap = new_snapshot(NODES, pods)
    fwk.set_snapshot(snap)
    return Algorithm().schedule_pod(fwk, CycleState(), pod, snap).suggested_host


def test_fit_error_message_is_upstreams_histogram() -> None:
    with pytest.raises(FitError) as err:
        schedule(
            make_pod("big", requests={GPU: 6}),
            [make_pod("b", requests={GPU: 4}, node_name="gpu-b")],
        )
    assert err.value.message() == (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), "
        "3 Insufficient nvidia.com/gpu."
    )
    assert err.value.diagnosis.unschedulable_plugins == {"TaintToleration", "NodeResourcesFit"}


def test_prefilter_rejection_is_the_whole_message() -> None:
    pod = make_pod(
        "p",
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["nowhere"]}
                            ]
                        }
                    ]
                }
            }
        },
    )
    with pytest.raises(FitError) as err:
        schedule(pod)
    # the pinned node does not exist: the absent-node status names the plugin
    assert err.value.message() == (
        "0/4 nodes are available: 4 node(s) didn't satisfy plugin(s) ['NodeAffinity']."
    )


BUSY_A = make_pod("busy", requests={"cpu": "16"}, node_name="gpu-a")


def test_scores_pick_the_least_allocated_and_preferred_node() -> None:
    # default scoring resources are cpu and memory (weight 1 each), not GPUs
    assert schedule(make_pod("p", requests={GPU: 2}), [BUSY_A]) == "gpu-b"
    prefers_a = make_pod(
        "q",
        requests={GPU: 2},
        affinity=preferred_affinity((100, [{"key": "zone", "operator": "In", "values": ["a"]}])),
    )
    assert schedule(prefers_a, [BUSY_A]) == "gpu-a"


def test_select_host_is_the_head_of_upstreams_node_score_heap() -> None:
    """selectHost pops a container/heap built over the scores in evaluation order: among
    equal best totals it is not simply the first one evaluated."""

    def pick(*totals: int) -> str:
        return Algorithm.select_host(
            [NodePluginScores(f"n{i}", total_score=t) for i, t in enumerate(totals)]
        )

    assert pick(50, 50, 80, 80) == "n3"  # heap.Init sifts n3 to the top, not n2
    assert pick(80, 50, 80) == "n0"
    assert pick(70, 70, 70) == "n0"
    assert pick(10, 20, 30, 40, 50) == "n4"


def test_most_allocated_strategy_packs() -> None:
    fwk = framework(
        {
            "pluginConfig": [
                {
                    "name": "NodeResourcesFit",
                    "args": {
                        "scoringStrategy": {
                            "type": "MostAllocated",
                            "resources": [{"name": GPU, "weight": 1}],
                        }
                    },
                }
            ]
        }
    )
    assert schedule(make_pod("p", requests={GPU: 2}), fwk=fwk) == "gpu-a"


def test_profile_merge_disables_and_reorders_like_upstream() -> None:
    custom = {
        "plugins": {
            "multiPoint": {"disabled": [{"name": "TaintToleration"}]},
            "filter": {"enabled": [{"name": "NodeName"}]},
        }
    }
    fwk = framework(custom)
    assert [p.name for p in fwk.points["filter"]] == [
        "NodeName",
        "NodeUnschedulable",
        "NodeAffinity",
        "NodeResourcesFit",
        "PodTopologySpread",
    ]
    snap = new_snapshot(NODES, [])
    fwk.set_snapshot(snap)
    feasible, _ = Algorithm().find_nodes_that_fit_pod(
        fwk, CycleState(), make_pod("p", requests={GPU: 6}), snap
    )
    assert {n.name for n in feasible} == {"gpu-b", "tainted"}  # the taint no longer counts


def test_profile_errors_name_the_plugin() -> None:
    with pytest.raises(FrameworkError, match="plugin 'Nope' does not exist"):
        framework({"plugins": {"filter": {"enabled": [{"name": "Nope"}]}}})
    with pytest.raises(FrameworkError, match="exactly one queueSort"):
        framework({"plugins": {"queueSort": {"disabled": [{"name": "*"}]}}})
    with pytest.raises(config.ConfigError, match="unknown extension point"):
        framework({"plugins": {"filters": {}}})


def test_the_profiles_percentage_of_nodes_to_score_wins_over_the_global_one() -> None:
    nodes = [make_node(f"n{i:03d}") for i in range(200)]
    snap = new_snapshot(nodes, [])
    pod = make_pod("p")
    fwk = framework({"percentageOfNodesToScore": 80})
    fwk.set_snapshot(snap)
    result = Algorithm(percentage_of_nodes_to_score=10).schedule_pod(fwk, CycleState(), pod, snap)
    assert result.feasible_nodes == 160  # 80 % of 200; the global 10 % would give 100
    plain = framework()
    plain.set_snapshot(snap)
    result = Algorithm(percentage_of_nodes_to_score=10).schedule_pod(plain, CycleState(), pod, snap)
    assert result.feasible_nodes == 100


def test_a_nominated_node_is_tried_first() -> None:
    busy_b = make_pod("busy", requests={"cpu": "16"}, node_name="gpu-b")
    pod = make_pod("p", requests={GPU: 2})
    assert schedule(pod, [busy_b]) == "gpu-a"
    pod["status"] = {"nominatedNodeName": "gpu-b"}
    fwk = framework()
    snap = new_snapshot(NODES, [busy_b])
    fwk.set_snapshot(snap)
    result = Algorithm().schedule_pod(fwk, CycleState(), pod, snap)
    assert (result.suggested_host, result.evaluated_nodes) == ("gpu-b", 1)


# -- the default scorers upstream has and the lab had not ---------------------------------


def test_balanced_allocation_rewards_what_evens_out_cpu_and_memory() -> None:
    plugin = BalancedAllocation({})
    cpu_heavy = NodeInfo.of(
        make_node("cpu-heavy"),
        [PodInfo.of(make_pod("x", requests={"cpu": "16", "memory": "16Gi"}))],
    )
    empty = NodeInfo.of(make_node("empty"))
    memory_hungry = make_pod("p", requests={"cpu": "1", "memory": "64Gi"})
    state = CycleState()
    assert plugin.PreScore(state, memory_hungry, [cpu_heavy, empty]).is_success()
    # cpu-heavy: without the pod cpu .5, memory .125 -> 100*(1-.1875) = 81; with it
    # .53125 and .625 -> 95; the improvement: 50 + (50 + 95 - 81) // 2 = 82
    assert plugin.Score(state, memory_hungry, cpu_heavy) == (82, SUCCESS)
    # empty: 100 without; .03125 and .5 -> 76 with; 50 + (50 + 76 - 100) // 2 = 63
    assert plugin.Score(state, memory_hungry, empty) == (63, SUCCESS)
    assert plugin.PreScore(CycleState(), make_pod("best-effort"), [empty]).is_skip()


def test_pod_topology_spread_system_defaults_spread_a_services_pods() -> None:
    informers = FakeInformers()
    fwk = framework(informers=informers)
    plugin = fwk.plugins["PodTopologySpread"]
    web = {"app": "web"}
    on_a = [make_pod(f"w{i}", labels=web, node_name="gpu-a") for i in range(2)]
    snap = new_snapshot(NODES, on_a)
    fwk.set_snapshot(snap)
    feasible = [snap.get(n) for n in ("cpu", "gpu-a", "gpu-b")]
    pod = make_pod("new", labels=web)
    assert plugin.PreScore(CycleState(), pod, feasible).is_skip()  # nothing selects it
    service = {"metadata": {"name": "web", "namespace": "default"}, "spec": {"selector": web}}
    informers.add(SERVICES, service)
    state = CycleState()
    assert plugin.PreScore(state, pod, feasible).is_success()
    scores = [plugin.Score(state, pod, n)[0] for n in feasible]
    # hostname, maxSkew 3, 3 nodes: count * log(3 + 2) + 2; no node has a zone label
    assert scores == [2, round(2 * math.log(5) + 2), 2] == [2, 5, 2]
    normalized = [NodeScore(n.name, x) for n, x in zip(feasible, scores, strict=True)]
    plugin.NormalizeScore(state, pod, normalized)
    assert [x.score for x in normalized] == [100, 100 * (5 + 2 - 5) // 5, 100] == [100, 40, 100]
    assert schedule(make_pod("other", labels=web), on_a, fwk) != "gpu-a"


def test_pod_topology_spread_do_not_schedule_filters() -> None:
    fwk = framework()
    spread = {
        "maxSkew": 1,
        "topologyKey": "zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    on_a = [make_pod(f"w{i}", labels={"app": "web"}, node_name="gpu-a") for i in range(2)]
    pod = make_pod("new", labels={"app": "web"}, node_selector={"zone": "a"})
    pod["spec"]["topologySpreadConstraints"] = [spread]
    # nodeAffinityPolicy Honor (the default): only zone a, which the pod selects, counts -
    # it is the global minimum itself, so the skew is 1
    assert schedule(pod, on_a, fwk) in ("cpu", "gpu-a")
    ignore = {**spread, "nodeAffinityPolicy": "Ignore"}
    pod["spec"]["topologySpreadConstraints"] = [ignore]
    with pytest.raises(FitError) as err:
        schedule(pod, on_a, fwk)
    # zone b (0 pods) counts now: a third pod in zone a makes the skew 3 > 1
    assert err.value.message() == (
        "0/4 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint(s), "
        "2 node(s) didn't match pod topology spread constraints."
    )
    snap = new_snapshot(NODES, on_a)
    fwk.set_snapshot(snap)
    state = CycleState()
    plugin = fwk.plugins["PodTopologySpread"]
    plugin.PreFilter(state, pod, snap.list())
    missing_label = plugin.Filter(state, pod, snap.get("tainted"))
    assert missing_label.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE
    assert missing_label.message == (
        "node(s) didn't match pod topology spread constraints (missing required label)"
    )
    # zone a holds 2, zone b 1: maxSkew 2 lets a third pod into zone a - unless
    # minDomains asks for 3 zones, when the global minimum counts as 0
    on_b = make_pod("wb", labels={"app": "web"}, node_name="gpu-b")
    snap = new_snapshot(NODES, [*on_a, on_b])
    for min_domains, fits in ((1, True), (3, False)):
        constraint = {**ignore, "maxSkew": 2, "minDomains": min_domains}
        spread_pod = {**pod, "spec": {**pod["spec"], "topologySpreadConstraints": [constraint]}}
        state = CycleState()
        plugin.PreFilter(state, spread_pod, snap.list())
        assert plugin.Filter(state, spread_pod, snap.get("gpu-a")).is_success() is fits


def test_image_locality_prefers_a_node_with_the_image() -> None:
    size = 500 * 1024 * 1024
    image = {"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": size}
    nodes = [make_node(f"n{i}") for i in range(4)]
    for n in nodes[:2]:
        n["status"]["images"] = [image]
    snap = new_snapshot(nodes, [])
    fwk = framework()
    fwk.set_snapshot(snap)
    plugin = ImageLocality(fwk)
    pod = make_pod("p")  # its container runs registry.k8s.io/pause:3.10
    state = CycleState()
    mb = 1024 * 1024
    # half the nodes have it: 250 MB counts, scaled between 23 MB and 1000 MB
    expected = 100 * (size // 2 - 23 * mb) // (1000 * mb - 23 * mb)
    assert plugin.Score(state, pod, snap.get("n0")) == (expected, SUCCESS) and expected == 23
    assert plugin.Score(state, pod, snap.get("n3")) == (0, SUCCESS)


# -- the whole cycle with a queue, a cache and fakes -----------------------------------------


class Gate:
    """A Permit plugin that makes every pod wait until the test allows or rejects it."""

    name = "Gate"

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout

    def Permit(self, state: CycleState, pod: Any, node: str) -> tuple[Status, float]:
        return Status(Code.WAIT), self.timeout


def with_pods(fwk: Framework, nodes: list[dict], pods: list[dict]):
    informers: FakeInformers = fwk.informers  # type: ignore[assignment]
    sched, io_ = scheduler(fwk, nodes, informers)
    for pod in pods:
        informers.add(PODS, pod)
        sched.queue.Add(pod)
    return sched, io_


def test_schedule_one_binds_with_result_annotations_and_scheduled_event() -> None:
    binder = FakeBinder()
    fwk = framework(binder=binder)
    pod = make_pod("p", requests={GPU: 2}, scheduler=NAME)
    sched, io_ = with_pods(fwk, NODES, [pod])
    sched.cache.AddPod(BUSY_A)
    assert sched.ScheduleOne(timeout=1)
    assert binder.event.wait(5)
    node, annotations = binder.bound["p"]
    assert node == "gpu-b"
    filtered = json.loads(annotations[FILTER_RESULT])
    assert filtered["tainted"] == {
        "NodeUnschedulable": "passed",
        "NodeName": "passed",
        "TaintToleration": "node(s) had untolerated taint(s)",
    }
    assert "gpu-b" in json.loads(annotations[FINAL_SCORE_RESULT])
    for t in sched.binding_threads:
        t.join(5)
    assert ("p", "Scheduled", "Successfully assigned default/p to gpu-b") in io_.events
    assert io_.nominated == []  # it never waited: no nominatedNodeName


def test_unschedulable_pod_gets_failed_scheduling_and_condition() -> None:
    fwk = framework(binder=FakeBinder())
    pod = make_pod("p", requests={GPU: 100}, scheduler=NAME)
    sched, io_ = with_pods(fwk, NODES, [pod])
    sched.ScheduleOne(timeout=1)
    name, reason, note = io_.events[-1]
    assert (name, reason) == ("p", "FailedScheduling")
    assert note == (
        "0/4 nodes are available: 1 node(s) had untolerated taint(s), "
        "3 Insufficient nvidia.com/gpu."
    )
    assert io_.conditions[-1]["reason"] == "Unschedulable"
    assert sched.queue.where(pod) == UNSCHEDULABLE_Q
    assert sched.queue.get(pod).unschedulable_plugins == {"TaintToleration", "NodeResourcesFit"}


def test_a_pod_waiting_at_permit_is_nominated_and_a_timeout_clears_it() -> None:
    binder = FakeBinder()
    gate = Gate(timeout=2)
    registry = {**in_tree_registry(), "Gate": lambda args, h: gate}
    fwk = framework({"plugins": {"permit": {"enabled": [{"name": "Gate"}]}}}, registry, binder)
    one = [make_node("only", allocatable={GPU: 2})]
    a = make_pod("a", requests={GPU: 2}, scheduler=NAME)
    b = make_pod("b", requests={GPU: 2}, scheduler=NAME)
    sched, io_ = with_pods(fwk, one, [a, b])
    sched.ScheduleOne(timeout=1)  # a waits at Permit, its GPUs assumed
    assert fwk.GetWaitingPod(a["metadata"]["uid"]) is not None
    sched.ScheduleOne(timeout=1)  # b does not fit while a holds the node
    assert io_.events[-1][:2] == ("b", "FailedScheduling")
    assert sched.queue.where(b) == UNSCHEDULABLE_Q  # NodeResourcesFit rejected it
    for t in sched.binding_threads:
        t.join(5)  # a times out at Permit
    assert not binder.bound
    assert io_.nominated == [("a", "only"), ("a", "")]  # set while waiting, then cleared
    assert (
        "a",
        "FailedScheduling",
        "0/1 nodes are available: 1 rejected due to timeout after waiting 2s at plugin Gate.",
    ) in io_.events
    assert not sched.cache.IsAssumedPod(a)
    # a's rejection is no event for a itself: it waits for what Gate registered (every
    # event), but its own un-assume is sent after it is back in the queue, not before -
    # while b, which NodeResourcesFit rejected, is moved by it
    assert sched.queue.where(a) == UNSCHEDULABLE_Q
    assert sched.queue.where(b) == ACTIVE_Q  # its 1 s backoff is over


def test_permit_timeouts_read_as_go_durations() -> None:
    assert [go_duration(x) for x in (0, 0.5, 2, 60, 90, 3600)] == [
        "0s",
        "500ms",
        "2s",
        "1m0s",
        "1m30s",
        "1h0m0s",
    ]
    binder = FakeBinder()
    registry = {**in_tree_registry(), "Gate": lambda args, h: Gate(timeout=0.05)}
    fwk = framework({"plugins": {"permit": {"enabled": [{"name": "Gate"}]}}}, registry, binder)
    sched, io_ = with_pods(fwk, NODES, [make_pod("a", scheduler=NAME)])
    sched.ScheduleOne(timeout=1)
    for t in sched.binding_threads:
        t.join(5)
    assert io_.events[-1][2] == (
        "0/1 nodes are available: 1 rejected due to timeout after waiting 50ms at plugin Gate."
    )


def test_waiting_pod_allowed_by_every_plugin_binds() -> None:
    binder = FakeBinder()
    registry = {**in_tree_registry(), "Gate": lambda args, h: Gate()}
    fwk = framework({"plugins": {"permit": {"enabled": [{"name": "Gate"}]}}}, registry, binder)
    a = make_pod("a", requests={GPU: 1}, scheduler=NAME)
    sched, io_ = with_pods(fwk, NODES, [a])
    sched.ScheduleOne(timeout=1)
    wp = fwk.GetWaitingPod(a["metadata"]["uid"])
    assert wp is not None and wp.GetPendingPlugins() == ["Gate"]
    wp.Allow("Gate")
    assert binder.event.wait(5)
    for t in sched.binding_threads:
        t.join(5)
    node = binder.bound["a"][0]
    assert io_.nominated == [("a", node)]


def test_reserve_rejection_unreserves_in_reverse_order() -> None:
    calls: list[str] = []

    class R:
        def __init__(self, name: str, ok: bool) -> None:
            self.name, self.ok = name, ok

        def Reserve(self, state: Any, pod: Any, node: str) -> Status:
            calls.append(f"reserve {self.name}")
            return SUCCESS if self.ok else unschedulable("no")

        def Unreserve(self, state: Any, pod: Any, node: str) -> None:
            calls.append(f"unreserve {self.name}")

    registry = {
        **in_tree_registry(),
        "R1": lambda a, h: R("R1", True),
        "R2": lambda a, h: R("R2", False),
    }
    fwk = framework(
        {"plugins": {"reserve": {"enabled": [{"name": "R1"}, {"name": "R2"}]}}},
        registry,
        FakeBinder(),
    )
    sched, io_ = with_pods(fwk, NODES, [make_pod("a", scheduler=NAME)])
    sched.ScheduleOne(timeout=1)
    assert calls == ["reserve R1", "reserve R2", "unreserve R2", "unreserve R1"]
    assert io_.events[-1][2] == "0/1 nodes are available: 1 no."


# -- eventhandlers.go: which informer changes are which cluster events ----------------------


def test_informer_changes_become_upstreams_cluster_events(monkeypatch) -> None:
    from kubernetes import client

    from gpulab.framework import scheduler as process_module

    trace = io.StringIO()
    monkeypatch.setattr(process_module, "Tracer", lambda name, api: Tracer(name, stream=trace))
    cfg = config.parse({"apiVersion": config.API_VERSION, "kind": config.KIND})
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # never called
    process = process_module.SchedulerProcess(cfg, in_tree_registry(), api, "test")
    queue = process.queue
    node = make_node("n", allocatable={GPU: 2})
    process._node_added(node)
    waiting = make_pod("p", requests={GPU: 2}, scheduler="default-scheduler")
    process._pod_added(waiting)
    qpi = queue.Pop(0)
    qpi.unschedulable_plugins = {"NodeResourcesFit"}
    assert queue.AddUnschedulableIfNotPresent(qpi) == UNSCHEDULABLE_Q

    def changed(obj: dict, **fields: Any) -> dict:
        meta = {**obj["metadata"], "resourceVersion": str(len(fields))}
        return {**obj, **fields, "metadata": meta}

    # a heartbeat, a bound pod turning Running: nothing the hints are asked about
    beat = changed(node, status={**node["status"], "conditions": [{"type": "Ready"}]})
    process._node_updated(node, beat)
    bound = make_pod("b", requests={GPU: 1}, node_name="n")
    process._pod_added(bound)
    process._pod_updated(bound, changed(bound, status={"phase": "Running"}))
    assert queue.where(waiting) == UNSCHEDULABLE_Q
    # an unscheduled pod losing its nominated node frees that node for pods of no higher
    # priority: an AssignedPodDelete, which NodeResourcesFit's hint answers with Queue
    other = make_pod("o", scheduler="default-scheduler", priority=0)
    other["status"] = {"nominatedNodeName": "n"}
    process.queue.Add(other)
    process._pod_updated(other, changed(other, status={}))
    assert queue.where(waiting) != UNSCHEDULABLE_Q
    assert "AssignedPodDelete: NodeResourcesFit says Queue" in trace.getvalue()


def test_the_score_step_names_what_decided() -> None:
    scores = {
        "a": {"NodeResourcesFit": 67, "NodeResourcesBalancedAllocation": 72, "X": 300},
        "b": {"NodeResourcesFit": 66, "NodeResourcesBalancedAllocation": 78, "X": 300},
    }
    assert score_line("b", scores) == (
        "b wins: b=444, a=439; against a: NodeResourcesFit 66 vs 67, "
        "NodeResourcesBalancedAllocation 78 vs 72"
    )
    # equal totals: a tie, said first; the lab's heap head is not necessarily kube-scheduler's
    scores["a"]["X"] = 305
    tie_note = (
        " (the tie is broken by the score heap's order: b is its head here; kube-scheduler's "
        "heap has no random tie-breaker without an extender, so the order its parallel "
        "Filter found the nodes decides: it may take a)"
    )
    assert score_line("b", scores) == (
        "a tie at 444; b wins: b=444, a=444; against a: NodeResourcesFit 66 vs 67, "
        "NodeResourcesBalancedAllocation 78 vs 72, X 300 vs 305" + tie_note
    )
    same = {"a": {"NodeResourcesFit": 50}, "b": {"NodeResourcesFit": 50}, "c": {"X": 10}}
    assert score_line("b", same) == (
        "a tie at 50; b wins: b=50, a=50, c=10; against a: the same per plugin" + tie_note
    )


def test_the_filter_step_names_each_reason_once_with_the_nodes_it_rejected() -> None:
    affinity = "NodeAffinity: node(s) didn't match Pod's node affinity/selector"
    rejected = {
        "cpu-only": affinity,
        "gpu-a100": affinity,
        "gpu-t4-0": "NodeResourcesFit: Insufficient nvidia.com/gpu",
        "gpu-h100": affinity,
    }
    assert filter_line(["gpu-t4-1"], 5, rejected) == (
        "1/5 nodes fit (gpu-t4-1); "
        f"3 nodes (cpu-only, gpu-a100, gpu-h100): {affinity}; "
        "gpu-t4-0: NodeResourcesFit: Insufficient nvidia.com/gpu"
    )
    assert filter_line([], 1, {"n1": affinity}) == f"0/1 nodes fit; n1: {affinity}"
