"""Which devices to prefer, and what a container gets for the devices it was given.

Mirrors NVIDIA k8s-device-plugin ``internal/rm/allocate.go`` (``alignedAlloc`` through
go-gpuallocator's best-effort policy for whole GPUs, ``distributedAlloc`` for time-sliced
replicas) and the response part of ``internal/plugin/server.go`` (``getAllocateResponse``:
``NVIDIA_VISIBLE_DEVICES`` plus device specs). Pure functions over :class:`rm.Device`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import comb

from gpulab.deviceplugin.rm import Device

# Device nodes every CUDA container needs besides its GPUs (upstream passes these with
# --pass-device-specs).
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
# Beyond this many candidate sets, pick greedily instead of trying every combination.
_MAX_COMBINATIONS = 20_000


class AllocationError(ValueError):
    """A request names devices the plugin cannot hand out; the message names them."""


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class ContainerAllocation:
    """What kubelet hands the runtime for one container (a ContainerAllocateResponse)."""

    envs: dict[str, str]
    devices: tuple[DeviceSpec, ...]


def check_request(
    ids: Sequence[str], devices: Mapping[str, Device], healthy: Mapping[str, bool]
) -> None:
    """Reject IDs this resource does not have, or whose device is unhealthy."""
    unknown = [i for i in ids if i not in devices]
    if unknown:
        raise AllocationError(f"unknown device(s): {', '.join(unknown)}")
    sick = [i for i in ids if not healthy.get(i, False)]
    if sick:
        raise AllocationError(f"unhealthy device(s): {', '.join(sick)}")


def container_allocation(ids: Sequence[str], devices: Mapping[str, Device]) -> ContainerAllocation:
    """Envs and device specs for ``ids`` (replica IDs map back to their UUID, once each)."""
    picked = [devices[i] for i in ids]
    uuids = list(dict.fromkeys(d.uuid for d in picked))
    paths = list(dict.fromkeys(p for d in picked for p in d.paths))
    specs = tuple(DeviceSpec(p, p) for p in [*paths, *CONTROL_DEVICES])
    return ContainerAllocation({VISIBLE_DEVICES_ENV: ",".join(uuids)}, specs)


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    devices: Mapping[str, Device],
    nvlink_peers: Mapping[int, Iterable[int]],
) -> list[str]:
    """The device IDs to prefer for one container (GetPreferredAllocation).

    Always contains ``must_include``. Whole GPUs: the set spanning the fewest NUMA nodes,
    then with the most NVLink-connected pairs, then the lowest indexes. Replicas: spread
    over the physical GPUs that have the most replicas still free.
    """
    must = list(dict.fromkeys(must_include))
    unknown = [i for i in [*available, *must] if i not in devices]
    if unknown:
        raise AllocationError(f"unknown device(s): {', '.join(unknown)}")
    if size < len(must):
        raise AllocationError(
            f"allocation_size {size} is smaller than must_include_deviceIDs ({len(must)})"
        )
    candidates = [i for i in dict.fromkeys(available) if i not in must]
    need = size - len(must)
    if need > len(candidates):
        raise AllocationError(
            f"cannot pick {size} device(s): only {len(candidates) + len(must)} available"
        )
    if need == 0:
        return must
    if any(devices[i].replica is not None for i in candidates):
        return must + _distributed(candidates, must, need, devices)
    return must + _aligned(candidates, must, need, devices, nvlink_peers)


def _set_key(
    ids: Sequence[str], devices: Mapping[str, Device], peers: Mapping[int, set[int]]
) -> tuple[int, int, tuple[int, ...]]:
    gpus = [devices[i].gpu_index for i in ids]
    numa = {devices[i].numa_node for i in ids}
    linked = sum(1 for a, b in itertools.combinations(gpus, 2) if b in peers.get(a, set()))
    return (len(numa), -linked, tuple(sorted(gpus)))


def _aligned(
    candidates: list[str],
    must: list[str],
    need: int,
    devices: Mapping[str, Device],
    nvlink_peers: Mapping[int, Iterable[int]],
) -> list[str]:
    peers = {k: set(v) for k, v in nvlink_peers.items()}
    ordered = sorted(candidates, key=lambda i: devices[i].gpu_index)
    if comb(len(ordered), need) <= _MAX_COMBINATIONS:
        best = min(
            itertools.combinations(ordered, need),
            key=lambda extra: _set_key([*must, *extra], devices, peers),
        )
        return list(best)
    # Greedy: grow the set one device at a time, each time the best next device.
    chosen: list[str] = []
    for _ in range(need):
        rest = [i for i in ordered if i not in chosen]
        chosen.append(min(rest, key=lambda i: _set_key([*must, *chosen, i], devices, peers)))
    return chosen


def _distributed(
    candidates: list[str], must: list[str], need: int, devices: Mapping[str, Device]
) -> list[str]:
    free = Counter(devices[i].gpu_index for i in candidates)
    used = Counter(devices[i].gpu_index for i in must)
    chosen: list[str] = []
    pool = sorted(candidates, key=lambda i: (devices[i].gpu_index, devices[i].replica or 0))
    for _ in range(need):
        # The GPU this container uses least, then the one with the most replicas free.
        best = min(
            (i for i in pool if i not in chosen),
            key=lambda i: (
                used[devices[i].gpu_index],
                -free[devices[i].gpu_index],
                devices[i].gpu_index,
            ),
        )
        chosen.append(best)
        used[devices[best].gpu_index] += 1
        free[devices[best].gpu_index] -= 1
    return chosen
