"""HAMi's node and pod annotations: keys, and encode/decode of their values.

SHARED module: the device plugin (``gpulab.deviceplugin``, which writes the node
registration and consumes the allocation) and the HAMi scheduler extender
(``gpulab.hami``, which reads the registration and writes the allocation) both use it, so
the two sides cannot drift apart. Pure: strings and datetimes in, dataclasses out.

Formats, as HAMi writes them:
- ``pkg/device/devices.go`` ``MarshalNodeDevices``: the node registration is a JSON list of
  DeviceInfo ``{id, index, count, devmem, devcore, type, numa, mode, health}`` (HAMi's
  ``omitempty`` drops zero values; we write every field, which HAMi decodes identically,
  and read either);
- ``EncodeContainerDevices`` / ``EncodePodSingleDevice``: ``UUID,NVIDIA,<memMiB>,<cores>:``
  per device, ``;`` after each container (init containers first), so the string ends in ``;``;
- the handshake (``pkg/device/devices.go`` ``CheckHealth`` and, before HAMi 2.7, the
  device plugin's ``RegisterInAnnotation``): the scheduler writes
  ``Requesting_<2006-01-02 15:04:05>``, the device plugin answers ``Reported <Go time>``;
- ``pkg/util/nodelock``: ``hami.io/mutex.lock`` = ``<RFC3339>,<namespace>,<pod>``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

NODE_REGISTER = "hami.io/node-nvidia-register"
NODE_HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
ASSIGNED_NODE = "hami.io/vgpu-node"
BIND_TIME = "hami.io/bind-time"
BIND_PHASE = "hami.io/bind-phase"
BIND_ALLOCATING = "allocating"
BIND_SUCCESS = "success"
BIND_FAILED = "failed"

DEVICE_TYPE = "NVIDIA"  # the device-type word in container device entries
MODE_HAMI_CORE = "hami-core"
DEFAULT_SPLIT_COUNT = 10
DEFAULT_DEVCORE = 100

_DEVICE_SEP = ":"
_CONTAINER_SEP = ";"
_REQUESTING = "Requesting_"
_REPORTED = "Reported "
_REQUEST_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # Go time.DateTime
_LOCK_SEP = ","


class AnnotationError(ValueError):
    """An annotation value is not in HAMi's format; the message quotes it."""


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


@dataclass(frozen=True)
class ContainerDevice:
    """One device share given to a container (HAMi ``ContainerDevice``)."""

    uuid: str
    type: str
    usedmem: int  # MiB
    usedcores: int  # percent


def device_type(nvml_name: str) -> str:
    """The ``type`` HAMi registers for a GPU: its NVML name, prefixed ``NVIDIA-`` if it lacks it."""
    return nvml_name if nvml_name.startswith("NVIDIA") else f"NVIDIA-{nvml_name}"


def encode_node_devices(devices: Sequence[NodeDevice]) -> str:
    return json.dumps([asdict(d) for d in devices], separators=(",", ":"))


def decode_node_devices(value: str) -> list[NodeDevice]:
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as exc:
        raise AnnotationError(f"{NODE_REGISTER} is not JSON: {value[:80]!r}") from exc
    if not isinstance(raw, list):
        raise AnnotationError(f"{NODE_REGISTER} must be a JSON list, got {value[:80]!r}")
    return [_node_device(item) for item in raw]


def _node_device(item: Any) -> NodeDevice:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
        raise AnnotationError(f"{NODE_REGISTER} entry needs a string 'id': {item!r}")
    try:
        # Absent keys are Go zero values (HAMi writes with omitempty).
        return NodeDevice(
            id=item["id"],
            index=int(item.get("index", 0)),
            count=int(item.get("count", 0)),
            devmem=int(item.get("devmem", 0)),
            devcore=int(item.get("devcore", 0)),
            type=str(item.get("type", "")),
            numa=int(item.get("numa", 0)),
            health=bool(item.get("health", False)),
            mode=str(item.get("mode", "")),
        )
    except (TypeError, ValueError) as exc:
        raise AnnotationError(f"{NODE_REGISTER} entry has a non-numeric field: {item!r}") from exc


def encode_container_devices(devices: Sequence[ContainerDevice]) -> str:
    return "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}{_DEVICE_SEP}" for d in devices)


def decode_container_devices(value: str) -> list[ContainerDevice]:
    devices = []
    for entry in value.split(_DEVICE_SEP):
        if "," not in entry:
            continue  # the empty tail after the last ':'
        fields = entry.split(",")
        if len(fields) < 4:
            raise AnnotationError(f"container device {entry!r} needs UUID,type,mem,cores")
        try:
            devices.append(ContainerDevice(fields[0], fields[1], int(fields[2]), int(fields[3])))
        except ValueError as exc:
            raise AnnotationError(
                f"container device {entry!r} has a non-integer mem/cores"
            ) from exc
    return devices


def encode_pod_devices(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    return "".join(encode_container_devices(c) + _CONTAINER_SEP for c in containers)


def decode_pod_devices(value: str) -> list[list[ContainerDevice]]:
    """One list per container, in annotation order (init containers first)."""
    parts = value.split(_CONTAINER_SEP)
    if parts and parts[-1] == "":
        parts.pop()  # every container's entry ends in ';'
    return [decode_container_devices(p) for p in parts]


def go_time_string(when: dt.datetime) -> str:
    """``when`` as Go's ``time.Time.String()`` writes it (UTC, trailing zeros trimmed)."""
    utc = when.astimezone(dt.UTC)
    frac = f"{utc.microsecond * 1000:09d}".rstrip("0")
    return f"{utc:%Y-%m-%d %H:%M:%S}{'.' + frac if frac else ''} +0000 UTC"


def handshake_reported(now: dt.datetime) -> str:
    return f"{_REPORTED}{go_time_string(now)}"


def handshake_requesting(now: dt.datetime) -> str:
    return f"{_REQUESTING}{now.strftime(_REQUEST_TIME_FORMAT)}"


def parse_handshake(value: str) -> tuple[str, dt.datetime | None]:
    """("Requesting" | "Reported" | "Deleted" | "", time if it parses)."""
    if value.startswith(_REQUESTING):
        stamp = value.removeprefix(_REQUESTING)
        try:
            return "Requesting", dt.datetime.strptime(stamp, _REQUEST_TIME_FORMAT)
        except ValueError:
            return "Requesting", None
    if value.startswith(_REPORTED):
        stamp = value.removeprefix(_REPORTED)[:19]
        try:
            return "Reported", dt.datetime.strptime(stamp, _REQUEST_TIME_FORMAT).replace(
                tzinfo=dt.UTC
            )
        except ValueError:
            return "Reported", None
    if value.startswith("Deleted"):
        return "Deleted", None
    return "", None


def node_lock_value(now: dt.datetime, namespace: str, name: str) -> str:
    return _LOCK_SEP.join((now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), namespace, name))


def parse_node_lock(value: str) -> tuple[dt.datetime, str, str]:
    """(lock time, pod namespace, pod name) of a ``hami.io/mutex.lock`` value."""
    parts = value.split(_LOCK_SEP)
    if len(parts) != 3:
        raise AnnotationError(f"{NODE_LOCK} {value!r} is not <RFC3339>,<namespace>,<pod>")
    try:
        when = dt.datetime.fromisoformat(parts[0].replace("Z", "+00:00"))
    except ValueError as exc:
        raise AnnotationError(f"{NODE_LOCK} {value!r} has no RFC3339 time") from exc
    return when, parts[1], parts[2]
