"""Reading the node's GPUs through NVML (pynvml from nvidia-ml-py) - the plugin's only view of them.

Mirrors what NVIDIA k8s-device-plugin reads via go-nvml/go-nvlib in ``internal/rm/nvml_devices.go``
(UUID, name, memory, compute capability, minor number, NUMA node, MIG devices) and what
go-gpuallocator reads for NVLink topology. Which ``libnvidia-ml.so.1`` is loaded is decided
by the process environment (the fake-gpu shim sets ``LD_LIBRARY_PATH``); nothing here knows
about the shim.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

from gpulab.deviceplugin.rm import GPUInfo, MigInfo, mig_profile_name

_log = logging.getLogger(__name__)


class NVMLInitError(RuntimeError):
    """NVML could not be initialised: no driver (or shim) on this node."""


def init() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NVMLInitError(
            f"NVML init failed: {exc}; is libnvidia-ml.so.1 (the driver or the fake-gpu "
            "shim) on the library path of this process?"
        ) from exc


def shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        _log.warning("NVML shutdown failed: %s", exc)


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_inventory() -> list[GPUInfo]:
    """Every GPU (and its MIG devices) NVML reports. NVML must be initialised."""
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    peers = _nvlink_peers(handles)
    return [_gpu(i, h, peers[i]) for i, h in enumerate(handles)]


def _gpu(index: int, handle: object, peers: tuple[int, ...]) -> GPUInfo:
    memory_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
    mig_capable, mig_enabled = _mig_mode(handle)
    return GPUInfo(
        index=index,
        uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
        name=text(pynvml.nvmlDeviceGetName(handle)),
        memory_mib=memory_mib,
        compute_capability=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),  # type: ignore[arg-type]
        minor=_minor(index, handle),
        numa_node=_numa_node(handle),
        nvlink_peers=peers,
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        migs=_migs(handle, memory_mib) if mig_enabled else (),
    )


def _minor(index: int, handle: object) -> int:
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError:
        return index  # what the driver assigns when nothing else is plugged in


def _numa_node(handle: object) -> int | None:
    """NUMA node of the GPU: NVML first, then sysfs (what upstream reads), else unknown."""
    try:
        node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        return node if node >= 0 else None
    except pynvml.NVMLError:
        pass
    bus_id = text(pynvml.nvmlDeviceGetPciInfo(handle).busId).lower()
    path = Path("/sys/bus/pci/devices") / bus_id.removeprefix("0000") / "numa_node"
    try:
        node = int(path.readtext().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _mig_mode(handle: object) -> tuple[bool, bool]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # NOT_SUPPORTED: not a MIG-capable GPU
        return False, False
    return True, current == pynvml.NVML_DEVICE_MIG_ENABLE


def _migs(handle: object, gpu_memory_mib: int) -> tuple[MigInfo, ...]:
    migs = []
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError_NotFound:
            continue
        attrs = pynvml.nvmlDeviceGetAttributes(mig)
        migs.append(
            MigInfo(
                index=i,
                uuid=text(pynvml.nvmlDeviceGetUUID(mig)),
                gi_id=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                ci_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
                profile=mig_profile_name(
                    attrs.gpuInstanceSliceCount, attrs.memorySizeMB, gpu_memory_mib
                ),
                memory_mib=int(attrs.memorySizeMB),
            )
        )
    return tuple(migs)


def _nvlink_peers(handles: list[object]) -> list[tuple[int, ...]]:
    """GPU pairs that can talk peer-to-peer over NVLink (what go-gpuallocator scores)."""
    peers: list[list[int]] = [[] for _ in handles]
    for i, a in enumerate(handles):
        for j in range(i + 1, len(handles)):
            try:
                status = pynvml.nvmlDeviceGetP2PStatus(
                    a, handles[j], pynvml.NVML_P2P_CAPS_INDEX_NVLINK
                )
            except pynvml.NVMLError:
                continue
            if status == pynvml.NVML_P2P_STATUS_OK:
                peers[i].append(j)
                peers[j].append(i)
    return [tuple(p) for p in peers]
