"""What a container asks of NVIDIA vGPUs, and which cards a pod lets it use.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device/nvidia/device.go``
(``GenerateResourceRequests``, ``checkGPUtype``, ``checkType``, ``assertNuma``) and
``pkg/device/devices.go`` (``Resourcereqs``, ``CheckUUID``, ``CheckType``), plus the
pod-annotation names of ``pkg/util/types.go``. Quantities are read with
``kubernetes.utils.parse_quantity`` and must be whole numbers, as ``Quantity.AsInt64``.
Pure: pods and containers are the JSON dicts the API server serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from gpulab.hami.annotations import DEVICE_TYPE
from gpulab.hami.config import NvidiaConfig

# Pod annotations that select cards.
GPU_IN_USE = "nvidia.com/use-gputype"
GPU_NO_USE = "nvidia.com/nouse-gputype"
GPU_USE_UUID = "nvidia.com/use-gpuuuid"
GPU_NO_USE_UUID = "nvidia.com/nouse-gpuuuid"
NUMA_BIND = "nvidia.com/numa-bind"
ALLOCATE_MODE = "nvidia.com/vgpu-mode"

# HAMi's "percentage not given" sentinel: 101 means unset, 100 means the whole card.
MEM_PERCENTAGE_UNSET = 101
INT32_MAX = 2**31 - 1
_INT64 = 2**63


class RequestError(ValueError):
    """A pod is not shaped like a pod (wrong JSON types, a value that is no quantity)."""


@dataclass(frozen=True)
class ContainerRequest:
    """``ContainerDeviceRequest`` for NVIDIA (nums=0: the container asks for none)."""

    nums: int
    memreq: int = 0  # MiB per card; 0 = use mem_percentage
    mem_percentage: int = MEM_PERCENTAGE_UNSET
    coresreq: int = 0  # % of SMs per card
    type: str = DEVICE_TYPE

    def memory_on(self, totalmem: int) -> int:
        """MiB this request takes on a card of ``totalmem`` MiB, as ``Fit`` computes it."""
        if self.memreq > 0:
            return self.memreq
        if self.mem_percentage != MEM_PERCENTAGE_UNSET:
            return totalmem * self.mem_percentage // 100
        return 0


NO_REQUEST = ContainerRequest(nums=0)


def as_int64(value: Any) -> int | None:
    """``Quantity.AsInt64``: the integer value, None when it is not a whole int64.

    RequestError when the value is not a quantity at all (Go fails to decode the pod).
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RequestError(f"quantity must be a string, got {type(value).__name__}")
    try:
        number: Decimal = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise RequestError(f"invalid quantity {str(value)[:40]!r}") from exc
    if not number.is_finite() or number != number.to_integral_value():
        return None
    if not -_INT64 <= number < _INT64:
        return None
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


def quantity(container: Mapping[str, Any], name: str) -> tuple[bool, int | None]:
    """(present, AsInt64 value) of resource ``name``: limits first, then requests."""
    limits, requests = _resources(container)
    if name in limits:
        return True, as_int64(limits[name])
    if name in requests:
        return True, as_int64(requests[name])
    return False, None


def container_request(container: Mapping[str, Any], cfg: NvidiaConfig) -> ContainerRequest:
    """``GenerateResourceRequests``: NO_REQUEST when the container asks for no NVIDIA vGPU
    (or asks for memory that is not a plain int32, which upstream refuses outright)."""
    present, nums = quantity(container, cfg.resource_count_name)
    if not present or nums is None:
        return NO_REQUEST
    memnum = 0
    present, mem = quantity(container, cfg.resource_memory_name)
    if present:
        factor = max(cfg.memory_factor, 1)
        if mem is None or mem < 0 or mem > INT32_MAX // factor:
            return NO_REQUEST
        memnum = mem * factor
    mempnum = MEM_PERCENTAGE_UNSET
    present, pct = quantity(container, cfg.resource_memory_percentage_name)
    if present and pct is not None:
        pct = min(pct, 100)
        mempnum = pct if pct > 0 else MEM_PERCENTAGE_UNSET
    if mempnum == MEM_PERCENTAGE_UNSET and memnum == 0:
        if cfg.default_memory:
            memnum = cfg.default_memory
        else:
            mempnum = 100
    corenum = cfg.default_cores
    present, cores = quantity(container, cfg.resource_core_name)
    if present and cores is not None:
        corenum = cores
    return ContainerRequest(nums=nums, memreq=memnum, mem_percentage=mempnum, coresreq=corenum)


def container_lists(
    pod: Mapping[str, Any],
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(initContainers, containers) of a pod; RequestError when they are not lists."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise RequestError("pod.spec must be an object")
    out = []
    for key in ("initContainers", "containers"):
        items = spec.get(key) or []
        if not isinstance(items, list) or not all(isinstance(c, Mapping) for c in items):
            raise RequestError(f"pod.spec.{key} must be a list of objects")
        out.append(items)
    return out[0], out[1]


def pod_requests(pod: Mapping[str, Any], cfg: NvidiaConfig) -> tuple[ContainerRequest, ...]:
    """``Resourcereqs``: one request per container, init containers first."""
    init, app = container_lists(pod)
    return tuple(container_request(c, cfg) for c in (*init, *app))


def wants_devices(reqs: Sequence[ContainerRequest]) -> bool:
    return any(r.nums > 0 for r in reqs)


def annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise RequestError("pod.metadata must be an object")
    annos = meta.get("annotations") or {}
    if not isinstance(annos, Mapping) or not all(isinstance(v, str) for v in annos.values()):
        raise RequestError("pod.metadata.annotations must map strings to strings")
    return dict(annos)


def _listed(value: str | None) -> list[str] | None:
    """A comma list, or None when absent or blank ("an empty value means no constraint")."""
    if value is None or not value.strip():
        return None
    return [item.strip() for item in value.split(",")]


@dataclass(frozen=True)
class CardFilter:
    """The pod's card selection annotations, parsed once per request."""

    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] | None = None
    use_uuids: frozenset[str] | None = None
    nouse_uuids: frozenset[str] | None = None
    mode: str | None = None  # nvidia.com/vgpu-mode
    numa_bind: bool = False

    @classmethod
    def of(cls, annos: Mapping[str, str]) -> CardFilter:
        use_t, nouse_t = _listed(annos.get(GPU_IN_USE)), _listed(annos.get(GPU_NO_USE))
        use_u, nouse_u = _listed(annos.get(GPU_USE_UUID)), _listed(annos.get(GPU_NO_USE_UUID))
        return cls(
            use_types=tuple(t.upper() for t in use_t if t) if use_t is not None else None,
            nouse_types=tuple(t.upper() for t in nouse_t if t) if nouse_t is not None else None,
            use_uuids=frozenset(use_u) if use_u is not None else None,
            nouse_uuids=frozenset(nouse_u) if nouse_u is not None else None,
            mode=annos.get(ALLOCATE_MODE),
            numa_bind=annos.get(NUMA_BIND, "").strip().lower() in ("1", "t", "true"),
        )

    def type_ok(self, card_type: str, card_mode: str) -> bool:
        """``checkType``: use-/nouse-gputype as case-insensitive substrings, both applied;
        ``nvidia.com/vgpu-mode`` must contain the card's mode."""
        upper = card_type.upper()
        if self.use_types is not None and not any(t in upper for t in self.use_types):
            return False
        if self.nouse_types is not None and any(t in upper for t in self.nouse_types):
            return False
        return self.mode is None or card_mode in self.mode

    def uuid_ok(self, uuid: str) -> bool:
        """``CheckUUID``: use-gpuuuid must list it and nouse-gpuuuid must not; both apply."""
        if self.use_uuids is not None and uuid not in self.use_uuids:
            return False
        return self.nouse_uuids is None or uuid not in self.nouse_uuids
