"""Reading the node's GPUs through NVML (pynvml from nvidia-ml-py): the lab's one NVML reader.

The device plugin reads its inventory here, and so does ``gpulab fake-gpu smi``. Mirrors
what NVIDIA k8s-device-plugin v0.20.0 reads through go-nvml/go-nvlib
(``internal/rm/nvml_devices.go``: UUID, name, memory, compute capability, minor number,
NUMA node from sysfs; MIG devices with their GPU/compute instance IDs and attributes) and
what go-gpuallocator v0.6.0 ``NewDevices`` reads for topology (the common PCIe ancestor of
each pair, and NVLinks counted by each link's remote PCI bus ID). Which
``libnvidia-ml.so.1`` is loaded is decided by the process environment (the fake-gpu shim
sets ``LD_LIBRARY_PATH``); nothing here knows about the shim.

A MIG device's profile name comes from its attributes (slices and memory, as go-nvlib's
``getMigMemorySizeGB``) instead of go-nvlib's walk through the GPU- and compute-instance
profiles; for the full-size compute instances the lab's profiles define, both give the same
name (the shim's component tests walk it both ways).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pynvml

from gpulab.deviceplugin.rm import GPUInfo, MigInfo, mig_profile_name

_log = logging.getLogger(__name__)

SYSFS_PCI = Path("/sys/bus/pci/devices")


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
    bus_ids = [text(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    return [_gpu(i, h, handles, bus_ids) for i, h in enumerate(handles)]


def _gpu(index: int, handle: object, handles: list[object], bus_ids: list[str]) -> GPUInfo:
    memory_mib = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
    mig_capable, mig_enabled = _mig_mode(handle)
    return GPUInfo(
        index=index,
        uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
        name=text(pynvml.nvmlDeviceGetName(handle)),
        memory_mib=memory_mib,
        compute_capability=tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle)),  # type: ignore[arg-type]
        minor=_minor(index, handle),
        numa_node=_numa_node(handle, bus_ids[index]),
        pci_bus_id=bus_ids[index],
        topology={
            j: int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handle, other))
            for j, other in enumerate(handles)
            if j != index
        },
        nvlinks=_nvlinks(handle, index, bus_ids),
        mig_capable=mig_capable,
        mig_enabled=mig_enabled,
        migs=_migs(handle, memory_mib) if mig_enabled else (),
    )


def _minor(index: int, handle: object) -> int:
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError:
        return index  # what the driver assigns when nothing else is plugged in


def _numa_node(handle: object, bus_id: str) -> int | None:
    """NUMA node of the GPU: NVML first, then sysfs (what upstream reads), else unknown."""
    try:
        node = int(pynvml.nvmlDeviceGetNumaNodeId(handle))
        return node if node >= 0 else None
    except pynvml.NVMLError:
        pass
    path = SYSFS_PCI / bus_id.lower().removeprefix("0000") / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _nvlinks(handle: object, index: int, bus_ids: list[str]) -> dict[int, int]:
    """Other GPU index -> active NVLinks to it (go-gpuallocator ``GetNVLink``)."""
    counts: dict[int, int] = {}
    lowered = [b.lower() for b in bus_ids]
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            continue
        if remote in lowered and lowered.index(remote) != index:
            peer = lowered.index(remote)
            counts[peer] = counts.get(peer, 0) + 1
    return counts


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
        a = pynvml.nvmlDeviceGetAttributes(mig)
        migs.append(
            MigInfo(
                index=i,
                uuid=text(pynvml.nvmlDeviceGetUUID(mig)),
                gi_id=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                ci_id=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
                profile=mig_profile_name(a.gpuInstanceSliceCount, a.memorySizeMB, gpu_memory_mib),
                memory_mib=int(a.memorySizeMB),
                # GFD's MIG attribute labels (internal/resource/nvml-mig-device.go)
                attributes={
                    "memory": int(a.memorySizeMB),
                    "multiprocessors": int(a.multiprocessorCount),
                    "slices.gi": int(a.gpuInstanceSliceCount),
                    "slices.ci": int(a.computeInstanceSliceCount),
                    "engines.copy": int(a.sharedCopyEngineCount),
                    "engines.decoder": int(a.sharedDecoderCount),
                    "engines.encoder": int(a.sharedEncoderCount),
                    "engines.jpeg": int(a.sharedJpegCount),
                    "engines.ofa": int(a.sharedOfaCount),
                },
            )
        )
    return tuple(migs)
