"""HAMi-mode Allocate (gpulab.deviceplugin.hami.HamiAllocator) against an in-memory API
server: the pod the node lock names is allocated container by container (init first), and
the lock is released only after the last one — or at once when Allocate fails."""

from __future__ import annotations

import io
from typing import Any

import pytest

from gpulab.deviceplugin.allocate import AllocationError
from gpulab.deviceplugin.hami import HamiAllocator, NodeConfig
from gpulab.deviceplugin.rm import Device
from gpulab.hami import annotations as ha
from gpulab.hami import nodelock
from gpulab.hami.fake import FakeCluster
from gpulab.trace import Tracer

NODE = "n1"
UUIDS = [f"GPU-0000000{g}-1111-2222-3333-444444444444" for g in range(2)]
G0, G1 = UUIDS
DEVICES = {  # HAMi's IDs for kubelet: <uuid>-<n>
    f"{u}-{n}": Device(f"{u}-{n}", u, g, (f"/dev/nvidia{g}",), 0, n)
    for g, u in enumerate(UUIDS)
    for n in range(10)
}


def world(
    to_allocate: str, lock_owner: str | None = "p", init: int = 0, app: int = 1
) -> FakeCluster:
    fc = FakeCluster()
    annos = {nodelock.NODE_LOCK_KEY: f"2026-01-01T00:00:00Z,ns,{lock_owner}"} if lock_owner else {}
    fc.add_node({"metadata": {"name": NODE, "annotations": annos}})
    fc.add_pod(
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "annotations": {
                    ha.ASSIGNED_NODE: NODE,
                    ha.BIND_TIME: "1700000000",
                    ha.BIND_PHASE: ha.BIND_ALLOCATING,
                    ha.DEVICES_TO_ALLOCATE: to_allocate,
                    ha.DEVICES_ALLOCATED: to_allocate,
                },
            },
            "spec": {
                "nodeName": NODE,
                "initContainers": [{"name": f"init-{i}"} for i in range(init)],
                "containers": [{"name": f"app-{i}"} for i in range(app)],
            },
            "status": {"phase": "Pending"},
        }
    )
    return fc


def allocator(
    fc: FakeCluster, log: io.StringIO | None = None, config: NodeConfig | None = None
) -> HamiAllocator:
    tracer = Tracer("device-plugin", None, stream=log or io.StringIO())
    return HamiAllocator(None, NODE, tracer, config, cluster=fc)  # type: ignore[arg-type]


def annos(fc: FakeCluster) -> dict[str, Any]:
    return fc.pods[("ns", "p")]["metadata"]["annotations"]


def lock(fc: FakeCluster) -> str | None:
    return fc.nodes[NODE]["metadata"].get("annotations", {}).get(nodelock.NODE_LOCK_KEY)


def test_init_container_first_and_the_lock_released_after_the_last_container() -> None:
    fc = world(f"{G1},NVIDIA,3000,30:;{G0},NVIDIA,1000,10:{G1},NVIDIA,1000,10:;", init=1, app=1)
    log = io.StringIO()
    alloc = allocator(fc, log)
    assert alloc.prefer(0, list(DEVICES), [], 1, DEVICES) == [f"{G1}-0"]
    # request 1 is the next waiting container's: the app container's first GPU
    assert alloc.prefer(1, list(DEVICES), [], 1, DEVICES) == [f"{G0}-0"]
    assert alloc.prefer(2, list(DEVICES), [], 1, DEVICES) is None  # no third: no answer
    (first,) = alloc.allocate([[f"{G1}-0"]], DEVICES)  # the init container
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == G1
    assert first.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert annos(fc)[ha.BIND_PHASE] == ha.BIND_ALLOCATING
    assert lock(fc) is not None  # one container still to go: the lock stays
    (second,) = alloc.allocate([[f"{G0}-3", f"{G1}-4"]], DEVICES)
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == f"{G0},{G1}"
    assert annos(fc)[ha.BIND_PHASE] == ha.BIND_SUCCESS
    # every slot erased; each decode/encode round keeps the empty tail slot, as upstream
    assert annos(fc)[ha.DEVICES_TO_ALLOCATE] == ";;;;"
    assert lock(fc) is None
    assert '"step": "ReleaseNodeLock"' in log.getvalue()


def test_the_pod_is_found_through_the_lock_even_when_another_waits() -> None:
    fc = world(f"{G0},NVIDIA,1000,10:;")
    fc.add_pod({"metadata": {"name": "other", "namespace": "ns", "annotations": {
        ha.ASSIGNED_NODE: NODE, ha.BIND_TIME: "1", ha.BIND_PHASE: ha.BIND_ALLOCATING,
        ha.DEVICES_TO_ALLOCATE: f"{G1},NVIDIA,1,1:;"}}, "spec": {"nodeName": NODE}})  # fmt: skip
    (only,) = allocator(fc).allocate([[f"{G0}-0"]], DEVICES)
    assert only.envs["NVIDIA_VISIBLE_DEVICES"] == G0
    assert "list pods" not in fc.calls


def test_without_a_lock_the_waiting_pod_is_searched() -> None:
    fc = world(f"{G0},NVIDIA,1000,10:;", lock_owner=None)
    allocator(fc).allocate([[f"{G0}-0"]], DEVICES)
    assert annos(fc)[ha.BIND_PHASE] == ha.BIND_SUCCESS and "list pods" in fc.calls


def test_a_failed_allocate_marks_the_pod_failed_and_releases_the_lock() -> None:
    fc = world(f"{G1},NVIDIA,3000,30:;")
    with pytest.raises(AllocationError, match="device number not matched"):
        allocator(fc).allocate([[f"{G1}-0", f"{G1}-1"]], DEVICES)
    assert annos(fc)[ha.BIND_PHASE] == ha.BIND_FAILED
    assert lock(fc) is None


def test_another_pods_lock_and_an_unreadable_lock_are_left_alone() -> None:
    fc = world(f"{G1},NVIDIA,3000,30:;", lock_owner=None)
    fc.patch_node_annotations(NODE, {nodelock.NODE_LOCK_KEY: "2026-01-01T00:00:00Z,ns,someone"})
    with pytest.raises(AllocationError, match="someone"):
        allocator(fc).allocate([[f"{G1}-0"]], DEVICES)  # the lock names a pod that is gone
    assert lock(fc) == "2026-01-01T00:00:00Z,ns,someone"
    fc.patch_node_annotations(NODE, {nodelock.NODE_LOCK_KEY: "garbage"})
    with pytest.raises(AllocationError, match="not an RFC3339 time"):
        allocator(fc).allocate([[f"{G1}-0"]], DEVICES)
    assert lock(fc) == "garbage"


def test_no_pending_pod_is_an_error() -> None:
    fc = FakeCluster()
    fc.add_node({"metadata": {"name": NODE}})
    with pytest.raises(AllocationError, match="no binding pod found on node n1"):
        allocator(fc).allocate([[f"{G0}-0"]], DEVICES)


def test_kubelets_ids_replace_the_annotation_only_with_enablegetpreferredallocation() -> None:
    """alignContainerDevicesWithAllocatedIDs: kubelet handed out an ID of the other GPU
    (no preference was taken); the share follows kubelet only when the node enables it."""
    for enabled, visible in ((False, G1), (True, G0)):
        fc = world(f"{G1},NVIDIA,3000,30:;")
        config = NodeConfig(enable_get_preferred_allocation=enabled)
        (got,) = allocator(fc, config=config).allocate([[f"{G0}-5"]], DEVICES)
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == visible
        assert got.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
