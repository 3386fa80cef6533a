"""Fit and score one pod on one node's cards, and pick the node: the pure heart of Filter.

Mirrors Project-HAMi/HAMi v2.10.0:
- ``pkg/scheduler/score.go`` (``scoreNode``, ``allocateInitContainers``,
  ``allocateAppContainers``, ``fitInDevices``) → :func:`fit_node`, :func:`fit_in_devices`;
- ``pkg/device/nvidia/device.go`` ``Fit`` (the card checks in upstream's order, the
  ``topology-aware`` pick via ``computeWorstSingleCard`` / ``computeBestCombination``, a
  MIG-mode card tried again for the container's next share), ``CustomFilterRule``,
  ``selectMigCandidate`` and ``AddResourceUsage`` → :func:`fit_cards`, :func:`fit_in_devices`;
- ``pkg/device/nvidia/mig_topology.go`` (``orderedMigPlacements``: 1g and 3g instances from
  the highest start down, the others from the lowest up; ``selectMigPlacement``) →
  :func:`select_mig_candidate`: the smallest allowed MIG profile holding the request's
  memory that has a free placement on the card;
- ``pkg/scheduler/policy/gpu_policy.go`` (``ComputeScore``, ``DeviceUsageList.Less`` with
  ``binpack``, ``spread``, ``mutex``, ``numa``, ``topology-aware`` and comma chains)
  → :func:`card_score`, :func:`order_cards`;
- ``pkg/scheduler/policy/node_policy.go`` (``ComputeDefaultScore``, ``NodeScoreList``)
  → :func:`node_score`, :func:`pick_node`;
- ``pkg/util/device_scoring_weights.go`` → :func:`parse_weights`;
- ``pkg/device/common/common.go`` (reason names, ``GenReason``).

Scores are HAMi's: ``10 * (used/count + usedcores/totalcore + usedmem/totalmem)`` (weighted
by ``hami.io/device-scoring-weights``), 0 for an idle card or node, 30 for a full one.
Binpack walks the fullest card first, spread the emptiest. Go sorts these lists with an
unstable sort; here ties go to the lowest card index and, for nodes, the first name, so a
run can be reproduced. Scores are float64 here, float32 upstream.
No I/O, no clock: everything the decision needs comes in as arguments.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpulab.hami.annotations import (
    DEVICE_TYPE,
    MODE_HAMI_CORE,
    MODE_MIG,
    ContainerDevice,
    MigProfile,
)
from gpulab.hami.device import CardFilter, ContainerRequest

BINPACK = "binpack"
SPREAD = "spread"
TOPOLOGY = "topology-aware"
MUTEX = "mutex"
NUMA = "numa"
NODE_POLICIES = (BINPACK, SPREAD)
GPU_POLICIES = (BINPACK, SPREAD, TOPOLOGY, MUTEX, NUMA)
NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
WEIGHTS_ANNOTATION = "hami.io/device-scoring-weights"
WEIGHT = 10

# Reason names from pkg/device/common (note the spelling of CardUuidMismatch).
CARD_TYPE_MISMATCH = "CardTypeMismatch"
CARD_UUID_MISMATCH = "CardUuidMismatch"
CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
CARD_NOT_HEALTH = "CardNotHealth"
CARD_CORDONED = "CardCordoned"
NUMA_NOT_FIT = "NumaNotFit"
EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
NODE_UNREGISTERED = "node unregistered"


class PolicyError(ValueError):
    """A policy or weights annotation this release does not know; the message says why."""


class CardUsage:
    """One card as the scheduler sees it (``DeviceUsage``): capacity from the node's
    registration, usage from the pods that hold it."""

    __slots__ = (
        "count",
        "health",
        "id",
        "index",
        "mig_in_use",
        "mig_profiles",
        "mode",
        "numa",
        "totalcore",
        "totalmem",
        "type",
        "used",
        "usedcores",
        "usedmem",
    )

    def __init__(
        self,
        id: str,
        index: int,
        type: str,
        count: int,
        totalmem: int,
        totalcore: int,
        numa: int = 0,
        mode: str = MODE_HAMI_CORE,
        health: bool = True,
        used: int = 0,
        usedmem: int = 0,
        usedcores: int = 0,
        mig_profiles: tuple[MigProfile, ...] = (),
        mig_in_use: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.id, self.index, self.type, self.count = id, index, type, count
        self.totalmem, self.totalcore, self.numa, self.mode = totalmem, totalcore, numa, mode
        self.health, self.used, self.usedmem, self.usedcores = health, used, usedmem, usedcores
        # MIG mode: the profiles it may be cut into, the placements reserved on it
        self.mig_profiles, self.mig_in_use = mig_profiles, list(mig_in_use)

    def copy(self) -> CardUsage:
        return CardUsage(
            self.id,
            self.index,
            self.type,
            self.count,
            self.totalmem,
            self.totalcore,
            self.numa,
            self.mode,
            self.health,
            self.used,
            self.usedmem,
            self.usedcores,
            self.mig_profiles,
            self.mig_in_use,
        )

    def __repr__(self) -> str:
        return (
            f"CardUsage({self.id}, used={self.used}/{self.count}, "
            f"mem={self.usedmem}/{self.totalmem}, cores={self.usedcores}/{self.totalcore})"
        )


@dataclass(frozen=True)
class Weights:
    """``DeviceScoringWeights`` (slot, core, memory)."""

    slot: int = 1
    core: int = 1
    memory: int = 1


@dataclass(frozen=True)
class FitOptions:
    """Everything Filter derives from the pod once per request (hashable: a cache key)."""

    gpu_policy: str = SPREAD
    node_policy: str = BINPACK
    weights: Weights = field(default_factory=Weights)
    cards: CardFilter = field(default_factory=CardFilter)

    @property
    def topology(self) -> bool:
        return _contains(self.gpu_policy, TOPOLOGY)

    @property
    def mutex(self) -> bool:
        return _contains(self.gpu_policy, MUTEX)


@dataclass(frozen=True)
class NodeExtras:
    """Per-node facts from its registration that Fit reads besides the cards."""

    cordoned: frozenset[str] = frozenset()  # hami.io/device-cordon
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


# A quota check: (memory MiB, cores %) the pod would hold in its namespace → fits?
QuotaCheck = Callable[[int, int], bool]


@dataclass
class NodeResult:
    """What Filter concluded for one node: recorded on the pod for `gpulab explain`."""

    node: str
    fit: bool
    reason: str = ""
    score: float | None = None
    devices: list[list[ContainerDevice]] = field(default_factory=list)


def _contains(policy: str, name: str) -> bool:
    """``util.PolicyContains``: a comma list names ``name``."""
    return any(p.strip() == name for p in policy.split(","))


def validate_gpu_policy(value: str, source: str) -> str:
    """Every comma-separated item must be one of the release's GPU policies."""
    items = [p.strip() for p in value.split(",")]
    unknown = [p for p in items if p not in GPU_POLICIES]
    if unknown:
        raise PolicyError(
            f"unknown {source} {value!r}: use {', '.join(GPU_POLICIES)} "
            "(comma-separated to chain, e.g. binpack,numa)"
        )
    return value


def validate_node_policy(value: str, source: str) -> str:
    if value not in NODE_POLICIES:
        raise PolicyError(f"unknown {source} {value!r}: use binpack or spread")
    return value


def parse_weights(value: str | None) -> Weights:
    """``ParseDeviceScoringWeights``: "slot=1,core=1,memory=3", all three, not all zero."""
    if value is None:
        return Weights()
    where = f"invalid {WEIGHTS_ANNOTATION} annotation {value!r}"
    parts = value.split(",")
    if len(parts) != 3:
        raise PolicyError(f"{where}: expected slot, core, and memory weights")
    seen: dict[str, int] = {}
    for part in parts:
        key, sep, raw = part.strip().partition("=")
        key = key.strip()
        if not sep:
            raise PolicyError(f"{where}: expected key=value entries")
        if key in seen:
            raise PolicyError(f"{where}: duplicate {key!r} weight")
        try:
            weight = int(raw.strip())
        except ValueError as exc:
            raise PolicyError(f"{where}: {key!r} weight must be an integer") from exc
        if weight < 0:
            raise PolicyError(f"{where}: {key!r} weight must not be negative")
        if key not in ("slot", "core", "memory"):
            raise PolicyError(f"{where}: unknown weight {key!r}")
        seen[key] = weight
    if not any(seen.values()):
        raise PolicyError(f"{where}: at least one weight must be positive")
    return Weights(seen["slot"], seen["core"], seen["memory"])


def options_for(annos: Mapping[str, str], node_default: str, gpu_default: str) -> FitOptions:
    """The pod's policies (annotation over flag), weights and card filters."""
    node_policy = annos.get(NODE_POLICY_ANNOTATION, node_default)
    gpu_policy = annos.get(GPU_POLICY_ANNOTATION, gpu_default)
    return FitOptions(
        gpu_policy=validate_gpu_policy(gpu_policy, GPU_POLICY_ANNOTATION),
        node_policy=validate_node_policy(node_policy, NODE_POLICY_ANNOTATION),
        weights=parse_weights(annos.get(WEIGHTS_ANNOTATION)),
        cards=CardFilter.of(annos),
    )


def _ratio(a: int, b: int) -> float:
    return a / b


def card_score(d: CardUsage, req: ContainerRequest, w: Weights) -> float:
    """``DeviceListsScore.ComputeScore``. Upstream counts the request only when its type
    ("NVIDIA") equals the card's type (a model name such as "NVIDIA A100-SXM4-40GB"), so
    in practice the score is the card's current usage; the lab keeps that comparison."""
    if d.count == 0 or d.totalcore == 0 or d.totalmem == 0:
        return 0.0
    request = core = mem = 0
    if req.type == d.type:
        request, core = 1, req.coresreq
        if req.mem_percentage not in (0, 101):
            mem = d.totalmem * req.mem_percentage // 100
        else:
            mem = req.memreq
    return WEIGHT * (
        w.slot * _ratio(request + d.used, d.count)
        + w.core * _ratio(core + d.usedcores, d.totalcore)
        + w.memory * _ratio(mem + d.usedmem, d.totalmem)
    )


def node_score(cards: Sequence[CardUsage]) -> float:
    """``NodeScore.ComputeDefaultScore``: the node's usage before this pod."""
    total = sum(c.count for c in cards)
    total_core = sum(c.totalcore for c in cards)
    total_mem = sum(c.totalmem for c in cards)
    if total == 0 or total_core == 0 or total_mem == 0:
        return 0.0
    return WEIGHT * (
        sum(c.used for c in cards) / total
        + sum(c.usedcores for c in cards) / total_core
        + sum(c.usedmem for c in cards) / total_mem
    )


def _chain(policy: str, numa_bind: bool) -> list[str]:
    chain: list[str] = []
    for p in policy.split(","):
        name = p.strip()
        if name in (BINPACK, SPREAD, NUMA) and name not in chain:
            chain.append(name)
    chain = chain or [SPREAD]
    if numa_bind and chain[0] != NUMA:
        chain = [NUMA, *(k for k in chain if k != NUMA)]
    return chain


def order_cards(
    cards: Sequence[CardUsage], scores: Sequence[float], policy: str, numa_bind: bool
) -> list[int]:
    """Card positions in ``DeviceUsageList.Less`` order (ascending); Fit walks from the end."""
    if "," in policy or policy == NUMA:
        chain = _chain(policy, numa_bind)

        def chained(i: int) -> tuple[float, ...]:
            c, s = cards[i], scores[i]
            keys = {BINPACK: s, SPREAD: -s, NUMA: float(c.numa)}
            return (*(keys[k] for k in chain), float(c.index))

        return sorted(range(len(cards)), key=chained)

    binpack = policy == BINPACK
    if policy == MUTEX:

        def key(i: int) -> tuple[float, float]:
            return (-cards[i].used, cards[i].numa)
    elif numa_bind:

        def key(i: int) -> tuple[float, float]:
            c = cards[i]
            return (-c.numa, scores[i]) if binpack else (c.numa, -scores[i])
    else:

        def key(i: int) -> tuple[float, float]:
            return (scores[i] if binpack else -scores[i], cards[i].numa)

    # ties: the lowest card index ends up last, so Fit tries it first
    by_index = sorted(range(len(cards)), key=lambda i: -cards[i].index)
    return sorted(by_index, key=key)


def gen_reason(reasons: Counter[str], cards: int) -> str:
    """``common.GenReason``: "2/4 CardInsufficientMemory, 2/4 CardUuidMismatch"."""
    return ", ".join(sorted(f"{n}/{cards} {r}" for r, n in reasons.items()))


def parse_reason(reason: str) -> dict[str, int]:
    """``common.ParseReason``: the counts back out of a GenReason string."""
    out = {}
    for part in reason.split(", "):
        count, _, rest = part.partition("/")
        _, _, key = rest.partition(" ")
        if count.isdigit() and key and " " not in key:
            out[key] = int(count)
    return out


def _worst_single(granted: list[ContainerDevice], pairs: Mapping[str, Mapping[str, int]]):
    """``computeWorstSingleCard``: the card with the weakest links to the others."""
    best: list[ContainerDevice] = []
    worst = 0
    for d1 in granted:
        total = sum(pairs.get(d1.uuid, {}).get(d2.uuid, 0) for d2 in granted if d2 is not d1)
        if not best or total < worst:
            worst, best = total, [d1]
    return best


def _best_combination(
    granted: list[ContainerDevice], nums: int, pairs: Mapping[str, Mapping[str, int]]
) -> list[ContainerDevice]:
    """``computeBestCombination``: the ``nums`` cards with the strongest links."""
    best: list[ContainerDevice] = []
    best_score = -1
    for combo in itertools.combinations(granted, nums):
        total = sum(
            pairs.get(a.uuid, {}).get(b.uuid, 0) for a, b in itertools.combinations(combo, 2)
        )
        if not best or total > best_score:
            best_score, best = total, list(combo)
    return best


def _placements(profile: MigProfile) -> list[tuple[int, int]]:
    """``orderedMigPlacements``: 1g and 3g from the highest start down (keeping the low
    slices for larger instances), the others from the lowest up."""
    high = profile.name.startswith(("1g.", "3g."))
    return sorted(profile.placements, key=lambda p: -p[0] if high else p[0])


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def select_mig_candidate(
    profiles: Sequence[MigProfile], occupied: Sequence[tuple[int, int]], memory: int
) -> tuple[MigProfile, tuple[int, int]] | None:
    """``selectMigCandidate``: the smallest profile (memory, then slices) with at least
    ``memory`` MiB and a placement free of ``occupied``."""
    for profile in sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count)):
        if profile.memory_mb < memory:
            continue
        named = next(p for p in profiles if p.name == profile.name)  # selectMigPlacement
        place = next(
            (c for c in _placements(named) if not any(_overlap(c, o) for o in occupied)), None
        )
        if place is not None:
            return profile, place
    return None


def mig_fits(dev: CardUsage, granted: Sequence[ContainerDevice], memory: int) -> bool:
    """``CustomFilterRule`` on a MIG-mode card: the container's shares already placed on it
    and then this one each get a profile and a free placement."""
    occupied = list(dev.mig_in_use)
    for existing in granted:
        if existing.uuid != dev.id:
            continue
        found = select_mig_candidate(dev.mig_profiles, occupied, existing.usedmem)
        if found is None:
            return False
        occupied.append(found[1])
    return select_mig_candidate(dev.mig_profiles, occupied, memory) is not None


def fit_cards(
    devices: Sequence[CardUsage],
    req: ContainerRequest,
    opts: FitOptions,
    extras: NodeExtras,
    quota: Callable[[list[ContainerDevice], int, int], bool] | None,
) -> tuple[bool, list[ContainerDevice], str]:
    """``NvidiaGPUDevices.Fit`` for one container: walk the ordered cards from the end,
    checking each in upstream's order; (fit, granted, reason)."""
    nums, coresreq = req.nums, req.coresreq
    prevnuma = -1
    granted: list[ContainerDevice] = []
    reasons: Counter[str] = Counter()
    flt, topology, mutex = opts.cards, opts.topology, opts.mutex
    i = len(devices)
    while i > 0:
        i -= 1
        dev = devices[i]
        if not dev.health:
            reasons[CARD_NOT_HEALTH] += 1
            continue
        if dev.id in extras.cordoned:
            reasons[CARD_CORDONED] += 1
            continue
        if not flt.type_ok(dev.type, dev.mode):
            reasons[CARD_TYPE_MISMATCH] += 1
            continue
        if flt.numa_bind and prevnuma != dev.numa:
            if nums != req.nums:
                reasons[NUMA_NOT_FIT] += len(granted)
            nums, prevnuma, granted = req.nums, dev.numa, []
        if not flt.uuid_ok(dev.id):
            reasons[CARD_UUID_MISMATCH] += 1
            continue
        if dev.count <= dev.used:
            reasons[CARD_TIME_SLICING_EXHAUSTED] += 1
            continue
        if mutex and dev.used > 0:
            reasons[EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        coresreq = min(coresreq, 100)
        memreq = req.memory_on(dev.totalmem)
        if quota is not None and not quota(granted, memreq, coresreq):
            reasons[RESOURCE_QUOTA_NOT_FIT] += 1
            continue
        if dev.totalmem - dev.usedmem < memreq:
            reasons[CARD_INSUFFICIENT_MEMORY] += 1
            continue
        if dev.totalcore - dev.usedcores < coresreq:
            reasons[CARD_INSUFFICIENT_CORE] += 1
            continue
        if dev.totalcore == 100 and coresreq == 100 and dev.used > 0:
            reasons[EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            continue
        if dev.totalcore != 0 and dev.usedcores == dev.totalcore and coresreq == 0:
            reasons[CARD_COMPUTE_UNITS_EXHAUSTED] += 1
            continue
        if dev.mode == MODE_MIG and not mig_fits(dev, granted, memreq):
            reasons[CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
            continue
        if nums > 0:
            if not topology:
                nums -= 1
            granted.append(ContainerDevice(dev.id, req.type, memreq, coresreq))
        if nums == 0 and not topology:
            return True, granted, ""
        if dev.mode == MODE_MIG:
            i += 1  # the same card again: several MIG instances of one GPU
    if topology:
        if len(granted) == req.nums:
            return True, granted, ""
        if len(granted) > req.nums:
            if req.nums == 1:
                return True, _worst_single(granted, extras.pair_scores), ""
            return True, _best_combination(granted, req.nums, extras.pair_scores), ""
    if granted:
        reasons[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(granted)
    return False, [], gen_reason(reasons, len(devices))


def fit_in_devices(
    work: list[CardUsage],
    req: ContainerRequest,
    opts: FitOptions,
    extras: NodeExtras,
    quota: Callable[[list[ContainerDevice], int, int], bool] | None,
) -> tuple[bool, list[ContainerDevice], str]:
    """``fitInDevices`` for one container: score, order, Fit, then charge ``work``."""
    scores = [card_score(c, req, opts.weights) for c in work]
    order = order_cards(work, scores, opts.gpu_policy, opts.cards.numa_bind)
    wanted = req.type.lower()
    typed = [work[i] for i in order if wanted in work[i].type.lower()]
    mig_request = any(c.mode == MODE_MIG for c in typed) and (
        opts.cards.mode is None or MODE_MIG in opts.cards.mode
    )  # isMIGRequest: one GPU may hold several of the container's shares
    if req.nums > len(typed) and not mig_request:
        return False, [], NODE_INSUFFICIENT_DEVICE
    fit, granted, reason = fit_cards(typed, req, opts, extras, quota)
    if not fit:
        return False, [], reason
    by_id = {c.id: c for c in work}
    charged = []
    for g in granted:  # AddResourceUsage
        card = by_id[g.uuid]
        if card.mode == MODE_MIG:
            found = select_mig_candidate(card.mig_profiles, card.mig_in_use, g.usedmem)
            if found is None:
                return (
                    False,
                    [],
                    (
                        f"AddResourceUsage failed for device {card.id}: "
                        "MIG profile and placement allocation failed"
                    ),
                )
            profile, place = found
            g = ContainerDevice(g.uuid, g.type, profile.memory_mb, profile.core,
                                (profile.name, *place))  # fmt: skip
            card.mig_in_use.append(place)
        card.used += 1
        card.usedcores += g.usedcores
        card.usedmem += g.usedmem
        charged.append(g)
    return True, charged, ""


def fit_node(
    node: str,
    cards: Sequence[CardUsage],
    reqs: Sequence[ContainerRequest],
    n_init: int,
    opts: FitOptions,
    extras: NodeExtras = NodeExtras(),
    quota: QuotaCheck | None = None,
) -> NodeResult:
    """``scoreNode``: every init container on the node as it is (they run one after the
    other), then the app containers one after another on a running copy. Devices come
    back one slot per container, init containers first; the score is the node's usage
    before this pod. ``cards`` is left untouched."""
    allocated: list[list[ContainerDevice]] = []

    def quota_for(index: int) -> Callable[[list[ContainerDevice], int, int], bool] | None:
        if quota is None:
            return None

        def check(so_far: list[ContainerDevice], mem: int, cores: int) -> bool:
            pending = [*so_far, ContainerDevice("?", DEVICE_TYPE, mem, cores)]
            slots = [*allocated, pending]
            init = [s for i, s in enumerate(slots) if i < n_init]
            app = [s for i, s in enumerate(slots) if i >= n_init]
            peak_mem = max((d.usedmem for s in init for d in s), default=0)
            peak_cores = max((d.usedcores for s in init for d in s), default=0)
            app_mem = sum(d.usedmem for s in app for d in s)
            app_cores = sum(d.usedcores for s in app for d in s)
            return quota(max(peak_mem, app_mem), max(peak_cores, app_cores))

        return check

    for i, req in enumerate(reqs[:n_init]):
        if req.nums == 0:
            allocated.append([])
            continue
        fresh = [c.copy() for c in cards]
        fit, granted, reason = fit_in_devices(fresh, req, opts, extras, quota_for(i))
        if not fit:
            return NodeResult(node, fit=False, reason=reason)
        allocated.append(granted)
    work = [c.copy() for c in cards]
    score = node_score(cards)
    for i, req in enumerate(reqs[n_init:], start=n_init):
        if req.nums == 0:
            allocated.append([])
            continue
        fit, granted, reason = fit_in_devices(work, req, opts, extras, quota_for(i))
        if not fit:
            return NodeResult(node, fit=False, reason=reason)
        allocated.append(granted)
    return NodeResult(node, fit=True, score=round(score, 4), devices=allocated)


def pick_node(results: Sequence[NodeResult], node_policy: str) -> NodeResult | None:
    """``sort.Sort(nodeScores)`` and take the last: binpack the highest score, spread the
    lowest; ties go to the first node name."""
    fitting = [r for r in results if r.fit and r.score is not None]
    if not fitting:
        return None
    if node_policy == SPREAD:
        return min(fitting, key=lambda r: (r.score, r.node))
    return min(fitting, key=lambda r: (-(r.score or 0.0), r.node))
