"""GetPreferredAllocation (go-gpuallocator best-effort, rm/allocate.go greedyAlloc),
ValidateRequest and the Allocate response, as pure functions."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gpulab.deviceplugin.allocate import (
    AllocationError,
    best_effort,
    container_allocation,
    greedy_allocation,
    pair_score,
    preferred_allocation,
    validate_request,
)
from gpulab.deviceplugin.api import api_pb2
from gpulab.deviceplugin.config import Config, parse, time_slicing
from gpulab.deviceplugin.health import xid_filter
from gpulab.deviceplugin.rm import GPUInfo, build_resources, parse_mig_minors
from gpulab.deviceplugin.server import DefaultAllocator, DriverFiles, NvidiaDevicePlugin
from gpulab.fakegpu import inventory, profiles
from gpulab.fakegpu.render import mig_minors
from gpulab.trace import Tracer

NODE = "n1"
SAME_NUMA, CROSS_NUMA = 40, 50


def node(profile: str, config: Config | None = None):
    prof = profiles.load(profile)
    gpus = inventory.gpu_infos(prof, NODE)
    resources = build_resources(gpus, config or Config(), parse_mig_minors(mig_minors(prof)))
    return {g.index: g for g in gpus}, {d.id: d for r in resources for d in r.devices}


def uuid(i: int) -> str:
    return profiles.gpu_uuid(NODE, i)


def gpu(index: int, numa: int, links: dict[int, int], n: int = 4) -> GPUInfo:
    numas = {0: 0, 1: 0, 2: 1, 3: 1} if n == 4 else {}
    return GPUInfo(
        index=index, uuid=f"G{index}", name="x", memory_mib=1, compute_capability=(8, 0),
        minor=index, numa_node=numa,
        topology={o: SAME_NUMA if numas.get(o) == numa else CROSS_NUMA for o in range(n)
                  if o != index},
        nvlinks=links,
    )  # fmt: skip


def test_pair_score_nvlinks_outweigh_the_pcie_path() -> None:
    a, b, c = gpu(0, 0, {2: 2}), gpu(1, 0, {}), gpu(2, 1, {0: 2})
    assert pair_score(a, b) == 20  # same NUMA node, no NVLink
    assert pair_score(a, c) == 10 + 200  # across the socket link, two NVLinks
    assert best_effort([a, b, c], [a], 2, pair_score) == [a, c]


def test_best_effort_keeps_the_pairs_it_leaves_behind_usable() -> None:
    """The single best pair is (1, 2); splitting the node into (0, 1) + (2, 3) scores
    more in total, so go-gpuallocator picks from that partition."""
    score = {(0, 1): 200, (2, 3): 200, (1, 2): 300, (0, 2): 10, (0, 3): 10, (1, 3): 10}
    devices = [0, 1, 2, 3]
    picked = best_effort(devices, [], 2, lambda x, y: score[tuple(sorted((x, y)))])
    assert picked == [0, 1]


def test_best_effort_edge_cases() -> None:
    assert best_effort([0, 1], [], 3, lambda x, y: 1) == []
    assert best_effort([0, 1], [], 0, lambda x, y: 1) == []
    assert best_effort([0, 1, 2], [], 1, lambda x, y: 1) == [0]
    assert best_effort([0, 1, 2], [5], 2, lambda x, y: 1) == []  # required not available


def test_all_to_all_nvlink_board_stays_on_one_numa_node() -> None:
    gpus, devices = node("a100-sxm4-40gb-x8")
    all_ids = [uuid(i) for i in range(8)]
    pair = preferred_allocation(all_ids, [], 2, devices, gpus)
    assert len({gpus[devices[i].gpu_index].numa_node for i in pair}) == 1
    four = preferred_allocation(all_ids[1:], [], 4, devices, gpus)
    assert sorted(four) == sorted(all_ids[4:8])  # GPU 0 is taken: NUMA node 1 is whole
    with_must = preferred_allocation(all_ids, [all_ids[6]], 2, devices, gpus)
    assert all_ids[6] in with_must and {devices[i].numa_node for i in with_must} == {1}


def test_an_nvlink_bridge_wins_over_numa() -> None:
    # mixed: A100 0-1 bridged by NVLink on NUMA 0, T4 2-3 on NUMA 1
    gpus, devices = node("mixed")
    assert sorted(preferred_allocation([uuid(i) for i in range(4)], [], 2, devices, gpus)) == (
        sorted([uuid(0), uuid(1)])
    )


def test_unknown_ids_are_errors_for_whole_gpus() -> None:
    gpus, devices = node("t4-x4")
    with pytest.raises(AllocationError, match="no device with uuid: GPU-x"):
        preferred_allocation([uuid(0), "GPU-x"], [], 1, devices, gpus)


def test_replicas_spread_over_gpus_distributed_or_fill_one_packed() -> None:
    gpus, devices = node("t4-x4", Config(time_slicing=time_slicing(4)))
    ids = list(devices)
    two = preferred_allocation(ids, [], 2, devices, gpus)
    assert len({devices[i].gpu_index for i in two}) == 2
    # GPU 0 has 3 replicas handed out already: distributed avoids it, packed fills it
    available = [i for i in ids if not (devices[i].gpu_index == 0 and devices[i].replica != 3)]
    spread = greedy_allocation(available, [], 3, devices, "distributed")
    assert 0 not in {devices[i].gpu_index for i in spread}
    packed = greedy_allocation(available, [], 1, devices, "packed")
    assert devices[packed[0]].gpu_index == 0
    with pytest.raises(AllocationError, match="not enough available devices"):
        greedy_allocation(ids[:2], [], 3, devices)


def test_mig_devices_use_the_greedy_policy() -> None:
    gpus, devices = node("a100-80gb-mig-x8", Config(mig_strategy="mixed"))
    one_g = [i for i, d in devices.items() if d.uuid.startswith("MIG-")][:3]
    assert preferred_allocation(one_g, [one_g[2]], 2, devices, gpus)[0] == one_g[2]


def test_validate_request_as_upstream() -> None:
    _, devices = node("t4-x4", Config(time_slicing=time_slicing(2)))
    shared = parse(
        "sharing: {timeSlicing: {failRequestsGreaterThanOne: true, "
        "resources: [{name: gpu, replicas: 2}]}}"
    )
    two = list(devices)[:2]
    validate_request(two, devices, Config(time_slicing=time_slicing(2)))
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        validate_request(two, devices, shared)
    validate_request(two[:1], devices, shared)
    with pytest.raises(AllocationError, match="unknown device: GPU-nope"):
        validate_request(["GPU-nope"], devices, Config())


def test_allocate_response_uuids_once_and_device_specs_only_when_asked() -> None:
    _, devices = node("t4-x4", Config(time_slicing=time_slicing(2)))
    ids = [f"{uuid(2)}::0", f"{uuid(2)}::1", f"{uuid(0)}::1"]
    plain = container_allocation(ids, devices, False, lambda p: True)
    assert plain.envs == {"NVIDIA_VISIBLE_DEVICES": f"{uuid(2)},{uuid(0)}"}
    assert plain.devices == ()
    specs = container_allocation(ids, devices, True, lambda p: p == "/dev/nvidia-uvm")
    # the optional driver nodes only where they exist on the host
    assert [s.host_path for s in specs.devices] == [
        "/dev/nvidia-uvm",
        "/dev/nvidia2",
        "/dev/nvidia0",
    ]


def test_mig_allocations_carry_their_nvidia_caps_devices() -> None:
    _, devices = node("a100-80gb-mig-x8", Config(mig_strategy="mixed"))
    mig = profiles.mig_uuid(NODE, 4, 2)  # GPU 4, GPU instance 3, compute instance 0
    specs = container_allocation([mig], devices, True, lambda p: False).devices
    assert [s.container_path for s in specs] == [
        "/dev/nvidia4",
        f"/dev/nvidia-caps/nvidia-cap{3 + 4 * 135 + 3 * 9}",
        f"/dev/nvidia-caps/nvidia-cap{3 + 4 * 135 + 3 * 9 + 1}",
    ]


def test_the_trace_tells_options_and_each_part_of_the_allocate_response() -> None:
    """kubelet's GetDevicePluginOptions is a step of its own, and the Allocate line names
    what the container runtime gets: the envs, the device nodes (none without
    passDeviceSpecs) and the mounts (the lab's fake driver)."""
    gpus = inventory.gpu_infos(profiles.load("t4-x4"), "n1")
    log = io.StringIO()
    resource = build_resources(gpus, Config())[0]
    plugin = NvidiaDevicePlugin(
        resource, gpus, Config(), Path("/nonexistent"), Tracer("device-plugin", None, stream=log),
        "n1", xid_filter({}), DefaultAllocator(Config(), gpus, bool),
        driver=DriverFiles("/var/lib/fake-gpu/n1/config"),
    )  # fmt: skip
    options = plugin.GetDevicePluginOptions(api_pb2.Empty(), None)
    assert options.get_preferred_allocation_available
    ids = [d.id for d in resource.devices[:2]]
    request = api_pb2.AllocateRequest()
    request.container_requests.add(devices_ids=ids)
    plugin.Allocate(request, None)
    steps = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [s["step"] for s in steps] == ["GetDevicePluginOptions", "Allocate"]
    assert "GetPreferredAllocationAvailable=true" in steps[0]["message"]
    assert steps[1]["message"] == (
        f"nvidia.com/gpu: 2 ID(s) known (ValidateRequest) → NVIDIA_VISIBLE_DEVICES="
        f"{gpus[0].uuid},{gpus[1].uuid}; Devices: none; Mounts: 1 (lab: the fake driver)"
    )
