"""The device manager's decisions, as pure functions over pods (API-server JSON dicts).

Mirrors kubelet ``pkg/kubelet/cm/devicemanager``: ``manager.go`` (``GetCapacity``: capacity =
all devices, allocatable = healthy ones; ``devicesToAllocate``: free healthy devices not
held by other active pods, init-container devices reusable by the pod's app containers,
GetPreferredAllocation when the plugin offers it) and ``pod_devices.go`` (which pod and
container holds which device IDs - here rebuilt from the pods' allocation annotations).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ANNOTATION_PREFIX = "gpulab.io/allocate-"
TERMINAL_PHASES = ("Succeeded", "Failed")
ADMISSION_ERROR_REASON = "UnexpectedAdmissionError"


class AdmissionError(RuntimeError):
    """A container cannot get its devices; the pod is rejected with this message."""


@dataclass(frozen=True)
class ContainerNeed:
    name: str
    init: bool
    resources: dict[str, int]  # registered resource -> device count


@dataclass
class ContainerRecord:
    """What a container got: the ContainerAllocateResponse(s), merged, as recorded on the pod."""

    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> device IDs
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    device_specs: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(
            {
                "devices": self.devices,
                "envs": self.envs,
                "mounts": self.mounts,
                "deviceSpecs": self.device_specs,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, value: str) -> ContainerRecord:
        raw = json.loads(value)
        return cls(
            devices={k: list(v) for k, v in (raw.get("devices") or {}).items()},
            envs=dict(raw.get("envs") or {}),
            mounts=list(raw.get("mounts") or []),
            device_specs=list(raw.get("deviceSpecs") or []),
        )


def annotation_key(container: str) -> str:
    return f"{ANNOTATION_PREFIX}{container}"


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata", {})
    return meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return pod.get("status", {}).get("phase") in TERMINAL_PHASES


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0  # extended resources are whole numbers; anything else is not ours


def container_needs(pod: Mapping[str, Any], registered: Iterable[str]) -> list[ContainerNeed]:
    """Containers (init first, as kubelet admits them) asking for registered resources."""
    known = set(registered)
    spec = pod.get("spec", {})
    out = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(key) or []:
            res = c.get("resources") or {}
            # Extended resources: limits are authoritative (requests must equal them).
            asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            wanted = {r: _count(v) for r, v in asked.items() if r in known and _count(v) > 0}
            if wanted:
                out.append(ContainerNeed(c["name"], init, wanted))
    return out


def recorded(pod: Mapping[str, Any]) -> dict[str, ContainerRecord]:
    """Container name -> what it was given, from the pod's allocation annotations."""
    annos = pod.get("metadata", {}).get("annotations") or {}
    out = {}
    for key, value in annos.items():
        if key.startswith(ANNOTATION_PREFIX):
            try:
                out[key.removeprefix(ANNOTATION_PREFIX)] = ContainerRecord.from_json(value)
            except (ValueError, AttributeError, TypeError):
                continue  # not ours to interpret; the devices stay unaccounted
    return out


PodRecords = Mapping[str, Mapping[str, ContainerRecord]]
"""pod key -> container name -> what it got."""


def records_of(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, ContainerRecord]]:
    """What the active pods hold, rebuilt from their annotations (an agent restart)."""
    return {pod_key(p): recorded(p) for p in pods if not is_terminal(p) and recorded(p)}


def in_use(records: PodRecords, resource: str, exclude: str | None = None) -> set[str]:
    """Device IDs of ``resource`` held by the pods in ``records`` (all but ``exclude``)."""
    return {
        device
        for key, containers in records.items()
        if key != exclude
        for record in containers.values()
        for device in record.devices.get(resource, ())
    }


def free_devices(healthy: Iterable[str], held: Iterable[str]) -> list[str]:
    return sorted(set(healthy) - set(held))


def check_preferred(preferred: Sequence[str], available: Sequence[str], n: int) -> list[str]:
    """Kubelet trusts a preferred allocation only if it is n devices from ``available``."""
    chosen = list(dict.fromkeys(preferred))
    if len(chosen) != n or not set(chosen) <= set(available):
        raise AdmissionError(
            f"plugin preferred {chosen} which is not {n} device(s) from the available set"
        )
    return chosen


def devices_to_allocate(
    resource: str,
    n: int,
    healthy: Iterable[str],
    held_by_others: Iterable[str],
    reusable: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """(available, must_include) for one container, or AdmissionError if too few are free.

    ``reusable``: the pod's init-container devices, which its app containers take first.
    """
    available = free_devices(healthy, held_by_others)
    must = [d for d in reusable if d in available][:n]
    if len(available) < n:
        raise AdmissionError(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {n}, Available: {len(available)}"
        )
    return available, must


def capacity(health: Mapping[str, bool]) -> tuple[int, int]:
    """(capacity, allocatable) of one resource: all devices, healthy devices."""
    return len(health), sum(1 for ok in health.values() if ok)
