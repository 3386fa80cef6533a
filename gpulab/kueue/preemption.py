"""Preemption: which admitted Workloads to evict so a pending one fits. Pure functions of
a snapshot (the snapshot is changed while simulating and restored before returning).

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/scheduler/preemption:
- preemption.go ``GetTargets`` → ``classicalPreemptions``: candidates from
  classical/candidate_generator.go ``NewCandidateIterator`` (hierarchical reclaim first,
  then other ClusterQueues, then the preemptor's own; evicted ones first), each removed
  from the snapshot in turn until the Workload fits; a candidate from another queue is
  re-checked as victims are removed (``candidateIsValid``: skipped once its queue, or a
  cohort up to the common ancestor, is back within nominal quota); then
  ``fillBackWorkloads`` puts back every victim that is not needed. ``borrowWithinCohort``
  (``IsBorrowingWithinCohortForbidden``, ``maxPriorityThreshold``) decides whether the
  preemptor may still borrow after reclaiming (classical/hierarchical_preemption.go).
- ``fairPreemptions`` with the strategies of fairsharing/strategy.go
  (LessThanOrEqualToFinalShare, LessThanInitialShare) over the ClusterQueue ordering of
  fairsharing/ordering.go (highest dominant resource share first).
- preemption_oracle.go ``SimulatePreemption``: what flavor assignment asks.
- common/ordering.go ``CandidatesOrdering``, common/preemption_policy.go
  ``SatisfiesPreemptionPolicy``.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource
from gpulab.kueue.cache import (
    DRS,
    NEGATIVE_DRS,
    CohortNode,
    CQNode,
    Node,
    Snapshot,
    compare_drs,
    dominant_resource_share,
    is_within_nominal,
    quantities_fit_in_quota,
)
from gpulab.kueue.flavorassigner import (
    Assignment,
    Possibility,
    find_height_of_lowest_subtree_that_fits,
)
from gpulab.kueue.model import WorkloadInfo

LESS_THAN_OR_EQUAL_TO_FINAL_SHARE = "LessThanOrEqualToFinalShare"
LESS_THAN_INITIAL_SHARE = "LessThanInitialShare"


@dataclass(frozen=True)
class Target:
    workload: WorkloadInfo
    reason: str  # InClusterQueue | InCohortReclamation | InCohortReclaimWhileBorrowing ...


def satisfies_policy(preemptor: WorkloadInfo, candidate: WorkloadInfo, policy: str) -> bool:
    lower = preemptor.priority > candidate.priority
    if policy == api.LOWER_PRIORITY:
        return lower
    if policy == api.LOWER_OR_NEWER_EQUAL_PRIORITY:
        newer_equal = preemptor.priority == candidate.priority and (
            preemptor.queue_ts < candidate.queue_ts
        )
        return lower or newer_equal
    return policy == api.ANY


def candidates_order(cq_name: str, now: float) -> Callable[[WorkloadInfo], tuple[object, ...]]:
    """CandidatesOrdering as a sort key: evicted first, other ClusterQueues before the
    preemptor's own, lower priority first, most recently reserved first, then UID."""

    def key(w: WorkloadInfo) -> tuple[object, ...]:
        reserved = w.quota_reserved_at if w.quota_reserved_at is not None else now
        return (not w.evicted, w.cluster_queue == cq_name, w.priority, -reserved, w.uid)

    return key


@dataclass
class _Ctx:
    preemptor: WorkloadInfo
    cq: CQNode
    snapshot: Snapshot
    usage: dict[FlavorResource, int]
    frs: set[FlavorResource]
    now: float


def _fits(ctx: _Ctx, allow_borrowing: bool) -> bool:
    """workloadFits."""
    for fr, v in ctx.usage.items():
        if not allow_borrowing and ctx.cq.borrowing_with(fr, v):
            return False
        if v > ctx.cq.available(fr):
            return False
    return True


def _fill_back(ctx: _Ctx, targets: list[Target], allow_borrowing: bool) -> list[Target]:
    """Put back, newest choice first, every target the Workload fits without."""
    for i in range(len(targets) - 2, -1, -1):
        ctx.snapshot.add_workload(targets[i].workload)
        if _fits(ctx, allow_borrowing):
            targets[i] = targets[-1]
            targets.pop()
        else:
            ctx.snapshot.remove_workload(targets[i].workload)
    return targets


def _restore(snapshot: Snapshot, targets: list[Target]) -> None:
    for t in targets:
        snapshot.add_workload(t.workload)


# -- classical (candidate_generator.go, hierarchical_preemption.go) ---------------------


class _Variant(enum.Enum):
    NEVER = ""
    WITHIN_CQ = api.IN_CLUSTER_QUEUE
    HIERARCHICAL_RECLAIM = api.IN_COHORT_RECLAMATION
    RECLAIM_WITHOUT_BORROWING = "ReclaimWithoutBorrowing"
    RECLAIM_WHILE_BORROWING = api.IN_COHORT_RECLAIM_WHILE_BORROWING

    def reason(self) -> str:
        if self is _Variant.RECLAIM_WITHOUT_BORROWING:
            return api.IN_COHORT_RECLAMATION
        return self.value


@dataclass
class _Candidate:
    wl: WorkloadInfo
    lca: CohortNode | None
    variant: _Variant


def borrowing_within_cohort_forbidden(cq: CQNode) -> tuple[bool, int | None]:
    pre = cq.spec.preemption
    if pre.borrow_within_cohort == api.NEVER:
        return True, None
    return False, pre.max_priority_threshold


def _classify(ctx: _Ctx, wl: WorkloadInfo, advantage: bool) -> _Variant:
    if not wl.uses(ctx.frs):
        return _Variant.NEVER
    same = wl.cluster_queue == ctx.cq.name
    pre = ctx.cq.spec.preemption
    policy = pre.within_cluster_queue if same else pre.reclaim_within_cohort
    if not satisfies_policy(ctx.preemptor, wl, policy):
        return _Variant.NEVER
    if same:
        return _Variant.WITHIN_CQ
    if advantage:
        return _Variant.HIERARCHICAL_RECLAIM
    forbidden, threshold = borrowing_within_cohort_forbidden(ctx.cq)
    if forbidden:
        return _Variant.RECLAIM_WITHOUT_BORROWING
    above = wl.priority >= ctx.preemptor.priority or (
        threshold is not None and wl.priority > threshold
    )
    return _Variant.RECLAIM_WITHOUT_BORROWING if above else _Variant.RECLAIM_WHILE_BORROWING


def _from_cq(cq: CQNode, lca: CohortNode | None, ctx: _Ctx, adv: bool) -> list[_Candidate]:
    out = []
    for wl in cq.workloads.values():
        variant = _classify(ctx, wl, adv)
        if variant is not _Variant.NEVER:
            out.append(_Candidate(wl, lca, variant))
    return out


def _collect_subtree(
    ctx: _Ctx,
    current: CohortNode,
    subtree_root: CohortNode,
    skip: CohortNode | None,
    adv: bool,
    result: list[_Candidate],
) -> None:
    for child in current.child_cohorts:
        if child is skip or is_within_nominal(child, ctx.frs):
            continue
        _collect_subtree(ctx, child, subtree_root, skip, adv, result)
    for child_cq in current.child_cqs:
        if child_cq is ctx.cq or is_within_nominal(child_cq, ctx.frs):
            continue
        result += _from_cq(child_cq, subtree_root, ctx, adv)


class CandidateIterator:
    """NewCandidateIterator: every candidate, in the order they are tried."""

    def __init__(self, ctx: _Ctx) -> None:
        self._ctx = ctx
        same: list[_Candidate] = []
        if ctx.cq.spec.preemption.within_cluster_queue != api.NEVER:
            same = _from_cq(ctx.cq, None, ctx, False)
        hierarchy: list[_Candidate] = []
        priority: list[_Candidate] = []
        if ctx.cq.parent is not None and ctx.cq.spec.preemption.reclaim_within_cohort != api.NEVER:
            adv, remaining = quantities_fit_in_quota(ctx.cq, ctx.usage)
            previous: CohortNode | None = None
            for current in ctx.cq.path_to_root():
                _collect_subtree(
                    ctx, current, current, previous, adv, hierarchy if adv else priority
                )
                fits, remaining = quantities_fit_in_quota(current, remaining)
                adv = adv or fits
                previous = current
        order = candidates_order(ctx.cq.name, ctx.now)
        lists = [sorted(x, key=lambda c: order(c.wl)) for x in (hierarchy, priority, same)]
        evicted = [c for lst in lists for c in lst if c.wl.evicted]
        rest = [c for lst in lists for c in lst if not c.wl.evicted]
        self.candidates = evicted + rest
        self.no_candidate_from_other_queues = not hierarchy and not priority
        self.no_candidate_for_hierarchical_reclaim = not hierarchy

    def iterate(self, borrow: bool) -> Iterator[tuple[WorkloadInfo, str]]:
        for c in self.candidates:
            if self._valid(c, borrow):
                yield c.wl, c.variant.reason()

    def _valid(self, c: _Candidate, borrow: bool) -> bool:
        """candidateIsValid, against the snapshot as victims have been removed so far."""
        ctx = self._ctx
        if c.wl.cluster_queue == ctx.cq.name:
            return True
        if borrow and c.variant is _Variant.RECLAIM_WITHOUT_BORROWING:
            return False
        cq = ctx.snapshot.cluster_queues[c.wl.cluster_queue or ""]
        if is_within_nominal(cq, ctx.frs):
            return False
        for node in cq.path_to_root():
            if node is c.lca:
                break
            if is_within_nominal(node, ctx.frs):
                return False
        return True


def _queue_under_nominal(ctx: _Ctx) -> bool:
    return all(ctx.cq.quota(fr).nominal > ctx.cq.usage.get(fr, 0) for fr in ctx.frs)


def classical_preemptions(ctx: _Ctx) -> list[Target]:
    gen = CandidateIterator(ctx)
    forbidden, _ = borrowing_within_cohort_forbidden(ctx.cq)
    if gen.no_candidate_from_other_queues or (forbidden and not _queue_under_nominal(ctx)):
        attempts = [True]
    elif forbidden and gen.no_candidate_for_hierarchical_reclaim:
        attempts = [False, True]
    else:
        attempts = [True, False]
    for borrowing in attempts:
        targets: list[Target] = []
        for wl, reason in gen.iterate(borrowing):
            ctx.snapshot.remove_workload(wl)
            targets.append(Target(wl, reason))
            if _fits(ctx, borrowing):
                targets = _fill_back(ctx, targets, borrowing)
                _restore(ctx.snapshot, targets)
                return targets
        _restore(ctx.snapshot, targets)
    return []


# -- fair sharing (fairsharing/ordering.go, strategy.go, preemption.go) -------------------


Strategy = Callable[[DRS, DRS, DRS], bool]


def less_than_or_equal_to_final_share(pnew: DRS, _told: DRS, tnew: DRS) -> bool:
    return compare_drs(pnew, tnew) <= 0


def less_than_initial_share(pnew: DRS, told: DRS, _tnew: DRS) -> bool:
    return compare_drs(pnew, told) < 0


STRATEGIES: dict[str, Strategy] = {
    LESS_THAN_OR_EQUAL_TO_FINAL_SHARE: less_than_or_equal_to_final_share,
    LESS_THAN_INITIAL_SHARE: less_than_initial_share,
}


@dataclass
class _Ordering:
    """TargetClusterQueueOrdering: the borrowing ClusterQueue with the highest share
    first, walking down from the root cohort."""

    preemptor_cq: CQNode
    targets: dict[str, list[WorkloadInfo]]
    now: float
    ancestors: set[int] = field(default_factory=set)
    pruned_cqs: set[int] = field(default_factory=set)
    pruned_cohorts: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ancestors = {id(a) for a in self.preemptor_cq.path_to_root()}

    def has_workload(self, cq: CQNode) -> bool:
        return bool(self.targets.get(cq.name))

    def pop(self, cq: CQNode) -> WorkloadInfo:
        return self.targets[cq.name].pop(0)

    def drop(self, cq: CQNode) -> None:
        self.pruned_cqs.add(id(cq))

    def iterate(self) -> Iterator[CQNode]:
        cq = self.preemptor_cq
        if cq.parent is None:
            while id(cq) not in self.pruned_cqs and self.has_workload(cq):
                yield cq
            return
        root = cq.root()
        assert isinstance(root, CohortNode)
        while id(root) not in self.pruned_cohorts:
            target = self._next(root)
            if target is not None:
                yield target

    def _next(self, cohort: CohortNode) -> CQNode | None:
        best_cq: CQNode | None = None
        best_cq_drs = NEGATIVE_DRS
        order = candidates_order(self.preemptor_cq.name, self.now)
        for cq in cohort.child_cqs:
            if id(cq) in self.pruned_cqs:
                continue
            drs = dominant_resource_share(cq)
            if (not drs.borrowing and cq is not self.preemptor_cq) or not self.has_workload(cq):
                self.pruned_cqs.add(id(cq))
            elif best_cq is not None and compare_drs(drs, best_cq_drs) == 0:
                if order(self.targets[cq.name][0]) < order(self.targets[best_cq.name][0]):
                    best_cq = cq
            elif compare_drs(drs, best_cq_drs) == 1:
                best_cq, best_cq_drs = cq, drs
        best_cohort: CohortNode | None = None
        best_cohort_drs = NEGATIVE_DRS
        for child in cohort.child_cohorts:
            if id(child) in self.pruned_cohorts:
                continue
            drs = dominant_resource_share(child)
            if not drs.borrowing and id(child) not in self.ancestors:
                self.pruned_cohorts.add(id(child))
            elif compare_drs(drs, best_cohort_drs) >= 0:
                best_cohort, best_cohort_drs = child, drs
        if best_cohort is None and best_cq is None:
            self.pruned_cohorts.add(id(cohort))
            return None
        if best_cohort is not None and compare_drs(best_cohort_drs, best_cq_drs) >= 0:
            return self._next(best_cohort)
        return best_cq

    def almost_lcas(self, target: CQNode) -> tuple[Node, Node]:
        lca = next(a for a in target.path_to_root() if id(a) in self.ancestors)
        return _almost_lca(self.preemptor_cq, lca), _almost_lca(target, lca)


def _almost_lca(cq: CQNode, lca: CohortNode) -> Node:
    node: Node = cq
    for ancestor in cq.path_to_root():
        if ancestor is lca:
            return node
        node = ancestor
    raise AssertionError("no common ancestor")


def _fits_fair(ctx: _Ctx) -> bool:
    """workloadFitsForFairSharing: the preemptor's own usage is simulated while ordering."""
    ctx.cq.remove_usage(ctx.usage)
    try:
        return _fits(ctx, True)
    finally:
        ctx.cq.add_usage(ctx.usage)


def _find_fair_candidates(ctx: _Ctx) -> list[WorkloadInfo]:
    pre = ctx.cq.spec.preemption
    out: list[WorkloadInfo] = []
    if pre.within_cluster_queue != api.NEVER:
        out += [
            w
            for w in ctx.cq.workloads.values()
            if satisfies_policy(ctx.preemptor, w, pre.within_cluster_queue) and w.uses(ctx.frs)
        ]
    if ctx.cq.parent is not None and pre.reclaim_within_cohort != api.NEVER:
        root = ctx.cq.root()
        assert isinstance(root, CohortNode)
        for other in root.subtree_cluster_queues():
            if other is ctx.cq or not any(other.borrowing(fr) for fr in ctx.frs):
                continue
            out += [
                w
                for w in other.workloads.values()
                if satisfies_policy(ctx.preemptor, w, pre.reclaim_within_cohort) and w.uses(ctx.frs)
            ]
    return out


def _group(candidates: list[WorkloadInfo]) -> dict[str, list[WorkloadInfo]]:
    out: dict[str, list[WorkloadInfo]] = {}
    for w in candidates:
        out.setdefault(w.cluster_queue or "", []).append(w)
    return out


def fair_preemptions(ctx: _Ctx, strategies: list[Strategy]) -> list[Target]:
    candidates = _find_fair_candidates(ctx)
    if not candidates:
        return []
    candidates.sort(key=candidates_order(ctx.cq.name, ctx.now))
    ctx.cq.add_usage(ctx.usage)
    targets: list[Target] = []
    retry: list[WorkloadInfo] = []
    fits = False
    try:
        fits, targets, retry = _first_strategy(ctx, candidates, strategies[0])
        if not fits and len(strategies) > 1:
            fits = _second_strategy(ctx, retry, targets)
    finally:
        ctx.cq.remove_usage(ctx.usage)
    if not fits:
        _restore(ctx.snapshot, targets)
        return []
    targets = _fill_back(ctx, targets, True)
    _restore(ctx.snapshot, targets)
    return targets


def _first_strategy(
    ctx: _Ctx, candidates: list[WorkloadInfo], strategy: Strategy
) -> tuple[bool, list[Target], list[WorkloadInfo]]:
    ordering = _Ordering(ctx.cq, _group(candidates), ctx.now)
    targets: list[Target] = []
    retry: list[WorkloadInfo] = []
    # FairSharingPreemptWithinNominal (Beta, on)
    within_nominal = not any(ctx.cq.borrowing(fr) for fr in ctx.frs)
    for cand_cq in ordering.iterate():
        if cand_cq is ctx.cq or within_nominal:
            wl = ordering.pop(cand_cq)
            ctx.snapshot.remove_workload(wl)
            reason = api.IN_CLUSTER_QUEUE if cand_cq is ctx.cq else api.IN_COHORT_RECLAMATION
            targets.append(Target(wl, reason))
            if _fits_fair(ctx):
                return True, targets, []
            continue
        p_node, t_node = ordering.almost_lcas(cand_cq)
        pnew, told = dominant_resource_share(p_node), dominant_resource_share(t_node)
        if math.isinf(pnew.weighted_share()) and not math.isinf(told.weighted_share()):
            while ordering.has_workload(cand_cq):
                retry.append(ordering.pop(cand_cq))
            continue
        while ordering.has_workload(cand_cq):
            wl = ordering.pop(cand_cq)
            cand_cq.remove_usage(wl.usage())
            tnew = dominant_resource_share(ordering.almost_lcas(cand_cq)[1])
            cand_cq.add_usage(wl.usage())
            if strategy(pnew, told, tnew):
                ctx.snapshot.remove_workload(wl)
                targets.append(Target(wl, api.IN_COHORT_FAIR_SHARING))
                if _fits_fair(ctx):
                    return True, targets, []
                break
            retry.append(wl)
    return False, targets, retry


def _second_strategy(ctx: _Ctx, retry: list[WorkloadInfo], targets: list[Target]) -> bool:
    ordering = _Ordering(ctx.cq, _group(retry), ctx.now)
    for cand_cq in ordering.iterate():
        p_node, t_node = ordering.almost_lcas(cand_cq)
        passed = less_than_initial_share(
            dominant_resource_share(p_node), dominant_resource_share(t_node), DRS()
        )
        wl = ordering.pop(cand_cq)
        if passed:
            ctx.snapshot.remove_workload(wl)
            targets.append(Target(wl, api.IN_COHORT_FAIR_SHARING))
            if _fits_fair(ctx):
                return True
        ordering.drop(cand_cq)
    return False


# -- the preemptor ---------------------------------------------------------------------------


@dataclass
class Preemptor:
    """preemption.Preemptor: classical, or fair sharing when the Configuration enables it."""

    fair_sharing: bool = False
    strategies: tuple[str, ...] = (LESS_THAN_OR_EQUAL_TO_FINAL_SHARE, LESS_THAN_INITIAL_SHARE)
    clock: Callable[[], float] = time.time

    def get_targets(
        self, wl: WorkloadInfo, assignment: Assignment, snapshot: Snapshot
    ) -> list[Target]:
        cq = snapshot.cluster_queues[wl.cluster_queue or ""]
        return self._targets(
            _Ctx(
                wl, cq, snapshot, dict(assignment.usage), assignment.need_preemption(), self.clock()
            )
        )

    def _targets(self, ctx: _Ctx) -> list[Target]:
        if self.fair_sharing:
            return fair_preemptions(ctx, [STRATEGIES[s] for s in self.strategies])
        return classical_preemptions(ctx)


@dataclass
class Oracle:
    """PreemptionOracle: would preempting make ``quantity`` of ``fr`` fit, and at what
    borrowing level afterwards."""

    preemptor: Preemptor
    snapshot: Snapshot

    def simulate_preemption(
        self, cq: CQNode, wl: WorkloadInfo, fr: FlavorResource, quantity: int
    ) -> tuple[Possibility, int]:
        ctx = _Ctx(wl, cq, self.snapshot, {fr: quantity}, {fr}, self.preemptor.clock())
        targets = self.preemptor._targets(ctx)
        if not targets:
            return Possibility.NO_CANDIDATES, find_height_of_lowest_subtree_that_fits(
                cq, fr, quantity
            )[0]
        victims = [t.workload for t in targets]
        self.snapshot.remove_usage_of(victims)
        borrow = find_height_of_lowest_subtree_that_fits(cq, fr, quantity)[0]
        self.snapshot.add_usage_of(victims)
        if any(t.workload.cluster_queue == cq.name for t in targets):
            return Possibility.PREEMPT, borrow
        return Possibility.RECLAIM, borrow
