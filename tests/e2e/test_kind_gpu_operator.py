"""The kind lane's GPU Operator part: the ClusterPolicy's operands as real containers on a
real kubelet (harness/clusters/kind-gpu-operator-e2e.yaml: one A100 worker), and a MIG
change through the MIG manager, the NVML shim and the device plugin's re-registration with
that kubelet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from conftest import Cluster, running_cluster
from kubernetes import client

from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import nodelabels as nl
from gpulab.wait import wait_for
from harness.apply import MANIFESTS
from harness.pytest_plugin import LabOptions

SPEC = "kind-gpu-operator-e2e"
A100 = "gpu-a100"


@pytest.fixture(scope="module")
def kind() -> Iterator[Cluster]:
    with running_cluster(SPEC, LabOptions(backend="kind")) as cluster:
        yield cluster


def _allocatable(kind: Cluster) -> dict[str, str]:
    return client.CoreV1Api(kind.api).read_node(A100).status.allocatable or {}


def _labels(kind: Cluster) -> dict[str, str]:
    return client.CoreV1Api(kind.api).read_node(A100).metadata.labels or {}


@pytest.fixture(scope="module")
def policy(kind: Cluster) -> str:
    body = yaml.safe_load((MANIFESTS / "gpu-operator/samples/clusterpolicy.yaml").read_text())
    group, version = body["apiVersion"].split("/")
    client.CustomObjectsApi(kind.api).create_cluster_custom_object(
        group, version, "clusterpolicies", body
    )
    name = body["metadata"]["name"]

    def ready() -> bool:
        state = (
            client.CustomObjectsApi(kind.api)
            .get_cluster_custom_object(group, version, "clusterpolicies", name)
            .get("status", {})
            .get("state")
        )
        return state == cp.READY and _allocatable(kind).get("nvidia.com/gpu") == "8"

    wait_for(ready, 360, f"ClusterPolicy {name} ready and the A100's GPUs advertised", 1)
    return name


def test_the_operands_run_as_containers_on_the_real_kubelet(kind: Cluster, policy: str) -> None:
    pods = client.CoreV1Api(kind.api).list_namespaced_pod("gpu-operator").items
    running = {
        p.metadata.labels.get("app")
        for p in pods
        if p.status.phase == "Running" and p.spec.node_name == A100
    }
    for operand in ("nvidia-device-plugin-daemonset", "nvidia-dcgm-exporter",
                    "nvidia-mig-manager", "gpu-feature-discovery"):  # fmt: skip
        assert operand in running, f"{operand} not running on {A100}: {sorted(running)}"
    for statuses in (p.status.container_statuses or [] for p in pods):
        for status in statuses:
            assert (status.container_id or "").startswith("containerd://")
    labels = _labels(kind)
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels[nl.DEPLOY_PREFIX + "device-plugin"] == "true"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"  # GFD


def test_a_mig_change_reaches_the_real_kubelets_allocatable(kind: Cluster, policy: str) -> None:
    """nvidia.com/mig.config=all-1g.10gb: the MIG manager pauses the clients, repartitions
    the A100s through NVML (the shim), the device plugin comes back and registers the MIG
    devices with kubelet (strategy mixed in the sample: nvidia.com/mig-1g.10gb, 4 per GPU)."""
    client.CoreV1Api(kind.api).patch_node(
        A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: "all-1g.10gb"}}}
    )
    wait_for(
        lambda: _labels(kind).get(nl.MIG_CONFIG_STATE_LABEL) == "success",
        240,
        "the MIG manager to apply all-1g.10gb",
        1,
    )
    wait_for(
        lambda: _allocatable(kind).get("nvidia.com/mig-1g.10gb") == "32",
        180,
        "kubelet to advertise the 32 MIG devices",
        1,
    )
    assert _allocatable(kind).get("nvidia.com/gpu") == "0"
    assert _labels(kind)["nvidia.com/mig.strategy"] == "mixed"
