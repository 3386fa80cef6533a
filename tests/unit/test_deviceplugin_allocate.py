"""Preferred allocation and Allocate responses (gpulab.deviceplugin.allocate)."""

from __future__ import annotations

import pytest

from gpulab.deviceplugin.allocate import (
    AllocationError,
    check_request,
    container_allocation,
    preferred_allocation,
)
from gpulab.deviceplugin.rm import Device, replica_id

# 8 GPUs, NUMA 0 = GPUs 0-3, NUMA 1 = GPUs 4-7.
GPUS = {f"G{i}": Device(f"G{i}", f"G{i}", i, (f"/dev/nvidia{i}",), i // 4) for i in range(8)}
ALL_LINKED = {i: [j for j in range(8) if j != i] for i in range(8)}


def test_prefers_a_single_numa_node() -> None:
    got = preferred_allocation([f"G{i}" for i in (0, 1, 2, 4, 5, 6, 7)], [], 4, GPUS, ALL_LINKED)
    assert sorted(got) == ["G4", "G5", "G6", "G7"]


def test_prefers_nvlink_connected_gpus_within_a_numa_node() -> None:
    pairs = {0: [1], 1: [0], 2: [3], 3: [2]}
    got = preferred_allocation(["G0", "G2", "G3"], [], 2, GPUS, pairs)
    assert sorted(got) == ["G2", "G3"]


def test_must_include_comes_first_and_pulls_its_numa_node() -> None:
    got = preferred_allocation(list(GPUS), ["G5"], 3, GPUS, ALL_LINKED)
    assert got[0] == "G5"
    assert {GPUS[i].numa_node for i in got} == {1}
    assert len(got) == 3


def test_size_equal_to_must_include_returns_it() -> None:
    assert preferred_allocation(list(GPUS), ["G3", "G1"], 2, GPUS, ALL_LINKED) == ["G3", "G1"]


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (["G0", "G1"], [], 3, "only 2 available"),
        (["G0"], ["G0", "G1"], 1, "smaller than must_include"),
        (["G0", "GX"], [], 1, "unknown device.*GX"),
    ],
)
def test_impossible_requests_are_errors(available, must, size, message) -> None:
    with pytest.raises(AllocationError, match=message):
        preferred_allocation(available, must, size, GPUS, ALL_LINKED)


def test_replicas_spread_over_the_gpus_with_most_free_replicas() -> None:
    devices = {
        replica_id(f"G{g}", n): Device(replica_id(f"G{g}", n), f"G{g}", g, (), 0, n)
        for g in range(3)
        for n in range(4)
    }
    # GPU 0 has 1 free replica, GPU 1 has 4, GPU 2 has 3.
    available = ["G0::3", *[f"G1::{n}" for n in range(4)], *[f"G2::{n}" for n in range(1, 4)]]
    got = preferred_allocation(available, [], 2, devices, {})
    assert [devices[i].gpu_index for i in got] == [1, 2]


def test_allocation_maps_replicas_back_to_unique_uuids_and_adds_control_devices() -> None:
    devices = {
        "U1::0": Device("U1::0", "U1", 1, ("/dev/nvidia1",), 0, 0),
        "U1::1": Device("U1::1", "U1", 1, ("/dev/nvidia1",), 0, 1),
        "U2::0": Device("U2::0", "U2", 2, ("/dev/nvidia2",), 0, 0),
    }
    alloc = container_allocation(["U1::0", "U2::0", "U1::1"], devices)
    assert alloc.envs == {"NVIDIA_VISIBLE_DEVICES": "U1,U2"}
    assert [d.host_path for d in alloc.devices] == [
        "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm",
    ]  # fmt: skip


def test_check_request_names_unknown_then_unhealthy_devices() -> None:
    health = {i: i != "G2" for i in GPUS}
    with pytest.raises(AllocationError, match="unknown device\\(s\\): G9"):
        check_request(["G1", "G9"], GPUS, health)
    with pytest.raises(AllocationError, match="unhealthy device\\(s\\): G2"):
        check_request(["G1", "G2"], GPUS, health)
    check_request(["G1", "G3"], GPUS, health)
