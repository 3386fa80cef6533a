"""The device manager's decisions, as pure functions over pods (API-server JSON dicts).

Mirrors kubelet v1.36.3 ``pkg/kubelet/cm/devicemanager``: ``manager.go`` (``GetCapacity``:
capacity = all devices, allocatable = healthy ones, a stopped plugin's resource kept at
0 allocatable for ``endpointStopGracePeriod`` and then dropped; ``devicesToAllocate``:
reusable init-container devices first, then GetPreferredAllocation's choice among the free
healthy devices, then any free device), ``plugin/v1beta1/server.go`` (which registrations
are refused) with ``pkg/apis/core/v1/helper.IsExtendedResourceName``, and
``pod_devices.go`` (which pod and container holds which device IDs).

Lab convenience: kubelet keeps ``pod_devices`` in its checkpoint file
(``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint``); the node agent records
each container's allocation in the pod annotation ``gpulab.io/allocate-<container>``
instead, so a learner can read it with kubectl, and rebuilds its state from those.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ANNOTATION_PREFIX = "gpulab.io/allocate-"
TERMINAL_PHASES = ("Succeeded", "Failed")
ADMISSION_ERROR_REASON = "UnexpectedAdmissionError"
SUPPORTED_VERSIONS = ("v1beta1",)
ENDPOINT_STOP_GRACE_PERIOD = 300.0  # kubelet's endpointStopGracePeriod: 5 minutes

# matched whole (fullmatch): a Python "$" also matches before a trailing newline, Go's does not
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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


def is_extended_resource_name(name: str) -> bool:
    """``v1helper.IsExtendedResourceName``: ``<domain>/<name>`` outside ``kubernetes.io``,
    a valid qualified name once prefixed with ``requests.``."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    parts = f"requests.{name}".split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    return (
        len(prefix) <= 253
        and bool(_DNS_SUBDOMAIN.fullmatch(prefix))
        and 0 < len(short) <= 63
        and bool(_LABEL_NAME.fullmatch(short))
    )


def registration_error(version: str, resource: str) -> str | None:
    """Why kubelet's Registration server refuses a request (its messages), or None."""
    if version not in SUPPORTED_VERSIONS:
        versions = " ".join(f'"{v}"' for v in SUPPORTED_VERSIONS)
        return (
            f'requested API version "{version}" is not supported by kubelet. Supported '
            f"version is [{versions}]"
        )
    if not is_extended_resource_name(resource):
        return f'the ResourceName "{resource}" is invalid'
    return None


@dataclass(frozen=True)
class ResourceState:
    """What the device manager knows of one resource (``healthyDevices``/
    ``unhealthyDevices`` and its endpoint's stop time)."""

    healthy: frozenset[str] = frozenset()
    unhealthy: frozenset[str] = frozenset()
    stopped_at: float | None = None  # monotonic seconds; None while the plugin is connected


def mark_unhealthy(state: ResourceState, now: float) -> ResourceState:
    """``PluginDisconnected``: every device Unhealthy, the endpoint's stop time set."""
    return ResourceState(frozenset(), state.healthy | state.unhealthy, now)


def get_capacity(
    resources: Mapping[str, ResourceState], now: float, grace: float = ENDPOINT_STOP_GRACE_PERIOD
) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """``GetCapacity``: (capacity, allocatable, deleted resources).

    Capacity counts every device, allocatable the healthy ones; a resource whose plugin
    stopped more than ``grace`` seconds ago is deleted, and kubelet's node status then
    reports its capacity as 0 (kept, so it stays known as a device-plugin resource).
    """
    capacity: dict[str, int] = {}
    allocatable: dict[str, int] = {}
    deleted = []
    for name, state in sorted(resources.items()):
        if state.stopped_at is not None and now - state.stopped_at > grace:
            deleted.append(name)
            continue
        capacity[name] = len(state.healthy) + len(state.unhealthy)
        allocatable[name] = len(state.healthy)
    return capacity, allocatable, deleted


def next_expiry(
    resources: Mapping[str, ResourceState], now: float, grace: float = ENDPOINT_STOP_GRACE_PERIOD
) -> float | None:
    """Seconds until the next stopped resource's grace period ends (None: none pending)."""
    waits = [s.stopped_at + grace - now for s in resources.values() if s.stopped_at is not None]
    return max(min(waits), 0.0) + 0.01 if waits else None


def plan_allocation(
    resource: str,
    required: int,
    state: ResourceState | None,
    in_use: Iterable[str],
    reusable: Sequence[str] = (),
) -> tuple[list[str], list[str], int]:
    """The first half of ``devicesToAllocate``: (allocated, available, still needed).

    ``allocated``: the reusable (init-container) devices taken first; ``available``: the
    free healthy devices the plugin may prefer among. Raises AdmissionError with kubelet's
    messages when the resource cannot serve the request.
    """
    if state is None:
        raise AdmissionError(f"cannot allocate unregistered device {resource}")
    if not state.healthy:
        raise AdmissionError(
            f"no healthy devices present; cannot allocate unhealthy devices {resource}"
        )
    allocated = [d for d in dict.fromkeys(reusable)][:required]
    needed = required - len(allocated)
    if needed == 0:
        return allocated, [], 0
    available = sorted(state.healthy - set(in_use) - set(allocated))
    if len(available) < needed:
        raise AdmissionError(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {needed}, Available: {len(available)}"
        )
    return allocated, available, needed


def finish_allocation(
    allocated: Sequence[str], available: Sequence[str], needed: int, preferred: Sequence[str]
) -> list[str]:
    """The second half: the plugin's preferred devices that are still available, then any
    available device (kubelet takes what is left from its "no affinity" set). A preferred
    allocation naming devices that are not available is thus not an error."""
    free = set(available)
    picks = [d for d in dict.fromkeys(preferred) if d in free][:needed]
    picks += [d for d in available if d not in picks][: needed - len(picks)]
    return [*allocated, *picks]


def rpc_error(code: str, details: str) -> str:
    """A gRPC error as Go prints it (``rpc error: code = Unknown desc = ...``), which is
    what kubelet's admission message quotes."""
    words = code.lower().split("_")
    return f"rpc error: code = {''.join(w.capitalize() for w in words)} desc = {details}"
