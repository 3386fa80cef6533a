"""What a container asks of NVIDIA vGPUs, and which cards it may use.

Mirrors HAMi ``pkg/device/nvidia/device.go`` (``GenerateResourceRequests``,
``checkGPUtype``, ``CheckUUID``) and the resource/annotation names of
``pkg/util/types.go``. Pure: pod and container objects are the JSON dicts the API
server serves (camelCase keys).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

RESOURCE_COUNT = "nvidia.com/gpu"
RESOURCE_MEM = "nvidia.com/gpumem"
RESOURCE_MEM_PERCENTAGE = "nvidia.com/gpumem-percentage"
RESOURCE_CORES = "nvidia.com/gpucores"
MANAGED_RESOURCES = (RESOURCE_COUNT, RESOURCE_MEM, RESOURCE_MEM_PERCENTAGE, RESOURCE_CORES)

DEVICE_TYPE = "NVIDIA"

# Pod annotations that select cards (pkg/device/nvidia/device.go).
GPU_IN_USE = "nvidia.com/use-gputype"
GPU_NO_USE = "nvidia.com/nouse-gputype"
GPU_USE_UUID = "nvidia.com/use-gpuuuid"
GPU_NO_USE_UUID = "nvidia.com/nouse-gpuuuid"

# HAMi's "percentage not given" sentinel: 101 means unset, 100 means the whole card.
MEM_PERCENTAGE_UNSET = 101
CORE_LIMIT = 100

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


class RequestError(ValueError):
    """A pod's GPU request cannot be understood (bad quantity, wrong JSON type)."""


@dataclass(frozen=True)
class ContainerRequest:
    """``util.ContainerDeviceRequest``: what one container asks of NVIDIA cards."""

    nums: int
    memreq: int = 0  # MiB per card; 0 = use mem_percentage
    mem_percentage: int = MEM_PERCENTAGE_UNSET
    coresreq: int = 0  # % of SMs per card

    def memory_on(self, totalmem: int) -> int:
        """MiB this request takes on a card of ``totalmem`` MiB (HAMi computeMemreq)."""
        if self.memreq > 0:
            return self.memreq
        if self.mem_percentage != MEM_PERCENTAGE_UNSET:
            return totalmem * self.mem_percentage // 100
        return 0


@dataclass(frozen=True)
class Defaults:
    """Flag defaults HAMi applies to requests (--default-mem, --default-cores)."""

    mem: int = 0
    cores: int = 0


def parse_quantity(value: Any) -> int:
    """A Kubernetes quantity as an integer (``Quantity.AsInt64``); RequestError if not one."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RequestError(f"quantity must be a string, got {type(value).__name__}")
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise RequestError(f"invalid quantity {str(value)[:40]!r}")
    try:
        number = Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation as exc:
        raise RequestError(f"invalid quantity {str(value)[:40]!r}") from exc
    if number != number.to_integral_value() or abs(number) > 2**62:
        raise RequestError(f"quantity {str(value)[:40]!r} is not a whole number")
    return int(number)


def _resources(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        raise RequestError("container resources must be an object")
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        raise RequestError("resources.limits and resources.requests must be objects")
    return limits, requests


def resource_value(container: Mapping[str, Any], name: str) -> int | None:
    """Limits first, then requests, as HAMi does."""
    limits, requests = _resources(container)
    if name in limits:
        return parse_quantity(limits[name])
    if name in requests:
        return parse_quantity(requests[name])
    return None


def container_request(container: Mapping[str, Any], defaults: Defaults) -> ContainerRequest:
    """``GenerateResourceRequests``: nums=0 when the container asks for no NVIDIA vGPU."""
    nums = resource_value(container, RESOURCE_COUNT)
    if not nums or nums <= 0:
        return ContainerRequest(nums=0)
    memreq = resource_value(container, RESOURCE_MEM) or 0
    percentage = resource_value(container, RESOURCE_MEM_PERCENTAGE)
    mem_percentage = MEM_PERCENTAGE_UNSET if percentage is None else percentage
    if mem_percentage == MEM_PERCENTAGE_UNSET and memreq == 0:
        # Neither given: the default memory, else the whole card.
        if defaults.mem:
            memreq = defaults.mem
        else:
            mem_percentage = 100
    cores = resource_value(container, RESOURCE_CORES)
    coresreq = defaults.cores if cores is None else cores
    if memreq < 0 or coresreq < 0 or not 0 <= mem_percentage <= MEM_PERCENTAGE_UNSET:
        raise RequestError("gpumem, gpumem-percentage and gpucores must not be negative")
    # HAMi clamps (normalizeCoresreq) rather than rejecting.
    return ContainerRequest(
        nums=nums,
        memreq=memreq,
        mem_percentage=mem_percentage,
        coresreq=min(coresreq, CORE_LIMIT),
    )


def containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise RequestError("pod.spec must be an object")
    ctrs = spec.get("containers") or []
    if not isinstance(ctrs, list) or not all(isinstance(c, Mapping) for c in ctrs):
        raise RequestError("pod.spec.containers must be a list of objects")
    return ctrs


def pod_requests(pod: Mapping[str, Any], defaults: Defaults) -> list[ContainerRequest]:
    """One request per app container, in order (init containers are not shared vGPUs here)."""
    return [container_request(c, defaults) for c in containers(pod)]


def annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise RequestError("pod.metadata must be an object")
    annos = meta.get("annotations") or {}
    if not isinstance(annos, Mapping) or not all(isinstance(v, str) for v in annos.values()):
        raise RequestError("pod.metadata.annotations must map strings to strings")
    return dict(annos)


def type_allowed(annos: Mapping[str, str], card_type: str) -> bool:
    """``checkGPUtype``: use-gputype / nouse-gputype are comma lists matched as substrings."""
    card = card_type.upper()
    if GPU_IN_USE in annos:
        wanted = [t.strip().upper() for t in annos[GPU_IN_USE].split(",") if t.strip()]
        if not any(t in card for t in wanted):
            return False
    if GPU_NO_USE in annos:
        unwanted = [t.strip().upper() for t in annos[GPU_NO_USE].split(",") if t.strip()]
        if any(t in card for t in unwanted):
            return False
    return True


def uuid_allowed(annos: Mapping[str, str], uuid: str) -> bool:
    """``CheckUUID``: use-gpuuuid wins over nouse-gpuuuid, both comma lists of exact UUIDs."""
    if GPU_USE_UUID in annos:
        return uuid in [u.strip() for u in annos[GPU_USE_UUID].split(",")]
    if GPU_NO_USE_UUID in annos:
        return uuid not in [u.strip() for u in annos[GPU_NO_USE_UUID].split(",")]
    return True
