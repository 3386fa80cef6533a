"""Per-card fit and node/card scoring with the binpack and spread policies.

Mirrors HAMi ``pkg/scheduler/score.go`` (``fitInDevices``, ``calcScore``),
``pkg/scheduler/policy/{gpu,node}_policy.go`` (``ComputeScore``, the sort orders) and the
card checks of ``pkg/device/nvidia/fit_checks.go`` / ``Fit``. Pure: no I/O, no clock.

Scores are HAMi's: ``10 * (used/count + usedcores/totalcore + usedmem/totalmem)``, so 0
is an idle card or node and 30 a full one. Binpack prefers the highest score (the fullest),
spread the lowest.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpulab.hami import device
from gpulab.hami.annotations import ContainerDevice
from gpulab.hami.device import ContainerRequest

BINPACK = "binpack"
SPREAD = "spread"
POLICIES = (BINPACK, SPREAD)
NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
WEIGHT = 10

# Reason names from HAMi pkg/device/common.
CARD_NOT_HEALTH = "CardNotHealth"
CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUUIDMismatch"
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
NODE_UNREGISTERED = "node unregistered"


@dataclass
class DeviceUsage:
    """One card as the scheduler sees it: capacity from the node, usage from pods."""

    id: str
    index: int
    type: str
    count: int  # how many pods may share it (split count)
    totalmem: int  # MiB
    totalcore: int  # %
    numa: int = 0
    mode: str = "hami-core"
    health: bool = True
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0


@dataclass
class NodeResult:
    """What Filter concluded for one node: recorded on the pod for `gpulab explain`."""

    node: str
    fit: bool
    reason: str = ""
    score: float | None = None
    devices: list[list[ContainerDevice]] = field(default_factory=list)


def resolve_policy(annos: Mapping[str, str], key: str, default: str) -> str:
    """Per-pod override when it names a known policy; otherwise the configured one."""
    value = annos.get(key, "").strip()
    return value if value in POLICIES else default


def card_score(d: DeviceUsage, reqs: Sequence[ContainerRequest]) -> float:
    """``DeviceListsScore.ComputeScore``: how full the card is once this pod is on it."""
    nums = sum(r.nums for r in reqs)
    cores = sum(r.coresreq for r in reqs)
    mem = sum(r.memory_on(d.totalmem) for r in reqs)
    return WEIGHT * (
        _ratio(nums + d.used, d.count)
        + _ratio(cores + d.usedcores, d.totalcore)
        + _ratio(mem + d.usedmem, d.totalmem)
    )


def node_score(devices: Sequence[DeviceUsage]) -> float:
    """``NodeScore.ComputeScore`` over the node's usage before this pod (ComputeDefaultScore)."""
    return WEIGHT * (
        _ratio(sum(d.used for d in devices), sum(d.count for d in devices))
        + _ratio(sum(d.usedcores for d in devices), sum(d.totalcore for d in devices))
        + _ratio(sum(d.usedmem for d in devices), sum(d.totalmem for d in devices))
    )


def _ratio(a: int, b: int) -> float:
    return a / b if b > 0 else 1.0


def card_reason(d: DeviceUsage, req: ContainerRequest, annos: Mapping[str, str]) -> str:
    """The first check a card fails for ``req``, in HAMi's order; "" when it fits."""
    memreq = req.memory_on(d.totalmem)
    checks = (
        (not d.health, CARD_NOT_HEALTH),
        (not device.type_allowed(annos, d.type), CARD_TYPE_MISMATCH),
        (not device.uuid_allowed(annos, d.id), CARD_UUID_MISMATCH),
        (d.count <= d.used, CARD_TIME_SLICING_EXHAUSTED),
        (d.totalmem - d.usedmem < memreq, CARD_INSUFFICIENT_MEMORY),
        (d.totalcore - d.usedcores < req.coresreq, CARD_INSUFFICIENT_CORE),
        (
            d.totalcore == 100 and req.coresreq == 100 and d.used > 0,
            EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
        ),
        (
            d.totalcore != 0 and d.usedcores == d.totalcore and req.coresreq == 0,
            CARD_COMPUTE_UNITS_EXHAUSTED,
        ),
    )
    return next((reason for failed, reason in checks if failed), "")


def order_cards(
    devices: Sequence[DeviceUsage], reqs: Sequence[ContainerRequest], gpu_policy: str
) -> list[DeviceUsage]:
    """Cards in the order Fit tries them: binpack fullest first, spread emptiest first.

    HAMi sorts ascending (binpack) or descending (spread) and walks from the end; ties
    fall back to the card index so the choice is reproducible.
    """
    scored = [(card_score(d, reqs), d) for d in devices]
    if gpu_policy == BINPACK:
        scored.sort(key=lambda sd: (-sd[0], sd[1].index))
    else:
        scored.sort(key=lambda sd: (sd[0], sd[1].index))
    return [d for _, d in scored]


def _summarise(reasons: Counter[str], total: int) -> str:
    """HAMi's ``GenReason`` shape: "2/4 CardInsufficientMemory, 2/4 CardUUIDMismatch"."""
    return ", ".join(f"{n}/{total} {r}" for r, n in sorted(reasons.items()))


def fit_container(
    devices: Sequence[DeviceUsage],
    req: ContainerRequest,
    annos: Mapping[str, str],
    ordered: Sequence[DeviceUsage],
) -> tuple[list[ContainerDevice], str]:
    """``NvidiaGPUDevices.Fit`` for one container: the granted cards, or [] and why not."""
    if req.nums > len(devices):
        return [], NODE_INSUFFICIENT_DEVICE
    granted: list[ContainerDevice] = []
    reasons: Counter[str] = Counter()
    for d in ordered:
        reason = card_reason(d, req, annos)
        if reason:
            reasons[reason] += 1
            continue
        granted.append(
            ContainerDevice(d.id, device.DEVICE_TYPE, req.memory_on(d.totalmem), req.coresreq)
        )
        if len(granted) == req.nums:
            return granted, ""
    return [], _summarise(reasons, len(devices)) or NODE_INSUFFICIENT_DEVICE


def add_usage(devices: Sequence[DeviceUsage], granted: Sequence[ContainerDevice]) -> None:
    """``AddResourceUsage``: charge granted cards to the usage view."""
    by_id = {d.id: d for d in devices}
    for g in granted:
        d = by_id.get(g.uuid)
        if d is not None:
            d.used += 1
            d.usedmem += g.usedmem
            d.usedcores += g.usedcores


def fit_pod(
    node: str,
    devices: Sequence[DeviceUsage],
    reqs: Sequence[ContainerRequest],
    annos: Mapping[str, str],
    gpu_policy: str,
) -> NodeResult:
    """Fit every container of a pod on one node's cards (``fitInDevices`` per container).

    Works on a copy: the caller's usage view is unchanged. The score is the node's
    usage before this pod, as HAMi's ComputeDefaultScore.
    """
    work = copy.deepcopy(list(devices))
    per_container: list[list[ContainerDevice]] = []
    for req in reqs:
        if req.nums == 0:
            per_container.append([])
            continue
        ordered = order_cards(work, [req], gpu_policy)
        granted, reason = fit_container(work, req, annos, ordered)
        if not granted:
            return NodeResult(node, fit=False, reason=reason)
        add_usage(work, granted)
        per_container.append(granted)
    return NodeResult(node, fit=True, score=round(node_score(devices), 4), devices=per_container)


def pick_node(results: Sequence[NodeResult], node_policy: str) -> NodeResult | None:
    """Binpack takes the highest-scoring fitting node, spread the lowest; ties by name."""
    fitting = [r for r in results if r.fit and r.score is not None]
    if not fitting:
        return None
    if node_policy == SPREAD:
        return min(fitting, key=lambda r: (r.score, r.node))
    return min(fitting, key=lambda r: (-(r.score or 0.0), r.node))


def extender_score(result: NodeResult, node_policy: str) -> int:
    """A 0..10 extender priority for a node (HostPriority.Score): 0 when it does not fit."""
    if not result.fit or result.score is None:
        return 0
    fullness = min(max(result.score / (3 * WEIGHT), 0.0), 1.0)
    return round(10 * (fullness if node_policy == BINPACK else 1.0 - fullness))
