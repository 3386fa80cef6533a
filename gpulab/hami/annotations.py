"""HAMi's node and pod annotations: keys, and encode/decode of their values.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device/devices.go`` (``MarshalNodeDevices``,
``UnMarshalNodeDevices``, ``EncodeContainerDevices``, ``EncodePodSingleDevice``,
``DecodeContainerDevices``, ``DecodePodDevices``), ``pkg/util/types.go`` (the keys) and the
lock format of ``pkg/util/nodelock/nodelock.go``.

SHARED module: the device plugin (``gpulab.deviceplugin.hami``, which writes the node
registration and consumes the allocation) and the extender (``gpulab.hami``, which reads
the registration and writes the allocation) both use it, so the two sides cannot drift
apart. Pure: strings and datetimes in, dataclasses out.

Formats, as v2.10.0 writes them:
- ``hami.io/node-nvidia-register``: a JSON list of ``DeviceInfo`` in Go field order
  ``{id, index, count, devmem, devcore, type, numa, mode, migProfiles, health}`` with
  ``omitempty`` (zero, false and "" are left out; v2.8 moved it from the ``id,count,...:``
  string to JSON); a MIG-mode GPU lists its ``migProfiles`` ``{name, memoryMB, core,
  sliceCount, placements: [{start, size}]}`` (``pkg/device/devices.go`` ``MigProfile``,
  no omitempty inside);
- ``hami.io/vgpu-mig-allocations`` (``pkg/device/nvidia/mig_allocations.go``): the MIG
  profile and placement Filter reserved for each MIG share, ``[{containerIndex,
  deviceIndex, gpuUUID, profile, placement: {start, size}}]``, to which the device plugin
  adds ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID`` once it created it;
- ``hami.io/node-nvidia-score``: ``[{uuid, score: {uuid: int}}]``, the NVLink/PCIe pair
  scores the plugin writes for the ``topology-aware`` policy;
- pod devices: ``UUID,NVIDIA,<memMiB>,<cores>:`` per device, ``;`` after each container,
  one slot per container, init containers first; decoding keeps every ``;``-separated slot,
  including the empty one after the last ``;`` (as ``strings.Split`` does);
- ``hami.io/node-handshake``: only the scheduler writes it now (``Requesting_<time>``);
  the v2.10 device plugin no longer answers ``Reported <time>``;
- ``hami.io/mutex.lock``: ``<RFC3339>,<namespace>,<pod>``, or the legacy ``<RFC3339>``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_PAIR_SCORE = "hami.io/node-nvidia-score"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
DEVICE_CORDON = "hami.io/device-cordon"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
ASSIGNED_NODE = "hami.io/vgpu-node"
ASSIGNED_TIME = "hami.io/vgpu-time"
BIND_TIME = "hami.io/bind-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_ALLOCATING = "allocating"
BIND_SUCCESS = "success"
BIND_FAILED = "failed"

DEVICE_TYPE = "NVIDIA"  # NvidiaGPUDevice: the device-type word in container device entries
MODE_HAMI_CORE = "hami-core"
MODE_MIG = "mig"
DEFAULT_SPLIT_COUNT = 10
DEFAULT_DEVCORE = 100

_DEVICE_SEP = ":"
_CONTAINER_SEP = ";"
_REQUESTING = "Requesting_"
_DATETIME = "%Y-%m-%d %H:%M:%S"  # Go time.DateTime
_LOCK_SEP = ","
# Go's time.RFC3339 as time.Parse accepts it (fractional seconds optional).
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$"
)


class AnnotationError(ValueError):
    """An annotation value is not in HAMi's format; the message quotes it."""


@dataclass(frozen=True)
class MigProfile:
    """``MigProfile``: a MIG profile a MIG-mode GPU may be cut into, with the placements
    (start, size in memory slices) NVML lists for it. ``instance_count`` stays on the node
    (the plugin's advertised count), off the wire, as upstream's ``json:"-"``."""

    name: str  # "1g.5gb", as the allowlist names it
    memory_mb: int
    core: int  # percent of the GPU's SMs, rounded up
    slice_count: int
    placements: tuple[tuple[int, int], ...]
    instance_count: int = 0


@dataclass(frozen=True)
class NodeDevice:
    """One GPU in ``hami.io/node-nvidia-register`` (HAMi ``DeviceInfo``)."""

    id: str
    index: int
    count: int  # how many containers may share it (split count)
    devmem: int  # MiB
    devcore: int  # percent of the SMs, 100 = the whole GPU
    type: str  # "NVIDIA A100-SXM4-40GB", "NVIDIA-Tesla T4"
    numa: int
    health: bool
    mode: str = MODE_HAMI_CORE
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True)
class ContainerDevice:
    """One device share given to a container (HAMi ``ContainerDevice``). ``mig`` is
    upstream's ``CustomInfo`` of a MIG share, (profile, start, size): Filter's reservation,
    not part of the device annotations (it travels in ``hami.io/vgpu-mig-allocations``)."""

    uuid: str
    type: str
    usedmem: int  # MiB
    usedcores: int  # percent
    mig: tuple[str, int, int] | None = None


@dataclass(frozen=True)
class MigAllocation:
    """``MigAllocation``: one MIG share's reservation, and its runtime identity once the
    device plugin created it (MIG UUID, GPU and compute instance IDs: all or none)."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    start: int
    size: int
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def runtime_ready(self) -> bool:
        return bool(self.mig_uuid) and self.gpu_instance_id is not None


def device_type(nvml_name: str) -> str:
    """The ``type`` HAMi registers for a GPU: its NVML name, prefixed ``NVIDIA-`` if it lacks it."""
    return nvml_name if nvml_name.startswith("NVIDIA") else f"NVIDIA-{nvml_name}"


def encode_node_devices(devices: Sequence[NodeDevice]) -> str:
    """``MarshalNodeDevices``: Go field order, ``omitempty`` drops zero values."""
    out = []
    for d in devices:
        fields = (
            ("id", d.id),
            ("index", d.index),
            ("count", d.count),
            ("devmem", d.devmem),
            ("devcore", d.devcore),
            ("type", d.type),
            ("numa", d.numa),
            ("mode", d.mode),
            ("migProfiles", [_mig_profile_json(p) for p in d.mig_profiles]),
            ("health", d.health),
        )
        out.append({k: v for k, v in fields if v})
    return json.dumps(out, separators=(",", ":"))


def _mig_profile_json(p: MigProfile) -> dict[str, Any]:
    return {
        "name": p.name,
        "memoryMB": p.memory_mb,
        "core": p.core,
        "sliceCount": p.slice_count,
        "placements": [{"start": a, "size": b} for a, b in p.placements] or None,
    }


def _mig_profile(raw: Any) -> MigProfile:
    if not isinstance(raw, dict):
        raise AnnotationError(f"{NODE_REGISTER} migProfiles entry is not an object: {raw!r}")
    try:
        return MigProfile(
            name=str(raw.get("name", "")),
            memory_mb=int(raw.get("memoryMB", 0)),
            core=int(raw.get("core", 0)),
            slice_count=int(raw.get("sliceCount", 0)),
            placements=tuple(
                (int(p.get("start", 0)), int(p.get("size", 0))) for p in raw.get("placements") or []
            ),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise AnnotationError(f"{NODE_REGISTER} migProfiles entry is malformed: {raw!r}") from exc


def decode_node_devices(value: str) -> list[NodeDevice]:
    """``UnMarshalNodeDevices``; absent keys are Go zero values."""
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as exc:
        raise AnnotationError(f"{NODE_REGISTER} is not JSON: {value[:80]!r}") from exc
    if not isinstance(raw, list):
        raise AnnotationError(f"{NODE_REGISTER} must be a JSON list, got {value[:80]!r}")
    return [_node_device(item) for item in raw]


def _node_device(item: Any) -> NodeDevice:
    if not isinstance(item, dict) or not isinstance(item.get("id", ""), str):
        raise AnnotationError(f"{NODE_REGISTER} entry must be an object with a string id: {item!r}")
    try:
        return NodeDevice(
            id=item.get("id", ""),
            index=int(item.get("index", 0)),
            count=int(item.get("count", 0)),
            devmem=int(item.get("devmem", 0)),
            devcore=int(item.get("devcore", 0)),
            type=str(item.get("type", "")),
            numa=int(item.get("numa", 0)),
            health=bool(item.get("health", False)),
            mode=str(item.get("mode", "")),
            mig_profiles=tuple(_mig_profile(p) for p in item.get("migProfiles") or []),
        )
    except (TypeError, ValueError) as exc:
        raise AnnotationError(f"{NODE_REGISTER} entry has a non-numeric field: {item!r}") from exc


def encode_pair_scores(scores: dict[str, dict[str, int]]) -> str:
    return json.dumps([{"uuid": u, "score": s} for u, s in scores.items()], separators=(",", ":"))


def decode_pair_scores(value: str) -> dict[str, dict[str, int]]:
    """``DecodePairScores``: uuid → {other uuid → score}."""
    try:
        raw = json.loads(value)
        return {
            str(e.get("uuid", "")): {str(k): int(v) for k, v in (e.get("score") or {}).items()}
            for e in raw
        }
    except (json.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
        raise AnnotationError(f"{NODE_PAIR_SCORE} is not a list of pair scores") from exc


def encode_container_devices(devices: Sequence[ContainerDevice]) -> str:
    return "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}{_DEVICE_SEP}" for d in devices)


def decode_container_devices(value: str) -> list[ContainerDevice]:
    """``DecodeContainerDevices``: entries without a ',' are skipped, as upstream does."""
    devices = []
    for entry in value.split(_DEVICE_SEP):
        if "," not in entry:
            continue
        fields = entry.split(",")
        if len(fields) < 4:
            raise AnnotationError(f"pod annotation format error, missing fields: {entry!r}")
        try:
            devices.append(ContainerDevice(fields[0], fields[1], int(fields[2]), int(fields[3])))
        except ValueError as exc:
            raise AnnotationError(f"container device {entry!r} has a non-integer field") from exc
    return devices


def encode_pod_devices(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    """``EncodePodSingleDevice``: every container's entry ends in ';'."""
    return "".join(encode_container_devices(c) + _CONTAINER_SEP for c in containers)


def decode_pod_devices(value: str) -> list[list[ContainerDevice]]:
    """``DecodePodDevices`` for one device type: one list per ';'-separated slot, empty
    slots kept (so "a:;" gives two slots, the second empty)."""
    return [decode_container_devices(p) for p in value.split(_CONTAINER_SEP)]


def mig_allocations(containers: Sequence[Sequence[ContainerDevice]]) -> list[MigAllocation]:
    """``EncodeMigAllocations``' entries: every MIG share's reservation, by container slot
    (init containers first) and position in it."""
    return [
        MigAllocation(ci, di, d.uuid, d.mig[0], d.mig[1], d.mig[2])
        for ci, ctr in enumerate(containers)
        for di, d in enumerate(ctr)
        if d.mig is not None
    ]


def dump_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    """The annotation with each allocation's runtime identity, where it has one."""
    out = []
    for a in allocations:
        item: dict[str, Any] = {
            "containerIndex": a.container_index,
            "deviceIndex": a.device_index,
            "gpuUUID": a.gpu_uuid,
            "profile": a.profile,
            "placement": {"start": a.start, "size": a.size},
        }
        if a.runtime_ready:
            item.update(
                migUUID=a.mig_uuid,
                gpuInstanceID=a.gpu_instance_id,
                computeInstanceID=a.compute_instance_id,
            )
        out.append(item)
    return json.dumps(out, separators=(",", ":"))


def decode_mig_allocations(value: str) -> list[MigAllocation]:
    """``DecodeMigAllocations``: complete entries, runtime identity all or none, one per
    (container, device)."""
    if not value:
        return []
    try:
        raw = json.loads(value)
        out = [
            MigAllocation(
                container_index=int(e["containerIndex"]),
                device_index=int(e["deviceIndex"]),
                gpu_uuid=str(e.get("gpuUUID", "")),
                profile=str(e.get("profile", "")),
                start=int((e.get("placement") or {}).get("start", 0)),
                size=int((e.get("placement") or {}).get("size", 0)),
                mig_uuid=str(e.get("migUUID") or ""),
                gpu_instance_id=e.get("gpuInstanceID"),
                compute_instance_id=e.get("computeInstanceID"),
            )
            for e in raw
        ]
    except (json.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise AnnotationError(f"{MIG_ALLOCATIONS} is not a list of allocations") from exc
    seen = set()
    for i, a in enumerate(out):
        if a.container_index < 0 or a.device_index < 0 or not a.gpu_uuid or not a.profile:
            raise AnnotationError(f"MIG allocation {i} is incomplete")
        if a.size == 0:
            raise AnnotationError(f"MIG allocation {i} is incomplete")
        given = (bool(a.mig_uuid), a.gpu_instance_id is not None, a.compute_instance_id is not None)
        if any(given) and not all(given):
            raise AnnotationError(f"MIG allocation {i} has partial runtime identity")
        key = (a.container_index, a.device_index)
        if key in seen:
            raise AnnotationError(
                f"duplicate MIG allocation for container {key[0]} device {key[1]}"
            )
        seen.add(key)
    return out


def handshake_requesting(now_local: dt.datetime) -> str:
    """What ``CheckHealth`` writes: ``Requesting_`` + local ``time.DateTime``."""
    return f"{_REQUESTING}{now_local.strftime(_DATETIME)}"


def requesting_since(value: str) -> tuple[bool, dt.datetime | None]:
    """(the handshake contains "Requesting", its local time when it parses)."""
    if "Requesting" not in value:
        return False, None
    _, sep, stamp = value.partition("_")
    if not sep:
        return True, None
    try:
        return True, dt.datetime.strptime(stamp, _DATETIME)
    except ValueError:
        return True, None


def node_lock_value(now: dt.datetime, namespace: str, name: str) -> str:
    """``GenerateNodeLockKeyByPod``: ``<RFC3339>,<namespace>,<pod>`` (UTC here)."""
    return _LOCK_SEP.join((rfc3339(now), namespace, name))


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> dt.datetime:
    """Go's ``time.Parse(time.RFC3339, value)``; AnnotationError if it is not one."""
    m = _RFC3339.match(value)
    if not m:
        raise AnnotationError(f"{value!r} is not an RFC3339 time")
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise AnnotationError(f"{value!r} is not an RFC3339 time") from exc


def parse_node_lock(value: str) -> tuple[dt.datetime, str, str]:
    """``ParseNodeLock``: (lock time, namespace, pod); namespace and pod are "" for the
    legacy timestamp-only format. AnnotationError for anything else."""
    if _LOCK_SEP not in value:
        return parse_rfc3339(value), "", ""
    parts = value.split(_LOCK_SEP)
    if len(parts) != 3:
        raise AnnotationError(
            f"malformed lock annotation: expected 3 parts, got {len(parts)} from {value}"
        )
    return parse_rfc3339(parts[0]), parts[1], parts[2]
