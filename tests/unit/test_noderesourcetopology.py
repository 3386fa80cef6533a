"""NodeResourceTopologyMatch (Filter, Score strategies), the node agent's Topology Manager
and the topology updater's zones - all pure, on the same machine descriptions."""

from __future__ import annotations

from decimal import Decimal

import pytest
from framework_fakes import FakeInformers, framework

from gpulab.framework.interface import SUCCESS, CycleState
from gpulab.framework.objects import GPU, make_node, make_pod
from gpulab.framework.runtime import FrameworkError, results_of
from gpulab.framework.snapshot import NodeInfo
from gpulab.nodeagent import policy, topology
from gpulab.schedulerplugins.commands import registry
from gpulab.schedulerplugins.noderesourcetopology import score
from gpulab.schedulerplugins.noderesourcetopology.filter import FilterInfo, filter_numa
from gpulab.schedulerplugins.noderesourcetopology.numaresources import (
    NODE_RESOURCE_TOPOLOGIES,
    NUMANode,
    create_numa_node_list,
    ignored_zones,
    topology_manager_of,
)
from gpulab.topologyupdater.aggregate import aggregate, node_resource_topology

GIB = 2**30
KUBELET = topology.KubeletConfig("single-numa-node", "container", "static", "Static")


def machine(
    name: str, profile: str, cpus: int = 64, memory: int = 512 * GIB
) -> topology.MachineInfo:
    return topology.MachineInfo.of(name, profile, cpus, memory)


def nrt(
    name: str, m: topology.MachineInfo, pods: list[dict] = (), cfg: topology.KubeletConfig = KUBELET
) -> dict:
    return node_resource_topology(name, cfg, aggregate(m, pods))


def guaranteed(name: str, gpus: int, cpus: int, mem: str = "16Gi", **kw) -> dict:
    limits = {GPU: gpus, "cpu": cpus, "memory": mem}
    return make_pod(name, requests=limits, limits=limits, **kw)


A100 = machine("gpu-a100", "a100-sxm4-40gb-x8")
T4 = machine("gpu-t4", "t4-x4")
H100_16 = machine("gpu-h100", "h100-80gb-x8", cpus=16, memory=256 * GIB)


def node_info(name: str, m: topology.MachineInfo) -> NodeInfo:
    gpus = len(m.devices)
    cpus = sum(n.cpus for n in m.numa_nodes)
    return NodeInfo.of(make_node(name, allocatable={GPU: gpus, "cpu": cpus, "memory": "512Gi"}))


def test_machine_splits_cpus_and_memory_over_the_gpus_numa_nodes() -> None:
    assert [(n.id, n.cpus, n.memory) for n in A100.numa_nodes] == [
        (0, 32, 256 * GIB),
        (1, 32, 256 * GIB),
    ]
    assert sorted(A100.devices.values()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert A100.numa_nodes[0].distances == {0: 10, 1: 20}


def test_machine_info_and_kubelet_config_round_trip(tmp_path) -> None:
    (tmp_path / "machine.yaml").write_text(T4.to_yaml())
    (tmp_path / "config.yaml").write_text(KUBELET.to_yaml())
    assert topology.MachineInfo.load(tmp_path / "machine.yaml") == T4
    assert topology.KubeletConfig.load(tmp_path / "config.yaml") == KUBELET
    assert topology.KubeletConfig.load(tmp_path / "missing.yaml").topology_manager_policy == "none"


def test_zones_subtract_what_the_pods_were_given() -> None:
    uuids = sorted(u for u, n in A100.devices.items() if n == 1)[:3]
    rec = policy.ContainerRecord(devices={GPU: uuids})
    pod = make_pod(
        "p",
        annotations={
            policy.annotation_key("main"): rec.to_json(),
            topology.AFFINITY_ANNOTATION: topology.encode({"main": topology.Assignment(1, 8, GIB)}),
        },
    )
    obj = nrt(
        "gpu-a100",
        A100,
        [
            pod,
            {
                **make_pod("done", phase="Succeeded"),
                "metadata": {**pod["metadata"], "name": "done"},
            },
        ],
    )
    zones = {z["name"]: {r["name"]: r for r in z["resources"]} for z in obj["zones"]}
    assert zones["node-1"][GPU]["available"] == "1" and zones["node-0"][GPU]["available"] == "4"
    assert zones["node-1"]["cpu"]["available"] == "24"
    assert zones["node-1"]["memory"]["available"] == str(256 * GIB - GIB)
    assert obj["topologyPolicies"] == ["SingleNUMANodeContainerLevel"]
    assert topology_manager_of(obj).policy == "single-numa-node"


def check(pod: dict, name: str, m: topology.MachineInfo, pods: list[dict] = ()) -> tuple[str, dict]:
    obj = nrt(name, m, pods)
    info = FilterInfo(
        node_info(name, m),
        topology_manager_of(obj),
        create_numa_node_list(obj["zones"]),
        "Guaranteed" if pod["metadata"]["name"].startswith("g") else "Burstable",
    )
    status, chosen = filter_numa(pod, info)
    return (status.message or "ok"), chosen


def test_filter_needs_one_numa_node_for_gpus_and_guaranteed_cpus() -> None:
    pod = guaranteed("g", 4, 12)
    assert check(pod, "gpu-a100", A100) == ("ok", {"main": 0})
    assert check(pod, "gpu-t4", T4)[0] == "cannot align container"  # 2 GPUs per NUMA node
    assert check(pod, "gpu-h100", H100_16)[0] == "cannot align container"  # 8 CPUs per NUMA
    burstable = make_pod("b", requests={GPU: 4, "cpu": "12"})
    assert check(burstable, "gpu-h100", H100_16) == ("ok", {"main": 0})  # CPUs from the pool


def test_filter_takes_each_containers_share_before_the_next() -> None:
    two = {"name": "a", "image": "x", "resources": {"requests": {GPU: "2"}, "limits": {GPU: "2"}}}
    pod = make_pod("b2", containers=[two, {**two, "name": "b"}, {**two, "name": "c"}])
    assert check(pod, "gpu-t4", T4)[0] == "cannot align container"
    assert check(pod, "gpu-a100", A100) == ("ok", {"a": 0, "b": 0, "c": 1})


def test_unusable_zones_are_skipped_and_named() -> None:
    zones = [
        {"name": "socket-0", "type": "Socket", "resources": []},
        {"name": "numa0", "type": "Node", "resources": []},
        {
            "name": "node-1",
            "type": "Node",
            "resources": [{"name": GPU, "capacity": "2", "allocatable": "2", "available": "2"}],
        },
    ]
    assert [n.id for n in create_numa_node_list(zones)] == [1]
    assert ignored_zones(zones) == [
        "zone 'socket-0' has type 'Socket'",
        "zone 'numa0' is not named node-<NUMA id>",
    ]


def test_deprecated_topology_policies_and_attribute_precedence() -> None:
    conf = topology_manager_of(
        {
            "topologyPolicies": ["SingleNUMANodePodLevel"],
            "attributes": [
                {"name": "topologyManagerScope", "value": "container"},
                {"name": "topologyManagerPolicy", "value": "bogus"},
            ],
        }
    )
    assert (conf.policy, conf.scope) == ("single-numa-node", "container")


def numa(i: int, gpus: int, cpus: int = 32) -> NUMANode:
    return NUMANode(
        i,
        {GPU: Decimal(gpus), "cpu": Decimal(cpus)},
        {0: 10 if i == 0 else 20, 1: 10 if i == 1 else 20},
    )


def test_score_strategies_keep_the_weakest_numa_node() -> None:
    want = {GPU: Decimal(2), "cpu": Decimal(8)}
    nodes = [numa(0, 4), numa(1, 2)]
    weights = {GPU: 1, "cpu": 1}
    # least allocated per NUMA: node-0 (50+75)/2=62, node-1 (0+75)/2=37 -> the lower non-zero
    assert score.score_for_each_numa_node(want, nodes, score.least_allocated, weights) == 37
    assert score.score_for_each_numa_node(want, nodes, score.most_allocated, weights) == 37
    assert score.balanced_allocation(want, nodes[0].resources, weights) == 96


def test_least_allocated_rounds_fractional_quantities_up_as_quantity_value() -> None:
    weights = {"cpu": 1}
    # Value(): 2.5 cpu -> 3, 1.5 -> 2: (3 - 2) * 100 // 3 (flooring would give 50)
    assert score.least_allocated({"cpu": Decimal("1.5")}, {"cpu": Decimal("2.5")}, weights) == 33
    # less than one cpu left is 1, not 0 (flooring divided by zero)
    assert score.least_allocated({"cpu": Decimal("0.25")}, {"cpu": Decimal("0.5")}, weights) == 0
    assert score.least_allocated({"cpu": Decimal("1")}, {"cpu": Decimal("0.5")}, weights) == 0


def test_least_numa_nodes_prefers_fewer_and_closer_numa_nodes() -> None:
    nodes = [numa(0, 2), numa(1, 2)]
    assert score.numa_nodes_required("Guaranteed", nodes, {GPU: Decimal(2)}) == ([0], True)
    assert score.numa_nodes_required("Guaranteed", nodes, {GPU: Decimal(4)}) == ([0, 1], True)
    assert score.numa_nodes_required("Guaranteed", nodes, {GPU: Decimal(5)}) == (None, False)
    assert score.normalize_least_numa(1, True, 2) == 75
    assert score.normalize_least_numa(2, True, 2) == 25


def plugin_with(nrts: dict[str, dict], args: dict | None = None):
    informers = FakeInformers()
    for obj in nrts.values():
        informers.store(NODE_RESOURCE_TOPOLOGIES).apply("ADDED", obj)
    profile = {
        "schedulerName": "s",
        "plugins": {"multiPoint": {"enabled": [{"name": "NodeResourceTopologyMatch"}]}},
        "pluginConfig": [{"name": "NodeResourceTopologyMatch", "args": args or {}}],
    }
    return framework(profile, registry(), informers).plugins["NodeResourceTopologyMatch"]


def test_plugin_filter_and_score_on_nrt_objects() -> None:
    pl = plugin_with({"gpu-a100": nrt("gpu-a100", A100), "gpu-t4": nrt("gpu-t4", T4)})
    pod = guaranteed("g", 4, 12)
    pod["status"] = {"qosClass": "Guaranteed"}
    state = CycleState()
    assert pl.Filter(state, pod, node_info("gpu-a100", A100)).is_success()
    assert pl.Filter(state, pod, node_info("gpu-t4", T4)).message == "cannot align container"
    assert pl.Filter(state, pod, node_info("no-nrt", T4)).is_success()
    best_effort = make_pod("be")
    assert pl.Filter(state, best_effort, node_info("gpu-t4", T4)).is_success()
    # LeastAllocated over what the pod asks (weight 1 each) on either NUMA node of the
    # A100 (4 GPUs, 32 CPUs, 256 GiB free): gpu (4-4)/4 -> 0, cpu (32-12)/32 -> 62,
    # memory (256-16)/256 -> 93; (0 + 62 + 93) // 3
    assert pl.Score(state, pod, node_info("gpu-a100", A100)) == (51, SUCCESS)
    assert (
        pl.Score(state, make_pod("burstable", requests={"cpu": "1"}), node_info("gpu-a100", A100))[
            0
        ]
        == 100
    )
    # the trace's note (told after the Filter step): the zones read, each zone's score
    ((node, note),) = results_of(state).score_notes
    assert node == "gpu-a100"
    assert "NRT gpu-a100 zones available (node-0 cpu 32, memory 256Gi, gpu 4;" in note
    assert note.endswith(
        "LeastAllocated per zone node-0 51, node-1 51: the lowest non-zero -> 51/100"
    )


def test_discard_reserved_nodes_skips_a_node_until_its_pod_is_bound() -> None:
    pl = plugin_with({"gpu-a100": nrt("gpu-a100", A100)}, {"discardReservedNodes": True})
    pod = guaranteed("g", 1, 1)
    state = CycleState()
    pl.Reserve(state, pod, "gpu-a100")
    assert (
        pl.Filter(state, pod, node_info("gpu-a100", A100)).message == "invalid node topology data"
    )
    pl.PostBind(state, pod, "gpu-a100")
    assert pl.Filter(state, pod, node_info("gpu-a100", A100)).is_success()


def test_bad_plugin_args_are_refused() -> None:
    with pytest.raises(FrameworkError, match="illegal scoring strategy"):
        plugin_with({}, {"scoringStrategy": {"type": "Random"}})
    with pytest.raises(FrameworkError, match="OverReserve"):
        plugin_with({}, {"cacheResyncPeriodSeconds": 5})


# -- the node agent's Topology Manager ------------------------------------------------------


def need(name: str, gpus: int) -> policy.ContainerNeed:
    return policy.ContainerNeed(name, False, {GPU: gpus})


def test_topology_manager_picks_the_lowest_numa_node_that_holds_everything() -> None:
    tm = topology.TopologyManager(KUBELET, A100)
    free = {GPU: list(A100.devices)}
    pod = guaranteed("g", 4, 12)
    pod["status"] = {"qosClass": "Guaranteed"}
    assert tm.Admit(pod, [need("main", 4)], free) == {"main": topology.Assignment(0, 12, 16 * GIB)}
    aligned = tm.Aligned(policy.pod_key(pod), "main", GPU, list(A100.devices), 4)
    assert {A100.devices[d] for d in aligned} == {0}
    # the next 4-GPU pod: NUMA 0 has no free GPU left (the caller says which are free)
    left = [d for d, n in A100.devices.items() if n == 1]
    other = guaranteed("g2", 4, 30)
    other["status"] = {"qosClass": "Guaranteed"}
    assert tm.Admit(other, [need("main", 4)], {GPU: left})["main"].numa == 1
    # a third cannot get 4 GPUs and 30 CPUs anywhere: kubelet's TopologyAffinityError
    third = guaranteed("g3", 2, 30)
    third["status"] = {"qosClass": "Guaranteed"}
    with pytest.raises(
        topology.TopologyAffinityError, match="Resources cannot be allocated with Topology locality"
    ):
        tm.Admit(third, [need("main", 2)], {GPU: left[:2]})


def test_topology_manager_off_without_single_numa_node_and_survives_restarts() -> None:
    off = topology.TopologyManager(topology.KubeletConfig(), A100)
    assert off.Admit(make_pod("p"), [need("main", 8)], {GPU: []}) == {}
    tm = topology.TopologyManager(KUBELET, T4)
    pod = make_pod("p", requests={GPU: 2})
    tm.Admit(pod, [need("main", 2)], {GPU: list(T4.devices)})
    annotated = {
        **pod,
        "metadata": {**pod["metadata"], "annotations": tm.annotations(policy.pod_key(pod))},
    }
    restarted = topology.TopologyManager(KUBELET, T4)
    restarted.adopt([annotated])
    assert restarted.assignments == tm.assignments
    with pytest.raises(topology.TopologyAffinityError):  # 4 GPUs, 2 per NUMA node
        tm.Admit(make_pod("q", requests={GPU: 4}), [need("main", 4)], {GPU: list(T4.devices)})
