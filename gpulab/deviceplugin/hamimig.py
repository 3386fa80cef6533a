"""HAMi's MIG mode, the device plugin's side: which MIG profiles a GPU registers, and the MIG
instances it creates, through NVML, exactly where the scheduler reserved them.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/``:

- ``register.go`` ``discoverMigProfiles``: for the first ``migProfileAllowlist`` entry
  whose models the GPU's name contains, each profile's size, slices, instance count and
  possible placements from NVML (``nvmlDeviceGetGpuInstanceProfileInfo``,
  ``nvmlDeviceGetGpuInstancePossiblePlacements_v2``), its share of the SMs rounded up;
- ``migmgr.go`` ``MigInstanceManager``: ``ResetIdleGPUs`` (MIG mode on, every instance
  destroyed, on GPUs no pod holds), ``ensureMigModeEnabled``, ``destroyAllMigInstances``,
  ``EnsureAllocation`` (the reserved profile at the reserved placement:
  ``nvmlDeviceCreateGpuInstanceWithPlacement``, then a full-size compute instance; the MIG
  UUID found by GPU instance ID), ``Release``, ``AdoptAllocation``,
  ``ReconcileActiveAllocations``, ``AllocationRuntimeInfo``;
- ``mig_startup.go`` ``collectInUseGPUs`` (the GPUs live pods' ``hami.io/vgpu-mig-allocations``
  name; NVML's running processes add none here: the fake driver runs none) and
  ``server.go`` ``activeMigAllocationKeys`` (what the 5 s reconciler keeps).

NVML comes from the process (the fake-gpu shim on every backend of the lab), which keeps
the MIG changes in the node's MIG state, so a container started afterwards sees its MIG
device.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pynvml

from gpulab.deviceplugin.allocate import AllocationError
from gpulab.deviceplugin.nvml import text
from gpulab.hami import annotations as ha
from gpulab.hami.config import MigAllowlist

_log = logging.getLogger(__name__)

# profileNameToGIProfileID / profileNameToCIProfileID: by the profile name's slice part
GI_PROFILES = {
    "1g": pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    "2g": pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    "3g": pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    "4g": pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    "6g": pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE,
    "7g": pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    "8g": pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE,
}
CI_PROFILES = {
    "1g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    "2g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    "3g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    "4g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    "6g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    "7g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    "8g": pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
RECONCILE_SECONDS = 5.0  # runMigAnnotationReconciler(5 * time.Second)
_MAX_INSTANCES = 8

Key = tuple[int, str, int, int]  # migAllocationKey: GPU index, profile, placement start, size


def slice_key(profile: str) -> str:
    """``profileSliceKey``: "3g.20gb" → "3g"."""
    head, dot, _ = profile.partition(".")
    return head if dot and head else profile


def _possible(handle: object, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    placements = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
        handle, profile_id, placements, ctypes.byref(count)
    )
    return [(p.start, p.size) for p in placements[: count.value]]


def discover_profiles(
    handle: object, model: str, allowlist: Sequence[MigAllowlist]
) -> tuple[ha.MigProfile, ...]:
    """``discoverMigProfiles`` for one GPU (MIG mode on, for the placements)."""
    full = 0
    for enum in GI_PROFILES.values():
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
        except pynvml.NVMLError:
            continue
        full = max(full, info.multiprocessorCount)
    out = []
    for allowed in allowlist:
        if not any(m in model for m in allowed.models):
            continue
        for name in allowed.profiles:
            enum = GI_PROFILES.get(slice_key(name))
            if enum is None:
                continue
            try:
                info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
                placements = _possible(handle, info.id)
            except pynvml.NVMLError as exc:
                _log.info("skip MIG profile placement discovery: %s: %s", name, exc)
                continue
            core = math.ceil(info.multiprocessorCount * 100 / full) if full else 0
            out.append(
                ha.MigProfile(
                    name=name,
                    memory_mb=int(info.memorySizeMB),
                    core=core,
                    slice_count=int(info.sliceCount),
                    placements=tuple(placements),
                    instance_count=int(info.instanceCount),
                )
            )
        break
    return tuple(out)


def gpu_profiles(
    gpus: Iterable[tuple[int, str, str]], allowlist: Sequence[MigAllowlist]
) -> dict[str, tuple[ha.MigProfile, ...]]:
    """Each GPU's (index, UUID, name) → its discovered profiles, as getAPIDevices asks."""
    return {uuid: discover_profiles(_handle(i), name, allowlist) for i, uuid, name in gpus}


def supports_mig(names: Iterable[str], allowlist: Sequence[MigAllowlist]) -> bool:
    """``deviceSupportMig``: every GPU's model is in some allowlist entry."""
    listed = list(names)
    return bool(listed) and all(any(m in n for a in allowlist for m in a.models) for n in listed)


@dataclass(frozen=True)
class MigInstance:
    """``migInstance``: a live GPU + compute instance bound to a reservation."""

    profile: str
    start: int
    size: int
    gi_id: int
    ci_id: int
    mig_uuid: str


def key_of(gpu_index: int, allocation: ha.MigAllocation) -> Key:
    return (gpu_index, allocation.profile, allocation.start, allocation.size)


def active_keys(pods: Iterable[Mapping], gpu_index: Mapping[str, int]) -> set[Key]:
    """``activeMigAllocationKeys``: the reservations of pods that still hold them (not
    terminating, not finished). AllocationError for an annotation that does not decode or
    a GPU not on this node (the reconcile is destructive: it then does nothing)."""
    out = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        raw = (meta.get("annotations") or {}).get(ha.MIG_ALLOCATIONS, "")
        try:
            allocations = ha.decode_mig_allocations(raw)
        except ha.AnnotationError as exc:
            name = f"{meta.get('namespace')}/{meta.get('name')}"
            raise AllocationError(f"decode MIG allocations for pod {name}: {exc}") from exc
        for a in allocations:
            if a.gpu_uuid not in gpu_index:
                raise AllocationError(f"resolve active MIG parent GPU {a.gpu_uuid!r}")
            out.add(key_of(gpu_index[a.gpu_uuid], a))
    return out


def _handle(gpu_index: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(gpu_index)


def ensure_mig_mode(gpu_index: int) -> None:
    """``ensureMigModeEnabled``: MIG mode on (no-op where MIG is not supported)."""
    handle = _handle(gpu_index)
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        return
    if current == pynvml.NVML_DEVICE_MIG_ENABLE:
        if pending != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise AllocationError(f"gpu {gpu_index} mig mode disable is pending")
        return
    pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    current, _ = pynvml.nvmlDeviceGetMigMode(_handle(gpu_index))
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        raise AllocationError(f"gpu {gpu_index} mig mode is not enabled after set")


def _gpu_instances(handle: object, profile_id: int) -> list[object]:
    arr = (pynvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
    count = ctypes.c_uint(0)
    pynvml.nvmlDeviceGetGpuInstances(handle, profile_id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]


def _compute_instances(gi: object, profile_id: int) -> list[object]:
    arr = (pynvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
    count = ctypes.c_uint(0)
    pynvml.nvmlGpuInstanceGetComputeInstances(gi, profile_id, arr, ctypes.byref(count))
    return [arr[i] for i in range(count.value)]


def destroy_all(handle: object) -> None:
    """``destroyAllMigInstances``: every compute instance, then every GPU instance."""
    for enum in GI_PROFILES.values():
        try:
            info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum, version=1)
            gis = _gpu_instances(handle, info.id)
        except pynvml.NVMLError:
            continue
        for gi in gis:
            for ci_enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gi, ci_enum, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                    cis = _compute_instances(gi, ci_info.id)
                except pynvml.NVMLError:
                    continue
                for ci in cis:
                    pynvml.nvmlComputeInstanceDestroy(ci)
            pynvml.nvmlGpuInstanceDestroy(gi)


def find_mig_uuid(handle: object, gi_id: int) -> str:
    """``findMigUUIDForGI``: the MIG device of GPU instance ``gi_id``."""
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except pynvml.NVMLError:
            continue
        if pynvml.nvmlDeviceGetGpuInstanceId(mig) == gi_id:
            return text(pynvml.nvmlDeviceGetUUID(mig))
    raise AllocationError(f"no MIG device found for GI {gi_id}")


class MigInstanceManager:
    """``MigInstanceManager``: the node's one authority over live MIG instances, keyed by
    the scheduler's reservation. NVML must stay initialised while it is used."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[Key, MigInstance] = {}

    def reset_idle_gpus(self, count: int, in_use: set[int]) -> list[int]:
        """``ResetIdleGPUs``: MIG mode on and no instance left on every GPU not in use."""
        reset = []
        for index in range(count):
            if index in in_use:
                continue
            with self._lock:
                ensure_mig_mode(index)
                destroy_all(_handle(index))
                self._by_key = {k: v for k, v in self._by_key.items() if k[0] != index}
            reset.append(index)
        return reset

    def runtime_info(self, key: Key) -> MigInstance | None:
        with self._lock:
            return self._by_key.get(key)

    def ensure_allocation(self, key: Key) -> tuple[str, bool]:
        """``EnsureAllocation``: (MIG UUID, created by this call). Never another placement."""
        gpu_index, profile, start, size = key
        with self._lock:
            if key in self._by_key:
                return self._by_key[key].mig_uuid, False
            gi_enum, ci_enum = (
                GI_PROFILES.get(slice_key(profile)),
                CI_PROFILES.get(slice_key(profile)),
            )
            if gi_enum is None or ci_enum is None:
                raise AllocationError(f"unsupported MIG profile {profile!r}")
            try:
                ensure_mig_mode(gpu_index)
                handle = _handle(gpu_index)
                gi_info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, gi_enum, version=1)
                if (start, size) not in _possible(handle, gi_info.id):
                    raise AllocationError(
                        f"scheduler selected invalid placement {{Start:{start} Size:{size}}} "
                        f"for profile {profile}"
                    )
                place = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
                gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, gi_info.id, ctypes.byref(place)
                )
            except pynvml.NVMLError as exc:
                raise AllocationError(
                    f"create GI profile={profile} placement={{Start:{start} Size:{size}}}: {exc}"
                ) from exc
            try:
                gi_id = pynvml.nvmlGpuInstanceGetInfo(gi).id
                ci_info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_enum, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
                ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            except pynvml.NVMLError as exc:
                pynvml.nvmlGpuInstanceDestroy(gi)
                raise AllocationError(f"create CI: {exc}") from exc
            try:
                instance = MigInstance(
                    profile, start, size, gi_id, pynvml.nvmlComputeInstanceGetInfo(ci).id,
                    find_mig_uuid(handle, gi_id),
                )  # fmt: skip
            except (pynvml.NVMLError, AllocationError):
                pynvml.nvmlComputeInstanceDestroy(ci)
                pynvml.nvmlGpuInstanceDestroy(gi)
                raise
            self._by_key[key] = instance
        _log.info("created scheduler-reserved MIG allocation %s on gpu %d: %s at %d (GI %d)",
                  instance.mig_uuid, gpu_index, profile, start, gi_id)  # fmt: skip
        return instance.mig_uuid, True

    def _destroy(self, key: Key) -> None:
        """``destroyMigInstance``; caller holds the lock. Gone already is fine."""
        instance = self._by_key.pop(key)
        handle = _handle(key[0])
        try:
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, instance.gi_id)
        except pynvml.NVMLError_NotFound:
            return
        for ci in _compute_instances(
            gi,
            pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, CI_PROFILES[slice_key(instance.profile)],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            ).id,
        ):  # fmt: skip
            pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)

    def release(self, mig_uuid: str) -> None:
        """``Release``: destroy the instance behind ``mig_uuid`` (unknown: nothing)."""
        with self._lock:
            key = next((k for k, v in self._by_key.items() if v.mig_uuid == mig_uuid), None)
            if key is not None:
                self._destroy(key)

    def adopt(self, gpu_index: int, allocation: ha.MigAllocation) -> None:
        """``AdoptAllocation``: a restarted plugin takes back an instance a live pod holds,
        if it still stands where its annotation says."""
        key = key_of(gpu_index, allocation)
        handle = _handle(gpu_index)
        for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except pynvml.NVMLError:
                continue
            if text(pynvml.nvmlDeviceGetUUID(mig)) != allocation.mig_uuid:
                continue
            gi_id = pynvml.nvmlDeviceGetGpuInstanceId(mig)
            gi = pynvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            placement = pynvml.nvmlGpuInstanceGetInfo(gi).placement
            if (gi_id, placement.start, placement.size) == (
                allocation.gpu_instance_id,
                allocation.start,
                allocation.size,
            ):
                with self._lock:
                    self._by_key[key] = MigInstance(
                        allocation.profile, allocation.start, allocation.size, gi_id,
                        pynvml.nvmlDeviceGetComputeInstanceId(mig), allocation.mig_uuid,
                    )  # fmt: skip
                return
        raise AllocationError(
            f"annotated MIG allocation {allocation.mig_uuid} profile={allocation.profile} "
            f"placement={{Start:{allocation.start} Size:{allocation.size}}} is not live"
        )

    def reconcile(self, active: set[Key]) -> None:
        """``ReconcileActiveAllocations``: destroy what no live pod holds any more."""
        with self._lock:
            for key in [k for k in self._by_key if k not in active]:
                _log.info("released MIG allocation %s", self._by_key[key].mig_uuid)
                self._destroy(key)
