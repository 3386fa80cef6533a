"""gpulab/framework's scheduling cycle over a snapshot: profiles, FitError messages, the
binding cycle, Permit waits (no cluster: fake binder and IO)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from gpulab.framework import config
from gpulab.framework.cache import Cache
from gpulab.framework.interface import SUCCESS, Code, CycleState, Status, unschedulable
from gpulab.framework.objects import GPU, make_node, make_pod, preferred_affinity
from gpulab.framework.plugins import in_tree_registry
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT, FINAL_SCORE_RESULT
from gpulab.framework.queue import SchedulingQueue
from gpulab.framework.runtime import Framework, FrameworkError
from gpulab.framework.schedule_one import Algorithm, FitError, Scheduler
from gpulab.framework.snapshot import new_snapshot
from gpulab.trace import Tracer

NAME = "gpulab-scheduler"


class FakeBinder:
    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, Mapping[str, str]]] = {}
        self.event = threading.Event()

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        self.bound[pod["metadata"]["name"]] = (node, dict(annotations))
        self.event.set()


class FakeIO:
    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.events: list[tuple[str, str, str]] = []
        self.conditions: list[Mapping[str, str]] = []

    def current_pod(self, pod: Mapping[str, Any]) -> dict | None:
        return self.pods.get(pod["metadata"]["name"])

    def record_event(
        self, fwk: Any, pod: Any, reason: str, action: str, note: str, warning: bool
    ) -> None:
        self.events.append((pod["metadata"]["name"], reason, note))

    def update_pod_condition(self, pod: Any, condition: Mapping[str, str]) -> None:
        self.conditions.append(condition)


def framework(
    profile: dict | None = None, registry: Mapping[str, Any] | None = None, binder: Any = None
) -> Framework:
    cfg = config.parse(
        {
            "apiVersion": config.API_VERSION,
            "kind": config.KIND,
            "profiles": [{"schedulerName": NAME, **(profile or {})}],
        }
    )
    import io

    return Framework(
        cfg.profiles[0],
        registry or in_tree_registry(),
        binder=binder,
        tracer=Tracer(NAME, stream=io.StringIO()),
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
    assert schedule(make_pod("p", requests={GPU: 2})) == "gpu-a"  # a tie: first evaluated
    assert schedule(make_pod("p", requests={GPU: 2}), [BUSY_A]) == "gpu-b"
    prefers_a = make_pod(
        "q",
        requests={GPU: 2},
        affinity=preferred_affinity((100, [{"key": "zone", "operator": "In", "values": ["a"]}])),
    )
    assert schedule(prefers_a) == "gpu-a"


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
    ]
    assert schedule(make_pod("p", requests={GPU: 6}, node_name=None), fwk=fwk) in (
        "gpu-b",
        "tainted",
    )


def test_profile_errors_name_the_plugin() -> None:
    with pytest.raises(FrameworkError, match="plugin 'Nope' does not exist"):
        framework({"plugins": {"filter": {"enabled": [{"name": "Nope"}]}}})
    with pytest.raises(FrameworkError, match="exactly one queueSort"):
        framework({"plugins": {"queueSort": {"disabled": [{"name": "*"}]}}})
    with pytest.raises(config.ConfigError, match="unknown extension point"):
        framework({"plugins": {"filters": {}}})


# -- the whole cycle with a queue, a cache and fakes -----------------------------------------


class Gate:
    """A Permit plugin that makes every pod wait until the test allows or rejects it."""

    name = "Gate"

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout

    def Permit(self, state: CycleState, pod: Any, node: str) -> tuple[Status, float]:
        return Status(Code.WAIT), self.timeout


def scheduler_with(fwk: Framework, nodes: list[dict], pods: list[dict]) -> tuple[Scheduler, FakeIO]:
    cache = Cache()
    for n in nodes:
        cache.AddNode(n)
    io_ = FakeIO()
    queue = SchedulingQueue(fwk.QueueSortFunc(), fwk.EventsToRegister())
    for pod in pods:
        io_.pods[pod["metadata"]["name"]] = pod
        queue.Add(pod)
    return Scheduler({NAME: fwk}, queue, cache, io_), io_


def test_schedule_one_binds_with_result_annotations_and_scheduled_event() -> None:
    binder = FakeBinder()
    fwk = framework(binder=binder)
    pod = make_pod("p", requests={GPU: 2}, scheduler=NAME)
    sched, io_ = scheduler_with(fwk, NODES, [pod])
    sched.cache.AddPod(BUSY_A)
    assert sched.ScheduleOne(timeout=1)
    assert binder.event.wait(5)
    node, annotations = binder.bound["p"]
    assert node == "gpu-b"
    import json

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


def test_unschedulable_pod_gets_failed_scheduling_and_condition() -> None:
    fwk = framework(binder=FakeBinder())
    pod = make_pod("p", requests={GPU: 100}, scheduler=NAME)
    sched, io_ = scheduler_with(fwk, NODES, [pod])
    sched.ScheduleOne(timeout=1)
    name, reason, note = io_.events[-1]
    assert (name, reason) == ("p", "FailedScheduling")
    assert note == (
        "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, "
        "1 node(s) had untolerated taint(s), 2 Insufficient nvidia.com/gpu."
    ) or note.startswith("0/4 nodes are available:")
    assert io_.conditions[-1]["reason"] == "Unschedulable"
    assert sched.queue.where(pod) == "unschedulablePods"


def test_permit_wait_holds_resources_until_allowed_or_timed_out() -> None:
    binder = FakeBinder()
    gate = Gate(timeout=2)
    registry = {**in_tree_registry(), "Gate": lambda args, h: gate}
    fwk = framework({"plugins": {"permit": {"enabled": [{"name": "Gate"}]}}}, registry, binder)
    one = [make_node("only", allocatable={GPU: 2})]
    a = make_pod("a", requests={GPU: 2}, scheduler=NAME)
    b = make_pod("b", requests={GPU: 2}, scheduler=NAME)
    sched, io_ = scheduler_with(fwk, one, [a, b])
    sched.ScheduleOne(timeout=1)  # a waits at Permit, its GPUs assumed
    assert fwk.GetWaitingPod(a["metadata"]["uid"]) is not None
    sched.ScheduleOne(timeout=1)  # b does not fit while a holds the node
    assert io_.events[-1][:2] == ("b", "FailedScheduling")
    for t in sched.binding_threads:
        t.join(5)  # a times out at Permit
    assert not binder.bound
    assert (
        "a",
        "FailedScheduling",
        "0/1 nodes are available: 1 rejected due to timeout after waiting 2s at plugin Gate.",
    ) in io_.events
    assert not sched.cache.IsAssumedPod(a)


def test_waiting_pod_allowed_by_every_plugin_binds() -> None:
    binder = FakeBinder()
    registry = {**in_tree_registry(), "Gate": lambda args, h: Gate()}
    fwk = framework({"plugins": {"permit": {"enabled": [{"name": "Gate"}]}}}, registry, binder)
    a = make_pod("a", requests={GPU: 1}, scheduler=NAME)
    sched, _ = scheduler_with(fwk, NODES, [a])
    sched.ScheduleOne(timeout=1)
    wp = fwk.GetWaitingPod(a["metadata"]["uid"])
    assert wp is not None and wp.GetPendingPlugins() == ["Gate"]
    wp.Allow("Gate")
    assert binder.event.wait(5)


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
    sched, io_ = scheduler_with(fwk, NODES, [make_pod("a", scheduler=NAME)])
    sched.ScheduleOne(timeout=1)
    assert calls == ["reserve R1", "reserve R2", "unreserve R2", "unreserve R1"]
    assert io_.events[-1][2].startswith("0/1 nodes are available: 1 no.")
