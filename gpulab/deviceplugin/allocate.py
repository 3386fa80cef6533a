"""Which devices to prefer, whether a request is valid, and what a container gets.

Mirrors NVIDIA k8s-device-plugin v0.20.0:

- ``internal/rm/nvml_manager.go`` ``getPreferredAllocation``: whole GPUs without replicas
  go to ``alignedAlloc`` = NVIDIA/go-gpuallocator v0.6.0 ``NewBestEffortPolicy().Allocate``
  (``gpuallocator/besteffort_policy.go``); everything else (replicas, MIG devices) to
  ``internal/rm/allocate.go`` ``greedyAlloc`` with the ``distributed`` (default) or
  ``packed`` comparator;
- ``internal/rm/rm.go`` ``ValidateRequest``;
- ``internal/plugin/server.go`` ``getAllocateResponse``: ``NVIDIA_VISIBLE_DEVICES`` = the
  unique UUIDs behind the requested IDs, and DeviceSpecs (``apiDeviceSpecs`` over
  ``GetDevicePaths``) only with ``--pass-device-specs``.

Pure functions over :class:`rm.Device` and :class:`rm.GPUInfo`. Where upstream iterates a
Go map (random order) the lab uses the devices' NVML order, so results are repeatable.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gpulab.deviceplugin.config import SHARING_TIME_SLICING, Config
from gpulab.deviceplugin.rm import Device, GPUInfo, base_id, has_annotations

# Device nodes every CUDA container needs besides its GPUs, as HAMi's plugin passes them.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm")
# nvml_manager.go GetDevicePaths: the driver's nodes; the last three only where they exist.
DRIVER_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
OPTIONAL_DEVICES = frozenset(DRIVER_DEVICES)  # apiDeviceSpecs stats these before passing them
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"

# go-gpuallocator calculateGPUPairScore: PCIe path by nvmlGpuTopologyLevel_t ...
_P2P_SCORE = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
# ... and 100 per NVLink between the two GPUs (up to 18 links).
_NVLINK_SCORE = 100
_MAX_NVLINKS = 18

T = TypeVar("T")


class AllocationError(ValueError):
    """A request the plugin refuses; the message is what upstream's error says."""


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


# ---------------------------------------------------------------- Allocate


def validate_request(ids: Sequence[str], devices: Mapping[str, Device], config: Config) -> None:
    """Upstream ``ValidateRequest``: every ID known; with failRequestsGreaterThanOne, a
    time-sliced resource hands out one replica per container. Health is not checked:
    kubelet only offers healthy devices, and the plugin does not second-guess it."""
    for device_id in ids:
        if device_id not in devices:
            raise AllocationError(f"invalid request: unknown device: {device_id}")
    fail_gt_one = config.time_slicing.fail_requests_greater_than_one
    if (
        config.sharing_strategy == SHARING_TIME_SLICING
        and any(has_annotations(i) for i in ids)
        and len(ids) > 1
        and fail_gt_one
    ):
        raise AllocationError(
            f"invalid request: maximum request size for shared resources is 1; found {len(ids)}"
        )


def unique_uuids(ids: Sequence[str]) -> list[str]:
    """``uniqueDeviceIDsFromAnnotatedDeviceIDs`` (device-id-strategy uuid), request order."""
    return list(dict.fromkeys(base_id(i) for i in ids))


def device_paths(ids: Sequence[str], devices: Mapping[str, Device]) -> list[str]:
    """``GetDevicePaths``: the driver's nodes, then the paths of the devices requested."""
    own = [p for i in dict.fromkeys(ids) if i in devices for p in devices[i].paths]
    return list(dict.fromkeys([*DRIVER_DEVICES, *own]))


def container_allocation(
    ids: Sequence[str],
    devices: Mapping[str, Device],
    pass_device_specs: bool,
    present: Callable[[str], bool],
) -> ContainerAllocation:
    """``getAllocateResponse`` with the envvar device-list strategy.

    ``present`` tells whether an optional driver node exists on this host (upstream
    stats ``/dev/nvidia-uvm`` & co. and leaves out the missing ones).
    """
    envs = {VISIBLE_DEVICES_ENV: ",".join(unique_uuids(ids))}
    specs: tuple[DeviceSpec, ...] = ()
    if pass_device_specs:
        specs = tuple(
            DeviceSpec(p, p)
            for p in device_paths(ids, devices)
            if p not in OPTIONAL_DEVICES or present(p)
        )
    return ContainerAllocation(envs, specs)


# ---------------------------------------------------------------- GetPreferredAllocation


def preferred_allocation(
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    devices: Mapping[str, Device],
    gpus: Mapping[int, GPUInfo],
    policy: str = "distributed",
) -> list[str]:
    """``nvmlResourceManager.getPreferredAllocation`` for one container request."""
    if all(d.aligned_allocation_supported for d in devices.values()) and not any(
        has_annotations(i) for i in available
    ):
        return aligned_allocation(available, required, size, devices, gpus)
    return greedy_allocation(available, required, size, devices, policy)


def aligned_allocation(
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    devices: Mapping[str, Device],
    gpus: Mapping[int, GPUInfo],
) -> list[str]:
    """``alignedAlloc``: go-gpuallocator's best-effort policy over the available GPUs."""

    def resolve(ids: Sequence[str], what: str) -> list[GPUInfo]:
        out = []
        for i in ids:
            if i not in devices:
                raise AllocationError(
                    f"unable to retrieve list of {what} devices: no device with uuid: {i}"
                )
            out.append(gpus[devices[i].gpu_index])
        return out

    chosen = best_effort(
        resolve(available, "available"), resolve(required, "required"), size, pair_score
    )
    return [g.uuid for g in chosen]


def pair_score(a: GPUInfo, b: GPUInfo) -> int:
    """go-gpuallocator ``calculateGPUPairScore``: the PCIe path plus 100 per NVLink, so
    NVLinks outweigh any PCIe/NUMA difference."""
    if a.index == b.index:
        return 0
    links = a.nvlinks.get(b.index, 0)
    return _P2P_SCORE.get(a.topology.get(b.index, -1), 0) + _NVLINK_SCORE * min(links, _MAX_NVLINKS)


def best_effort(
    available: Sequence[T], required: Sequence[T], size: int, score: Callable[[T, T], int]
) -> list[T]:
    """go-gpuallocator ``bestEffortPolicy.Allocate``.

    Not the single best set: the available GPUs are split into sets of ``size`` every
    possible way, the partition with the highest total score wins (so one allocation does
    not strand the GPUs left behind), and from it the best set holding ``required``.
    """
    if size <= 0 or len(available) < size or len(required) > size:
        return []

    def set_score(gpus: Sequence[T | None]) -> int:
        return sum(
            score(x, y)
            for x, y in itertools.combinations(gpus, 2)
            if x is not None and y is not None
        )

    def has_all(gpus: Sequence[T | None]) -> bool:
        return all(any(g is r for g in gpus) for r in required)

    best: list[list[T | None]] | None = None
    best_total = 0
    for partition in _partitions(list(available), size):
        if not any(has_all(s) and None not in s for s in partition):
            continue
        total = sum(set_score(s) for s in partition)
        if best is None or total > best_total:
            best, best_total = partition, total
    if best is None:
        return []
    # The best set with every required GPU (upstream would crash on a padded one).
    candidates = [s for s in best if has_all(s) and None not in s]
    winner = max(candidates, key=set_score)  # max keeps the first of equals, as upstream
    return [g for g in winner if g is not None]


def _partitions(devices: list[T], size: int) -> Iterator[list[list[T | None]]]:
    """go-gpuallocator ``iterateGPUPartitions``: every split of ``devices`` into sets of
    ``size`` (padded with None to a multiple of ``size``), each partition once."""
    if size == 1:
        for d in devices:
            yield [[d]]
        return
    padded: list[T | None] = [*devices, *[None] * (-len(devices) % size)]
    padding = padded.count(None)

    def walk(rest: list[T | None], accum: list[list[T | None]]) -> Iterator[list[list[T | None]]]:
        if len(rest) == size:
            yield [*accum, rest]
            return
        for tail in itertools.combinations(rest[1:], size - 1):
            chosen = [rest[0], *tail]
            pads = chosen.count(None)
            if pads not in (0, padding):
                continue
            remaining = [d for d in rest if not any(d is c for c in chosen)]
            yield from walk(remaining, [*accum, chosen])

    yield from walk(padded, [])


def greedy_allocation(
    available: Sequence[str],
    required: Sequence[str],
    size: int,
    devices: Mapping[str, Device],
    policy: str = "distributed",
) -> list[str]:
    """``greedyAlloc``: pick one device at a time from the physical GPU the policy prefers.

    ``distributed`` prefers the GPU with the fewest replicas already handed out (spread),
    ``packed`` the one with the most; ties go to the GPU this request has taken least from.
    """
    required_known = {i for i in required if i in devices}
    order = {d: n for n, d in enumerate(devices)}
    candidates = sorted(
        {i for i in available if i in devices} - required_known, key=lambda i: order[i]
    )
    needed = size - len(required)
    if len(candidates) < needed:
        raise AllocationError("not enough available devices to satisfy allocation")
    free = Counter(base_id(i) for i in candidates)
    total = Counter(base_id(i) for i in devices if base_id(i) in free)
    picked: Counter[str] = Counter()
    sign = 1 if policy == "distributed" else -1
    chosen: list[str] = []
    for _ in range(max(needed, 0)):
        candidates.sort(
            key=lambda i: (sign * (total[base_id(i)] - free[base_id(i)]), picked[base_id(i)])
        )
        pick = candidates.pop(0)
        picked[base_id(pick)] += 1
        free[base_id(pick)] -= 1
        chosen.append(pick)
    return [*required, *chosen]
