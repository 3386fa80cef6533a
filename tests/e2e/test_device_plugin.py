"""Device plugin + node agent on the local backend: what kubelet's device manager sees.

The e2e cluster runs the `device-plugin` addon: per GPU node a real `gpulab device-plugin`
(reading the fake-gpu shim through pynvml, configured by the named config its node label
selects) registered over gRPC with a `gpulab node-agent` (kubelet's device manager), which
advertises capacity and calls Allocate on binding.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from demos.cluster import gpu_pod_spec
from gpulab.fakegpu import faults, profiles
from gpulab.wait import WaitTimeout, wait_for
from harness.addons.device_plugin import COMPONENT


def _allocatable(cluster, node: str) -> dict[str, str]:
    return client.CoreV1Api(cluster.api).read_node(node).status.allocatable


def _gpus(cluster, node: str) -> str:
    return _allocatable(cluster, node).get("nvidia.com/gpu", "0")


def _allocation(core: client.CoreV1Api, name: str, ns: str) -> dict | None:
    pod = core.read_namespaced_pod(name, ns)
    raw = (pod.metadata.annotations or {}).get("gpulab.io/allocate-cuda")
    return json.loads(raw) if raw else None


def _pod_on(node: str, name: str, resources: dict[str, str]) -> client.V1Pod:
    spec = gpu_pod_spec(0)
    spec.containers[0].resources = client.V1ResourceRequirements(limits=resources)
    spec.node_selector = {"kubernetes.io/hostname": node}
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec)


def watching(cluster, node: str) -> None:
    """Until the node's plugin watches NVML events (an Xid from before is never delivered:
    NVML does not replay past events)."""
    core = client.CoreV1Api(cluster.api)

    def health_check_runs() -> bool:
        (pod,) = cluster.local.component_pods(COMPONENT, node)
        logs = core.read_namespaced_pod_log(
            pod.metadata.name, "gpulab-system", container="device-plugin"
        )
        return "for Xid critical errors" in logs

    wait_for(health_check_runs, 60, f"the health check of the plugin on {node}")


def _restart_plugin(cluster, node: str, gpus: str) -> None:
    """Restart the node's plugin (advertising fewer than ``gpus`` now) and wait until its
    devices are all advertised again."""
    assert _gpus(cluster, node) != gpus
    cluster.local.restart(COMPONENT, node)  # delete its pod: the DaemonSet makes a new one
    wait_for(lambda: _gpus(cluster, node) == gpus, 60, f"{node} to advertise {gpus} again")


def test_allocatable_and_labels_are_what_the_plugins_advertise(cluster) -> None:
    a100 = profiles.load("a100-80gb-mig-x8")
    mig = _allocatable(cluster, "gpu-a100-mig")
    # mixed strategy: one resource per MIG profile, counted from the profile's layout
    for name in ("3g.40gb", "2g.20gb", "1g.10gb"):
        want = sum(1 for g in a100.gpus for m in g.mig_instances if m.name == name)
        assert mig[f"nvidia.com/mig-{name}"] == str(want)
    assert "nvidia.com/gpu" not in mig  # every GPU there is MIG-enabled
    # time-slicing: one T4 with replicas 4 is advertised as 4 devices
    assert _gpus(cluster, "gpu-t4-shared") == "4"
    core = client.CoreV1Api(cluster.api)
    labels = core.read_node("gpu-a100").metadata.labels
    assert labels["nvidia.com/device-plugin.config"] == "default"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert "nvidia.com/mig.strategy" not in labels  # strategy none: no label (GFD)
    mig_labels = core.read_node("gpu-a100-mig").metadata.labels
    assert mig_labels["nvidia.com/device-plugin.config"] == "mig-mixed"
    assert mig_labels["nvidia.com/mig.strategy"] == "mixed"
    assert mig_labels["nvidia.com/gpu.count"] == "8"  # every A100, MIG-enabled or not
    shared = core.read_node("gpu-t4-shared").metadata.labels
    assert shared["nvidia.com/gpu.replicas"] == "4"
    assert shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_two_gpus_come_from_one_numa_node(cluster, namespace) -> None:
    node = "gpu-t4-0"  # 4 T4s, two per NUMA node, no NVLink
    profile = profiles.load("t4-x4")
    by_uuid = {profiles.gpu_uuid(node, g.index): g for g in profile.gpus}
    naive = sorted(by_uuid)[:2]  # what kubelet takes without GetPreferredAllocation
    assert len({by_uuid[u].numa_node for u in naive}) == 2, "the test needs a crossing pair"
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, _pod_on(node, "pair", {"nvidia.com/gpu": "2"}))
    alloc = wait_for(lambda: _allocation(core, "pair", namespace), 60, "Allocate for pair")
    uuids = alloc["envs"]["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert len(uuids) == 2
    assert len({by_uuid[u].numa_node for u in uuids}) == 1
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
def test_xid_79_drops_a_gpu_until_the_plugin_restarts(cluster) -> None:
    node = "gpu-t4-1"
    watching(cluster, node)
    cluster.local.inject_fault(node, 2, faults.XID_FALLEN_OFF_BUS)
    wait_for(lambda: _gpus(cluster, node) == "3", 30, f"{node} allocatable 3 after Xid 79")
    node_status = client.CoreV1Api(cluster.api).read_node(node).status
    assert node_status.capacity["nvidia.com/gpu"] == "4"  # kubelet keeps it in capacity
    cluster.local.clear_faults(node)  # the fake driver forgets the fault; the plugin does not
    with pytest.raises(WaitTimeout):
        wait_for(lambda: _gpus(cluster, node) == "4", 3, "a recovery that must not come")
    _restart_plugin(cluster, node, "4")  # the positive control: a restart brings it back


@pytest.mark.local_backend
def test_ignored_xid_keeps_the_gpu_healthy(cluster) -> None:
    node = "gpu-t4-0"
    watching(cluster, node)
    cluster.local.inject_fault(node, 0, 13)  # graphics engine exception: not a health failure
    with pytest.raises(WaitTimeout):
        wait_for(lambda: _gpus(cluster, node) != "4", 3, "a drop that must not come")
    cluster.local.inject_fault(node, 0, 79)  # the positive control: a fatal Xid is seen
    wait_for(lambda: _gpus(cluster, node) == "3", 30, f"{node} allocatable 3")
    cluster.local.clear_faults(node)
    _restart_plugin(cluster, node, "4")


def test_pod_over_the_nodes_free_devices_fails_admission(cluster, namespace) -> None:
    core = client.CoreV1Api(cluster.api)

    def held() -> int | None:
        """GPUs of gpu-t4-0 held by pods of earlier tests (e.g. the cluster demo's, which
        stays for the learner); None while one is still terminating."""
        pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-t4-0").items
        live = [p for p in pods if p.status.phase not in ("Succeeded", "Failed")]
        if any(p.metadata.deletion_timestamp for p in live):
            return None
        return sum(
            int((c.resources.limits or {}).get("nvidia.com/gpu", 0))
            for p in live
            for c in p.spec.containers
        )

    free = 4 - wait_for(lambda: (n := held()) is not None and (n,), 60, "pods to terminate")[0]
    # nodeName skips the scheduler, as a static or mis-scheduled pod would: kubelet's
    # device manager (the node agent) must refuse a pod asking one more than is free
    spec = gpu_pod_spec(free + 1)
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
    assert f"Requested: {free + 1}, Available: {free}" in pod.status.message
