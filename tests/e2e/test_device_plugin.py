"""Device plugin + node agent on the local backend: what kubelet's device manager sees.

The e2e cluster runs the `device-plugin` addon: per GPU node a real `gpulab device-plugin`
(reading the fake-gpu shim through pynvml) registered over gRPC with a `gpulab node-agent`
(kubelet's device manager), which advertises capacity and calls Allocate on binding.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from demos.cluster import gpu_pod_spec
from gpulab.fakegpu import faults, profiles
from gpulab.wait import wait_for
from harness.addons.device_plugin import fake_gpu_root


def _allocatable(cluster, node: str) -> dict[str, str]:
    return client.CoreV1Api(cluster.api).read_node(node).status.allocatable


def _allocation(core: client.CoreV1Api, name: str, ns: str) -> dict | None:
    pod = core.read_namespaced_pod(name, ns)
    raw = (pod.metadata.annotations or {}).get("gpulab.io/allocate-cuda")
    return json.loads(raw) if raw else None


def _pod_on(node: str, name: str, resources: dict[str, str]) -> client.V1Pod:
    spec = gpu_pod_spec(0)
    spec.containers[0].resources = client.V1ResourceRequirements(limits=resources)
    spec.node_selector = {"kubernetes.io/hostname": node}
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec)


def test_allocatable_is_what_the_plugins_advertise(cluster) -> None:
    a100 = profiles.load("a100-80gb-mig-x8")
    mig = _allocatable(cluster, "gpu-a100-mig")
    # mixed strategy: one resource per MIG profile, counted from the profile's layout
    for name in ("3g.40gb", "2g.20gb", "1g.10gb"):
        want = sum(1 for g in a100.gpus for m in g.mig_instances if m.name == name)
        assert mig[f"nvidia.com/mig-{name}"] == str(want)
    assert "nvidia.com/gpu" not in mig  # every GPU there is MIG-enabled
    # time-slicing: one T4 with replicas 4 is advertised as 4 devices
    assert _allocatable(cluster, "gpu-t4-shared")["nvidia.com/gpu"] == "4"
    labels = client.CoreV1Api(cluster.api).read_node("gpu-a100").metadata.labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "8"


def test_two_gpus_come_from_one_numa_node(cluster, namespace) -> None:
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, _pod_on("gpu-a100", "pair", {"nvidia.com/gpu": "2"}))
    alloc = wait_for(lambda: _allocation(core, "pair", namespace), 60, "Allocate for pair")
    uuids = alloc["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(uuids) == 2
    profile = profiles.load("a100-sxm4-40gb-x8")
    by_uuid = {profiles.gpu_uuid("gpu-a100", g.index): g for g in profile.gpus}
    assert {by_uuid[u].numa_node for u in uuids} in ({0}, {1})
    assert sorted(alloc["devices"]["nvidia.com/gpu"]) == sorted(uuids)


def test_mig_pod_gets_a_mig_device(cluster, namespace) -> None:
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(
        namespace, _pod_on("gpu-a100-mig", "mig", {"nvidia.com/mig-3g.40gb": "1"})
    )
    alloc = wait_for(lambda: _allocation(core, "mig", namespace), 60, "Allocate for mig")
    (uuid,) = alloc["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    profile = profiles.load("a100-80gb-mig-x8")
    three_g = {
        profiles.mig_uuid("gpu-a100-mig", g.index, j)
        for g in profile.gpus
        for j, m in enumerate(g.mig_instances)
        if m.name == "3g.40gb"
    }
    assert uuid in three_g


@pytest.mark.local_backend
def test_xid_79_drops_allocatable_by_one_and_clear_restores_it(cluster) -> None:
    node_dir = fake_gpu_root(cluster.local.dir) / "gpu-t4-1"
    faults.inject_xid(node_dir, 2, faults.XID_FALLEN_OFF_BUS)
    try:
        wait_for(
            lambda: _allocatable(cluster, "gpu-t4-1")["nvidia.com/gpu"] == "3",
            30,
            "gpu-t4-1 allocatable 3 after Xid 79",
        )
        # capacity still counts the broken GPU, as kubelet reports it
        node = client.CoreV1Api(cluster.api).read_node("gpu-t4-1")
        assert node.status.capacity["nvidia.com/gpu"] == "4"
    finally:
        faults.clear(node_dir)
    wait_for(
        lambda: _allocatable(cluster, "gpu-t4-1")["nvidia.com/gpu"] == "4",
        30,
        "gpu-t4-1 allocatable back to 4 after clear",
    )


@pytest.mark.local_backend
def test_ignored_xid_keeps_the_gpu_healthy(cluster) -> None:
    node_dir = fake_gpu_root(cluster.local.dir) / "gpu-t4-0"
    faults.inject_xid(node_dir, 0, 13)  # graphics engine exception: not a health failure
    try:
        import time

        time.sleep(3)  # longer than the plugin needs to drop a GPU on a fatal Xid
        assert _allocatable(cluster, "gpu-t4-0")["nvidia.com/gpu"] == "4"
    finally:
        faults.clear(node_dir)


def test_pod_over_the_nodes_free_devices_fails_admission(cluster, namespace) -> None:
    core = client.CoreV1Api(cluster.api)
    # nodeName skips the scheduler, as a static or mis-scheduled pod would: kubelet's
    # device manager (the node agent) must refuse it
    spec = gpu_pod_spec(5)
    spec.node_name = "gpu-t4-0"
    core.create_namespaced_pod(
        namespace, client.V1Pod(metadata=client.V1ObjectMeta(name="greedy"), spec=spec)
    )
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("greedy", namespace)).status.phase == "Failed" and p,
        60,
        "greedy to fail admission",
    )
    assert pod.status.reason == "UnexpectedAdmissionError"


@pytest.mark.local_backend
def test_device_plugin_demo_passes_against_this_cluster(cluster) -> None:
    import argparse

    from demos import device_plugin as demo

    assert demo.run(argparse.Namespace(spec="e2e", backend="local")) == 0
