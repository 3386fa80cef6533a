"""Admission decisions: nominate, assign flavors, borrow, preempt. Pure functions.

Mirrors pkg/scheduler/scheduler.go (schedule, nominate, the classical iterator),
pkg/scheduler/flavorassigner/flavorassigner.go (flavors tried in ClusterQueue order,
Fit / Preempt / NoFit, flavor fungibility) and pkg/scheduler/preemption/preemption.go
(classical preemption within the ClusterQueue and reclaim within the cohort). Messages
use upstream's wording so `kubectl describe workload` reads the same.

Upstream runs one scheduling cycle per head of each ClusterQueue and requeues; here
``schedule`` runs those cycles back to back over the pending Workloads until every
queue is exhausted or blocked, mutating the Cache as Workloads are admitted, so a
caller gets every decision of "the cluster as it is now" in one call.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource, format_quantity
from gpulab.kueue.cache import ZERO, Cache
from gpulab.kueue.model import ClusterQueue, Flavor, PodSet, WorkloadInfo


class Mode(enum.IntEnum):
    NO_FIT = 0
    PREEMPT = 1
    FIT = 2


@dataclass
class Assignment:
    """Flavors chosen for every pod set, and how the Workload would get them."""

    mode: Mode
    flavors: dict[str, dict[str, str]] = field(default_factory=dict)
    usage: dict[FlavorResource, Decimal] = field(default_factory=dict)
    # (flavor, resource) pairs that only fit by preempting.
    need_preemption: set[FlavorResource] = field(default_factory=set)
    borrows: bool = False
    message: str = ""
    reason: str = ""

    def to_admission(self, cq_name: str, wl: WorkloadInfo) -> dict[str, Any]:
        """status.admission for this assignment."""
        assignments = []
        for ps in wl.pod_sets:
            flavors = self.flavors.get(ps.name, {})
            assignments.append(
                {
                    "name": ps.name,
                    "flavors": dict(flavors),
                    "resourceUsage": {
                        r: format_quantity(v) for r, v in ps.requests.items() if r in flavors
                    },
                    "count": ps.count,
                }
            )
        return {"clusterQueue": cq_name, "podSetAssignments": assignments}


# -- flavor assignment -----------------------------------------------------------


def _tolerates(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        op = tol.get("operator") or "Equal"
        if not tol.get("key") and op == "Exists":
            return True
        if tol.get("key") != taint.get("key"):
            continue
        if op == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def flavor_mismatch(flavor: Flavor, ps: PodSet) -> str | None:
    """Why the flavor cannot serve the pod set, or None (checkFlavorForPodSets)."""
    for taint in flavor.node_taints:
        # PreferNoSchedule is ignored, as upstream.
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not _tolerates(taint, [*ps.tolerations, *flavor.tolerations]):
            desc = f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
            return f"untolerated taint {desc} in flavor {flavor.name}"
    # Only the selector keys the flavor defines count.
    for key, value in ps.node_selector.items():
        if key in flavor.node_labels and flavor.node_labels[key] != value:
            return f"flavor {flavor.name} doesn't match node affinity"
    return None


@dataclass
class _FlavorTry:
    mode: Mode
    borrows: bool
    flavors: dict[str, str]
    preempt: set[FlavorResource]


def _try_flavor(
    cache: Cache,
    cq: ClusterQueue,
    flavor: str,
    requests: Mapping[str, Decimal],
    assumed: Mapping[FlavorResource, Decimal],
    reasons: list[str],
    no_fit_reasons: list[str],
) -> _FlavorTry:
    result = _FlavorTry(Mode.FIT, False, {}, set())
    for resource, request in requests.items():
        fr = FlavorResource(flavor, resource)
        val = assumed.get(fr, ZERO) + request
        max_capacity = cache.potential_available(cq, fr)
        if val > max_capacity:
            reasons.append(
                f"insufficient quota for {resource} in flavor {flavor}, previously considered "
                f"podsets requests ({format_quantity(assumed.get(fr, ZERO))}) + current podset "
                f"request ({format_quantity(request)}) > maximum capacity "
                f"({format_quantity(max_capacity)})"
            )
            no_fit_reasons.append(api.REASON_EXCEEDS_MAX_QUOTA)
            return _FlavorTry(Mode.NO_FIT, False, {}, set())
        available = cache.available(cq, fr)
        if val <= available:
            result.borrows = result.borrows or cache.borrowing_with(cq, fr, val)
            result.flavors[resource] = flavor
            continue
        reasons.append(
            f"insufficient unused quota for {resource} in flavor {flavor}, "
            f"{format_quantity(val - available)} more needed"
        )
        no_fit_reasons.append(api.REASON_WAITING_FOR_QUOTA)
        can_preempt = (
            cq.within_cluster_queue != api.NEVER and cache.quota(cq, fr).nominal >= val
        ) or (cq.cohort is not None and cq.reclaim_within_cohort != api.NEVER)
        if not can_preempt:
            return _FlavorTry(Mode.NO_FIT, False, {}, set())
        result.mode = Mode.PREEMPT
        result.preempt.add(fr)
        result.borrows = result.borrows or cache.borrowing_with(cq, fr, val)
        result.flavors[resource] = flavor
    return result


def _better(a: _FlavorTry, b: _FlavorTry | None) -> bool:
    """Is ``a`` preferred over ``b``: fit over preempt, then not borrowing."""
    if b is None:
        return True
    return (a.mode, not a.borrows) > (b.mode, not b.borrows)


def assign_flavors(wl: WorkloadInfo, cq: ClusterQueue, cache: Cache) -> Assignment:
    """Pick a flavor for every resource of every pod set, trying flavors in order."""
    out = Assignment(mode=Mode.FIT)
    ps_messages: list[str] = []
    no_fit_reasons: list[str] = []
    for ps in wl.pod_sets:
        ps_flavors: dict[str, str] = {}
        ps_mode = Mode.FIT
        reasons: list[str] = []
        failed = False
        grouped: dict[int, dict[str, Decimal]] = {}
        for resource, request in ps.requests.items():
            group = cq.group_for(resource)
            if group is None:
                if request == 0:
                    continue
                reasons.append(f"resource {resource} unavailable in ClusterQueue")
                failed = True
                continue
            grouped.setdefault(cq.resource_groups.index(group), {})[resource] = request
        for gi, requests in grouped.items():
            best: _FlavorTry | None = None
            for flavor_name in cq.resource_groups[gi].flavors:
                flavor = cache.flavors.get(flavor_name)
                if flavor is None:
                    reasons.append(f"flavor {flavor_name} not found")
                    no_fit_reasons.append(api.REASON_NO_MATCHING_FLAVOR)
                    continue
                mismatch = flavor_mismatch(flavor, ps)
                if mismatch:
                    reasons.append(mismatch)
                    no_fit_reasons.append(api.REASON_NO_MATCHING_FLAVOR)
                    continue
                attempt = _try_flavor(
                    cache, cq, flavor_name, requests, out.usage, reasons, no_fit_reasons
                )
                if attempt.mode == Mode.NO_FIT:
                    continue
                if _better(attempt, best):
                    best = attempt
                # Flavor fungibility: stop at the first flavor that fits (borrowing or
                # not, under MayStopSearch), try the next one before preempting.
                if attempt.mode == Mode.FIT and (
                    not attempt.borrows or cq.when_can_borrow == "MayStopSearch"
                ):
                    break
                if attempt.mode == Mode.PREEMPT and cq.when_can_preempt == "MayStopSearch":
                    break
            if best is None:
                failed = True
                continue
            ps_flavors.update(best.flavors)
            ps_mode = min(ps_mode, best.mode)
            out.borrows = out.borrows or best.borrows
            out.need_preemption |= best.preempt
            for resource, flavor_name in best.flavors.items():
                fr = FlavorResource(flavor_name, resource)
                out.usage[fr] = out.usage.get(fr, ZERO) + requests[resource]
        if failed:
            ps_mode = Mode.NO_FIT
        out.mode = min(out.mode, ps_mode)
        if ps_mode != Mode.FIT:
            ps_messages.append(
                f"couldn't assign flavors to pod set {ps.name}: {', '.join(sorted(reasons))}"
            )
        out.flavors[ps.name] = ps_flavors
    out.message = "; ".join(ps_messages)
    if out.mode == Mode.NO_FIT:
        out.reason = _most_severe(no_fit_reasons)
    return out


_SEVERITY = [
    api.REASON_WAITING_FOR_QUOTA,
    api.REASON_NO_MATCHING_FLAVOR,
    api.REASON_EXCEEDS_MAX_QUOTA,
]


def _most_severe(reasons: Sequence[str]) -> str:
    known = [r for r in reasons if r in _SEVERITY]
    return max(known, key=_SEVERITY.index) if known else "Pending"


# -- preemption --------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    workload: WorkloadInfo
    reason: str  # InClusterQueue | InCohortReclamation


def satisfies_policy(preemptor: WorkloadInfo, candidate: WorkloadInfo, policy: str) -> bool:
    """preemption/common/preemption_policy.go."""
    lower = preemptor.priority > candidate.priority
    if policy == api.LOWER_PRIORITY:
        return lower
    if policy == api.LOWER_OR_NEWER_EQUAL_PRIORITY:
        newer_equal = preemptor.priority == candidate.priority and (
            preemptor.created,
            preemptor.name,
        ) < (candidate.created, candidate.name)
        return lower or newer_equal
    return policy == api.ANY


def _timestamp(value: str) -> float:
    """RFC 3339 to seconds; an unset time counts as now (the most recent)."""
    if not value:
        return math.inf
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def candidate_order(cq_name: str) -> Callable[[WorkloadInfo], tuple[object, ...]]:
    """CandidatesOrdering: already evicted first, other ClusterQueues before the
    preemptor's own, lower priority first, most recently admitted first."""

    def key(w: WorkloadInfo) -> tuple[object, ...]:
        recent = -_timestamp(w.quota_reserved_at)
        return (not w.evicted, w.cluster_queue == cq_name, w.priority, recent, w.uid)

    return key


def find_preemption_targets(
    wl: WorkloadInfo, assignment: Assignment, cq: ClusterQueue, cache: Cache
) -> list[Target]:
    """The smallest set of admitted Workloads to evict so ``wl`` fits, or []."""
    frs = assignment.need_preemption

    def uses(w: WorkloadInfo) -> bool:
        return any(fr in frs for fr in w.usage())

    same_cq: list[Target] = []
    if cq.within_cluster_queue != api.NEVER:
        same_cq = [
            Target(w, api.IN_CLUSTER_QUEUE)
            for w in cache.workloads_in(cq.name)
            if w.key != wl.key and uses(w) and satisfies_policy(wl, w, cq.within_cluster_queue)
        ]
    cohort: list[Target] = []
    if cq.cohort is not None and cq.reclaim_within_cohort != api.NEVER:
        for other in cache.members(cq.cohort):
            if other.name == cq.name or not any(cache.borrowing(other, fr) for fr in frs):
                continue
            cohort += [
                Target(w, api.IN_COHORT_RECLAMATION)
                for w in cache.workloads_in(other.name)
                if uses(w) and satisfies_policy(wl, w, cq.reclaim_within_cohort)
            ]
    # Reclaiming from the cohort is only for getting back nominal quota (no borrowing);
    # preempting inside the ClusterQueue may leave the Workload borrowing.
    attempts: list[tuple[list[Target], bool]] = []
    if cohort:
        attempts.append((cohort + same_cq, False))
    if same_cq:
        attempts.append((same_cq, True))
    order = candidate_order(cq.name)
    for candidates, allow_borrowing in attempts:
        candidates = sorted(candidates, key=lambda t: order(t.workload))
        sim = cache.clone()
        targets: list[Target] = []
        for t in candidates:
            sim.remove_workload(t.workload.key)
            targets.append(t)
            if sim.fits(cq, assignment.usage, allow_borrowing):
                return _fill_back(sim, cq, assignment, targets, allow_borrowing)
    return []


def _fill_back(
    sim: Cache, cq: ClusterQueue, assignment: Assignment, targets: list[Target], borrow: bool
) -> list[Target]:
    """Put back, newest choice first, every target the Workload fits without."""
    kept = list(targets)
    for t in reversed(targets[:-1]):
        sim.add_workload(t.workload)
        if sim.fits(cq, assignment.usage, borrow):
            kept.remove(t)
        else:
            sim.remove_workload(t.workload.key)
    return kept


# -- the scheduling loop -----------------------------------------------------------------


class Outcome(enum.Enum):
    ADMIT = "Admit"
    PREEMPT = "Preempt"
    PENDING = "Pending"


@dataclass
class Decision:
    workload: WorkloadInfo
    outcome: Outcome
    reason: str = ""
    message: str = ""
    admission: dict[str, Any] | None = None
    targets: list[Target] = field(default_factory=list)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; None selects nothing, {} everything."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def queue_order(wl: WorkloadInfo) -> tuple[object, ...]:
    """Order inside a ClusterQueue: higher priority first, then FIFO by creation."""
    return (-wl.priority, wl.created, wl.name)


def nominate(
    wl: WorkloadInfo, cache: Cache, namespace_labels: Mapping[str, Mapping[str, str]]
) -> tuple[Assignment | None, Decision | None]:
    """An assignment for the head of a queue, or the reason it is inadmissible."""
    cq = cache.cluster_queues.get(wl.cluster_queue or "")
    if cq is None:
        return None, Decision(
            wl,
            Outcome.PENDING,
            api.REASON_MISCONFIGURED,
            f"ClusterQueue {wl.cluster_queue} not found",
        )
    if not cache.is_active(cq.name):
        return None, Decision(
            wl, Outcome.PENDING, api.REASON_SUSPENDED, f"ClusterQueue {cq.name} is inactive"
        )
    if not selector_matches(cq.namespace_selector, namespace_labels.get(wl.namespace, {})):
        return None, Decision(
            wl,
            Outcome.PENDING,
            api.REASON_MISCONFIGURED,
            "workload namespace doesn't match ClusterQueue selector",
        )
    return assign_flavors(wl, cq, cache), None


def schedule(
    pending: Iterable[WorkloadInfo],
    cache: Cache,
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> list[Decision]:
    """Decide for the pending Workloads; admitted ones are added to ``cache``.

    A StrictFIFO ClusterQueue stops at its first Workload that cannot be admitted (the
    ones behind it get no decision: they keep waiting); BestEffortFIFO goes on with the
    next. A Workload that preempts keeps the head of its queue until the preempted
    Workloads release their quota.
    """
    queues: dict[str, list[WorkloadInfo]] = {}
    for wl in pending:
        queues.setdefault(wl.cluster_queue or "", []).append(wl)
    for q in queues.values():
        q.sort(key=queue_order)
    decisions: list[Decision] = []
    blocked: set[str] = set()
    preempted: set[str] = set()

    def strict(cq_name: str) -> bool:
        cq = cache.cluster_queues.get(cq_name)
        return cq is not None and cq.queueing_strategy == api.STRICT_FIFO

    while True:
        heads = [q.pop(0) for name, q in queues.items() if q and name not in blocked]
        if not heads:
            return decisions
        entries: list[tuple[WorkloadInfo, Assignment]] = []
        for wl in heads:
            assignment, inadmissible = nominate(wl, cache, namespace_labels)
            if inadmissible is not None:
                decisions.append(inadmissible)
            elif assignment is not None:
                entries.append((wl, assignment))
        # The classical iterator: not borrowing first, then priority, then FIFO.
        entries.sort(key=lambda e: (e[1].borrows, *queue_order(e[0])))
        for wl, assignment in entries:
            cq = cache.cluster_queues[wl.cluster_queue or ""]
            decision = _process(wl, assignment, cq, cache, preempted)
            decisions.append(decision)
            if decision.outcome is not Outcome.ADMIT and (
                decision.outcome is Outcome.PREEMPT or strict(cq.name)
            ):
                blocked.add(cq.name)


def _process(
    wl: WorkloadInfo, assignment: Assignment, cq: ClusterQueue, cache: Cache, preempted: set[str]
) -> Decision:
    if assignment.mode == Mode.NO_FIT:
        return Decision(wl, Outcome.PENDING, assignment.reason, assignment.message)
    if assignment.mode == Mode.PREEMPT:
        targets = find_preemption_targets(wl, assignment, cq, cache)
        if not targets:
            return Decision(wl, Outcome.PENDING, api.REASON_WAITING_FOR_QUOTA, assignment.message)
        if any(t.workload.key in preempted for t in targets):
            return Decision(
                wl,
                Outcome.PENDING,
                api.REASON_WAITING_FOR_QUOTA,
                "Workload has overlapping preemption targets with another workload",
            )
        preempted.update(t.workload.key for t in targets)
        return Decision(
            wl,
            Outcome.PREEMPT,
            api.REASON_WAITING_FOR_PREEMPTED,
            f"{assignment.message}. Pending the preemption of {len(targets)} workload(s)",
            targets=targets,
        )
    # Another Workload of this round may have taken the quota since nomination.
    if not cache.fits(cq, assignment.usage, allow_borrowing=True):
        return Decision(
            wl,
            Outcome.PENDING,
            api.REASON_WAITING_FOR_QUOTA,
            "Workload no longer fits after processing another workload",
        )
    admission = assignment.to_admission(cq.name, wl)
    admitted = dataclasses.replace(wl, admission=admission, cluster_queue=cq.name)
    cache.add_workload(admitted)
    return Decision(admitted, Outcome.ADMIT, "QuotaReserved", "", admission=admission)
