"""NodeResourceTopology end to end (harness/clusters/scheduling-e2e.yaml): the topology
updaters publish each GPU node's NUMA zones, NodeResourceTopologyMatch places a pod only
where one NUMA node holds its GPUs and CPUs, and the node agent (kubelet's Topology
Manager, single-numa-node) allocates exactly that NUMA node's GPUs; without the plugin
the kubelet side rejects a misplaced pod; an NRT with unusable zones is reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Cluster, fresh_namespace
from kubernetes import client
from scheduling_helpers import (
    SCHEDULER,
    create_pod,
    read_pod,
    wait_bound,
    wait_event,
)

from gpulab.fakegpu import profiles
from gpulab.framework.objects import GPU, make_pod
from gpulab.framework.plugins.defaultbinder import FILTER_RESULT
from gpulab.nodeagent import policy, topology
from gpulab.wait import wait_for

NRT = ("topology.node.k8s.io", "v1alpha2", "noderesourcetopologies")
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(scheduling_e2e: Cluster) -> Cluster:
    return scheduling_e2e


@pytest.fixture
def ns(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster.api, "numa") as name:
        yield name


def numa_pod(ns: str, name: str, gpus: int, cpus: int, **kw: Any) -> Obj:
    limits = {GPU: gpus, "cpu": cpus, "memory": "16Gi"}
    return make_pod(name, ns, requests=limits, limits=limits, **kw)


def zone_available(api: client.ApiClient, node: str) -> dict[str, dict[str, str]]:
    obj = client.CustomObjectsApi(api).get_cluster_custom_object(*NRT, node)
    return {z["name"]: {r["name"]: r["available"] for r in z["resources"]} for z in obj["zones"]}


def gpus_on(node: str, profile: str, numa: int) -> set[str]:
    return {
        profiles.gpu_uuid(node, g.index) for g in profiles.load(profile).gpus if g.numa_node == numa
    }


def allocation(api: client.ApiClient, ns: str, name: str) -> tuple[set[str], topology.Assignment]:
    pod = wait_for(
        lambda: (
            (p := read_pod(api, ns, name))
            and policy.annotation_key("main") in (p["metadata"].get("annotations") or {})
            and p
        ),
        30,
        f"the node agent's allocation for {name}",
    )
    record = policy.recorded(pod)["main"]
    return set(record.devices[GPU]), topology.decode(pod)["main"]


def test_numa_placement_and_the_gpus_allocated_match_the_zone(cluster: Cluster, ns: str) -> None:
    api = cluster.api
    before = zone_available(api, "gpu-a100")
    assert before["node-0"][GPU] == before["node-1"][GPU] == "4"

    create_pod(api, numa_pod(ns, "first", 4, 12, scheduler=SCHEDULER))
    pod = wait_bound(api, ns, "first")
    assert pod["spec"]["nodeName"] == "gpu-a100"
    filtered = json.loads(pod["metadata"]["annotations"][FILTER_RESULT])
    for node in ("gpu-t4-0", "gpu-t4-1", "gpu-h100"):  # enough GPUs on the node, not per NUMA
        assert filtered[node]["NodeResourcesFit"] == "passed"
        assert filtered[node]["NodeResourceTopologyMatch"] == "cannot align container"
    devices, assignment = allocation(api, ns, "first")
    assert assignment == topology.Assignment(0, 12, 16 * 2**30)
    assert devices == gpus_on("gpu-a100", "a100-sxm4-40gb-x8", 0)
    wait_for(
        lambda: zone_available(api, "gpu-a100")["node-0"][GPU] == "0",
        30,
        "the updater to publish NUMA 0's GPUs as taken",
    )
    assert zone_available(api, "gpu-a100")["node-0"]["cpu"] == "20"

    # the next one fits only NUMA node 1 of the same node
    create_pod(api, numa_pod(ns, "second", 4, 12, scheduler=SCHEDULER))
    assert wait_bound(api, ns, "second")["spec"]["nodeName"] == "gpu-a100"
    devices, assignment = allocation(api, ns, "second")
    assert assignment.numa == 1 and devices == gpus_on("gpu-a100", "a100-sxm4-40gb-x8", 1)

    # a third fits no single NUMA node anywhere
    create_pod(api, numa_pod(ns, "third", 4, 12, scheduler=SCHEDULER))
    event = wait_event(api, ns, "third", "FailedScheduling")
    # then PostFilter: Coscheduling's, for a pod of no group, as upstream words it
    assert event["message"] == (
        "0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 3 cannot align container. "
        "can not find pod group"
    )


def test_without_the_plugin_the_kubelet_side_rejects_the_misplaced_pod(
    cluster: Cluster, ns: str
) -> None:
    api = cluster.api
    # the default scheduler only counts GPUs per node: 4 free on gpu-t4-0, so it binds
    create_pod(
        api, numa_pod(ns, "misplaced", 4, 2, node_selector={"kubernetes.io/hostname": "gpu-t4-0"})
    )
    wait_bound(api, ns, "misplaced")
    pod = wait_for(
        lambda: (
            (p := read_pod(api, ns, "misplaced")) and p["status"].get("phase") == "Failed" and p
        ),
        30,
        "the node agent to reject the pod",
    )
    assert pod["status"]["reason"] == "TopologyAffinityError"
    assert pod["status"]["message"] == (
        "Pod was rejected: Resources cannot be allocated with Topology locality"
    )
    # and the same pod through gpulab-scheduler is never sent there
    create_pod(api, numa_pod(ns, "placed", 4, 2, scheduler=SCHEDULER))
    assert wait_bound(api, ns, "placed")["spec"]["nodeName"] == "gpu-a100"


def test_an_nrt_with_unusable_zones_is_reported_and_scheduling_goes_on(
    cluster: Cluster, ns: str
) -> None:
    api = cluster.api
    custom = client.CustomObjectsApi(api)
    bad = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "cpu-only"},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": [
            {"name": "socket-0", "type": "Socket", "resources": []},
            {
                "name": "numa0",
                "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": "64", "allocatable": "64", "available": "64"}
                ],
            },
        ],
    }
    custom.create_cluster_custom_object(*NRT, bad)
    try:
        event = wait_event(api, "default", "cpu-only", "UnusableZones")
        assert event["message"].startswith(
            "zone 'socket-0' has type 'Socket'; zone 'numa0' is not named node-<NUMA id>"
        )
        assert event["type"] == "Warning"
        # the scheduler keeps scheduling: a Guaranteed CPU pod cannot be aligned on
        # cpu-only now (no usable zone), so it goes to a node with a proper NRT
        create_pod(
            api,
            make_pod(
                "cpu",
                ns,
                scheduler=SCHEDULER,
                requests={"cpu": "2", "memory": "1Gi"},
                limits={"cpu": "2", "memory": "1Gi"},
            ),
        )
        pod = wait_bound(api, ns, "cpu")
        filtered = json.loads(pod["metadata"]["annotations"][FILTER_RESULT])
        assert filtered["cpu-only"]["NodeResourceTopologyMatch"] == "cannot align container"
    finally:
        custom.delete_cluster_custom_object(*NRT, "cpu-only")
