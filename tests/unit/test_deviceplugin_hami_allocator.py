"""HAMi-mode Allocate against an in-memory API server (gpulab.deviceplugin.hami.HamiAllocator)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from gpulab.deviceplugin.allocate import AllocationError
from gpulab.deviceplugin.hami import HamiAllocator
from gpulab.deviceplugin.rm import Device
from gpulab.hami import annotations as ha
from gpulab.trace import Tracer

NODE = "n1"
DEVICES = {
    f"GPU-{g}::{n}": Device(f"GPU-{g}::{n}", f"GPU-{g}", g, (f"/dev/nvidia{g}",), 0, n)
    for g in range(2)
    for n in range(10)
}


class FakeCore:
    """The CoreV1Api calls HamiAllocator makes, over one node and its pods (JSON dicts)."""

    api_client = client.ApiClient()

    def __init__(self, pods: list[dict[str, Any]], lock: str | None) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.node_annotations = {ha.NODE_LOCK: lock} if lock else {}

    def list_pod_for_all_namespaces(self, field_selector: str) -> SimpleNamespace:
        assert field_selector == f"spec.nodeName={NODE}"
        return SimpleNamespace(items=list(self.pods.values()))

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.pods[name]["metadata"]["annotations"].update(body["metadata"]["annotations"])

    def read_node(self, name: str) -> SimpleNamespace:
        meta = SimpleNamespace(annotations=dict(self.node_annotations), resource_version="7")
        return SimpleNamespace(metadata=meta)

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        assert body["metadata"]["resourceVersion"] == "7"
        for k, v in body["metadata"]["annotations"].items():
            if v is None:
                self.node_annotations.pop(k, None)


def hami_pod(name: str, to_allocate: str) -> dict[str, Any]:
    annos = {
        ha.ASSIGNED_NODE: NODE,
        ha.BIND_TIME: "1700000000",
        ha.BIND_PHASE: ha.BIND_ALLOCATING,
        ha.DEVICES_TO_ALLOCATE: to_allocate,
    }
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annos},
        "status": {"phase": "Pending"},
    }


def allocator(core: FakeCore) -> HamiAllocator:
    return HamiAllocator(core, NODE, Tracer("device-plugin", None, stream=io.StringIO()))  # type: ignore[arg-type]


def test_two_containers_allocate_in_turn_then_success_and_lock_released() -> None:
    core = FakeCore(
        [hami_pod("p", "GPU-1,NVIDIA,3000,30:;GPU-0,NVIDIA,1000,10:GPU-1,NVIDIA,1000,10:;")],
        lock="2026-01-01T00:00:00Z,ns,p",
    )
    alloc = allocator(core)
    assert alloc.prefer(list(DEVICES), [], 1, DEVICES) == ["GPU-1::0"]
    (first,) = alloc.allocate([["GPU-1::0"]], DEVICES)
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-1"
    assert first.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    annos = core.pods["p"]["metadata"]["annotations"]
    assert annos[ha.BIND_PHASE] == ha.BIND_ALLOCATING  # one container still to go
    assert ha.NODE_LOCK in core.node_annotations
    (second,) = alloc.allocate([["GPU-0::3", "GPU-1::4"]], DEVICES)
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-0,GPU-1"
    assert second.envs["CUDA_DEVICE_SM_LIMIT"] == "10"
    assert annos[ha.BIND_PHASE] == ha.BIND_SUCCESS
    assert annos[ha.DEVICES_TO_ALLOCATE] == ";;"
    assert (
        annos[ha.DEVICES_ALLOCATED]
        == "GPU-1,NVIDIA,3000,30:;GPU-0,NVIDIA,1000,10:GPU-1,NVIDIA,1000,10:;"
    )
    assert ha.NODE_LOCK not in core.node_annotations


def test_count_mismatch_fails_the_pod_and_keeps_other_pods_lock() -> None:
    core = FakeCore([hami_pod("p", "GPU-1,NVIDIA,3000,30:;")], lock="2026-01-01T00:00:00Z,ns,other")
    with pytest.raises(AllocationError, match="device number not matched"):
        allocator(core).allocate([["GPU-1::0", "GPU-1::1"]], DEVICES)
    assert core.pods["p"]["metadata"]["annotations"][ha.BIND_PHASE] == ha.BIND_FAILED
    assert ha.NODE_LOCK in core.node_annotations  # not this pod's lock


def test_no_pending_pod_is_an_error() -> None:
    with pytest.raises(AllocationError, match="no pod on n1"):
        allocator(FakeCore([], None)).allocate([["GPU-0::0"]], DEVICES)
