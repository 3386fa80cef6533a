"""One scheduling cycle: the heads of the ClusterQueues in, a decision per head out.
Pure: it works on a snapshot and returns what to write; ``controllers/scheduler.py``
does the writing.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/scheduler/scheduler.go ``schedule``:
1. ``Heads`` (queue manager) and a cache ``Snapshot`` (the caller's);
2. ``nominate``: a head whose ClusterQueue is inactive, missing or does not select its
   namespace, whose admission checks failed, or whose resources fail
   ``ValidateAdmissibility`` (a request above its limit, outside the namespace's
   LimitRange: resources.py) is inadmissible; the others get a
   flavor assignment (``getAssignments`` → flavorassigner ``Assign``, and preemption
   targets from ``Preemptor.GetTargets`` when the assignment needs preemption);
3. the iterator: classical (``makeClassicalIterator``: not borrowing first, then
   priority, then FIFO) or, with fair sharing, the DominantResourceShare tournament
   of fair_sharing_iterator.go;
4. ``processEntry``, in that order, against the snapshot: NoFit; Preempt without
   candidates reserves capacity (``quotaResourcesToReserve``) unless the ClusterQueue
   can always reclaim; overlapping targets or "no longer fits" skip; otherwise the
   entry's usage is added to the snapshot, so later entries of the cycle see it, and
   the entry either preempts (its targets) or is admitted (``admit``);
5. ``requeueAndUpdate`` for everything not admitted (the caller).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource
from gpulab.kueue.cache import (
    DRS,
    CohortNode,
    CQNode,
    Snapshot,
    compare_drs,
    dominant_resource_share,
)
from gpulab.kueue.flavorassigner import Assignment, Mode, assign_flavors
from gpulab.kueue.model import LastAssignment, WorkloadInfo, selector_matches
from gpulab.kueue.preemption import Oracle, Preemptor, Target
from gpulab.kueue.queue import Head, RequeueReason
from gpulab.kueue.resources import admissibility_error

LimitRanges = Callable[[str], Sequence[Mapping[str, Any]]]


class Status(enum.Enum):
    NOT_NOMINATED = ""
    SKIPPED = "skipped"
    NOMINATED = "nominated"


@dataclass
class Entry:
    """scheduler.entry: a head and what this cycle decided for it."""

    head: Head
    cq: CQNode | None = None
    assignment: Assignment | None = None
    targets: list[Target] = field(default_factory=list)
    status: Status = Status.NOT_NOMINATED
    message: str = ""
    requeue_reason: RequeueReason = RequeueReason.GENERIC
    reason: str = ""  # the granular QuotaReserved=False reason
    admission: dict[str, Any] | None = None  # set when the entry is to be admitted
    preempt: bool = False  # issue preemptions for ``targets``

    @property
    def info(self) -> WorkloadInfo:
        return self.head.info

    def mark_skipped(self, message: str) -> None:
        self.status = Status.SKIPPED
        self.message = message

    def usage(self) -> dict[FlavorResource, int]:
        return dict(self.assignment.usage) if self.assignment else {}


def last_assignment_outdated(last: LastAssignment, generation: int, cycle: int) -> bool:
    """An assignment of this or the previous cycle is kept; older ones only while the
    ClusterQueue's generation has not moved (FlavorFungibilityPreserveScanProgress)."""
    if cycle - last.cycle <= 1:
        return False
    return generation > last.cq_generation


def get_assignments(
    wl: WorkloadInfo, snapshot: Snapshot, preemptor: Preemptor, fair_sharing: bool, cycle: int
) -> tuple[Assignment, list[Target]]:
    cq = snapshot.cluster_queues[wl.cluster_queue or ""]
    if wl.last_assignment and last_assignment_outdated(wl.last_assignment, cq.generation, cycle):
        wl.last_assignment = None
    oracle = Oracle(preemptor, snapshot)
    assignment = assign_flavors(wl, cq, snapshot.flavors, oracle, fair_sharing, cycle)
    if assignment.mode() == Mode.PREEMPT:
        targets = preemptor.get_targets(wl, assignment, snapshot)
        if targets:
            return assignment, targets
    return assignment, []


def _failed_checks(wl: WorkloadInfo) -> bool:
    states = {c.get("state") for c in (wl.obj.get("status") or {}).get("admissionChecks") or []}
    return bool(states & {api.CHECK_RETRY, api.CHECK_REJECTED})


def nominate(
    heads: list[Head],
    snapshot: Snapshot,
    preemptor: Preemptor,
    namespace_labels: Callable[[str], Mapping[str, str] | None],
    is_added: Callable[[str], bool],
    fair_sharing: bool,
    cycle: int,
    limit_ranges: LimitRanges,
) -> tuple[list[Entry], list[Entry]]:
    entries: list[Entry] = []
    inadmissible: list[Entry] = []
    for h in heads:
        wl = h.info
        e = Entry(h, snapshot.cluster_queues.get(wl.cluster_queue or ""))
        if is_added(wl.key):
            continue  # already accounted in the cache
        if _failed_checks(wl):
            e.message, e.reason = (
                "The workload has failed admission checks",
                api.REASON_PENDING_EVALUATION,
            )
        elif wl.cluster_queue in snapshot.inactive:
            e.message = f"ClusterQueue {wl.cluster_queue} is inactive"
            e.reason = api.REASON_SUSPENDED
        elif e.cq is None:
            e.message = f"ClusterQueue {wl.cluster_queue} not found"
            e.reason = api.REASON_MISCONFIGURED
        elif (labels := namespace_labels(wl.namespace)) is None:
            e.message = f'workload namespace "{wl.namespace}" does not exist'
            e.reason = api.REASON_MISCONFIGURED
        elif not selector_matches(e.cq.spec.namespace_selector, labels):
            e.message = "workload namespace doesn't match ClusterQueue selector"
            e.reason = api.REASON_MISCONFIGURED
            e.requeue_reason = RequeueReason.NAMESPACE_MISMATCH
        elif (problem := admissibility_error(wl.obj, limit_ranges(wl.namespace))) is not None:
            e.message, e.reason = problem, api.REASON_MISCONFIGURED
        else:
            e.assignment, e.targets = get_assignments(wl, snapshot, preemptor, fair_sharing, cycle)
            e.message = e.assignment.message()
            wl.last_assignment = e.assignment.last_state
            entries.append(e)
            continue
        inadmissible.append(e)
    return entries, inadmissible


# -- iterators --------------------------------------------------------------------------------


def classical_order(entries: list[Entry]) -> list[Entry]:
    """makeClassicalIterator: lower borrowing level first, then higher priority
    (PrioritySortingWithinCohort), then FIFO on the queue-order timestamp."""
    return sorted(
        entries,
        key=lambda e: (
            e.assignment.borrowing if e.assignment else 0,
            -e.info.priority,
            e.info.queue_ts,
        ),
    )


def fair_sharing_order(entries: list[Entry]) -> Iterator[Entry]:
    """fairSharingIterator: per root cohort, a tournament on DominantResourceShare
    computed as if each entry's usage were added, recomputed after every pop."""
    remaining: dict[int, Entry] = {id(e.cq): e for e in entries}
    while remaining:
        first = next(iter(remaining.values()))
        assert first.cq is not None
        if first.cq.parent is None:
            yield remaining.pop(id(first.cq))
            continue
        root = first.cq.root()
        assert isinstance(root, CohortNode)
        drs, requested = _compute_drs(root, remaining)
        winner = _tournament(root, remaining, drs, requested)
        assert winner is not None and winner.cq is not None
        yield remaining.pop(id(winner.cq))


def _compute_drs(
    root: CohortNode, remaining: Mapping[int, Entry]
) -> tuple[dict[tuple[str, str], DRS], dict[str, dict[FlavorResource, int]]]:
    drs: dict[tuple[str, str], DRS] = {}
    requested: dict[str, dict[FlavorResource, int]] = {}
    for cq in root.subtree_cluster_queues():
        e = remaining.get(id(cq))
        if e is None:
            continue
        usage = e.usage()
        requested[e.info.key] = usage
        cq.add_usage(usage)
        share = dominant_resource_share(cq)
        for ancestor in cq.path_to_root():
            drs[(ancestor.name, e.info.key)] = share
            share = dominant_resource_share(ancestor)
        cq.remove_usage(usage)
    return drs, requested


def _tournament(
    cohort: CohortNode,
    remaining: Mapping[int, Entry],
    drs: Mapping[tuple[str, str], DRS],
    requested: Mapping[str, Mapping[FlavorResource, int]],
) -> Entry | None:
    candidates = [
        c
        for child in cohort.child_cohorts
        if (c := _tournament(child, remaining, drs, requested)) is not None
    ]
    candidates += [remaining[id(cq)] for cq in cohort.child_cqs if id(cq) in remaining]
    if not candidates:
        return None

    def less(a: Entry, b: Entry) -> bool:
        da, db = drs[(cohort.name, a.info.key)], drs[(cohort.name, b.info.key)]
        ba = da.borrowing_on(requested[a.info.key])
        bb = db.borrowing_on(requested[b.info.key])
        if ba != bb:  # FairSharingPrioritizeNonBorrowing (Beta, on)
            return not ba
        if (c := compare_drs(da, db)) != 0:
            return c < 0
        if a.info.priority != b.info.priority:
            return a.info.priority > b.info.priority
        return a.info.queue_ts < b.info.queue_ts

    best = candidates[0]
    for current in candidates[1:]:
        if less(current, best):
            best = current
    return best


# -- processEntry ---------------------------------------------------------------------------


def quota_to_reserve(e: Entry, cq: CQNode) -> dict[FlavorResource, int]:
    """quotaResourcesToReserve: what a Workload that must preempt but has no candidates
    holds back this cycle, so lower-priority Workloads behind it do not take it."""
    assert e.assignment is not None
    if e.assignment.mode() != Mode.PREEMPT:
        return e.usage()
    out: dict[FlavorResource, int] = {}
    for fr, usage in e.assignment.usage.items():
        quota = cq.quota(fr)
        used = cq.usage.get(fr, 0)
        if e.assignment.borrowing > 0:
            if quota.borrowing_limit is None:
                out[fr] = usage
            else:
                out[fr] = min(usage, quota.nominal + quota.borrowing_limit - used)
        else:
            out[fr] = max(0, min(usage, quota.nominal - used))
    return out


def _fits(
    snapshot: Snapshot,
    cq: CQNode,
    usage: Mapping[FlavorResource, int],
    preempted: Mapping[str, WorkloadInfo],
    targets: list[Target],
) -> bool:
    merged = dict(preempted)
    merged.update({t.workload.key: t.workload for t in targets})
    victims = list(merged.values())
    snapshot.remove_usage_of(victims)
    try:
        return cq.fits(usage)
    finally:
        snapshot.add_usage_of(victims)


def process_entry(e: Entry, snapshot: Snapshot, preempted: dict[str, WorkloadInfo]) -> None:
    cq, assignment = e.cq, e.assignment
    assert cq is not None and assignment is not None
    usage = e.usage()
    fits = _fits(snapshot, cq, usage, preempted, e.targets)
    mode = assignment.mode()
    if mode == Mode.NO_FIT:
        e.requeue_reason = RequeueReason.NO_FIT
        e.reason = assignment.no_fit_reason
        return
    if mode == Mode.PREEMPT and not e.targets:
        e.requeue_reason = RequeueReason.PREEMPTION_NO_CANDIDATES
        e.reason = api.REASON_WAITING_FOR_QUOTA
        # reserveCapacityForUnreclaimablePreempt (CanAlwaysReclaim: reclaimWithinCohort Any)
        if cq.spec.preemption.reclaim_within_cohort != api.ANY:
            cq.add_usage(quota_to_reserve(e, cq))
        return
    if any(t.workload.key in preempted for t in e.targets):
        e.mark_skipped("Workload has overlapping preemption targets with another workload")
        e.reason = api.REASON_WAITING_FOR_QUOTA
        return
    if not fits:
        e.mark_skipped("Workload no longer fits after processing another workload")
        e.reason = api.REASON_WAITING_FOR_QUOTA
        return
    preempted.update({t.workload.key: t.workload for t in e.targets})
    cq.add_usage(usage)
    if mode == Mode.PREEMPT:
        e.reason = api.REASON_WAITING_FOR_PREEMPTED
        e.preempt = True
        return
    e.status = Status.NOMINATED
    e.admission = assignment.to_admission(cq.name)


def schedule(
    heads: list[Head],
    snapshot: Snapshot,
    preemptor: Preemptor,
    namespace_labels: Callable[[str], Mapping[str, str] | None],
    is_added: Callable[[str], bool] = lambda _key: False,
    fair_sharing: bool = False,
    cycle: int = 0,
    limit_ranges: LimitRanges = lambda _ns: (),
) -> list[Entry]:
    """Decide for the heads; ``snapshot`` ends up with the usage of what was admitted,
    preempted for, or reserved. ``limit_ranges`` gives a namespace's LimitRanges."""
    entries, inadmissible = nominate(
        heads, snapshot, preemptor, namespace_labels, is_added, fair_sharing, cycle, limit_ranges
    )
    order: Iterator[Entry] | list[Entry] = (
        fair_sharing_order(entries) if fair_sharing else classical_order(entries)
    )
    preempted: dict[str, WorkloadInfo] = {}
    for e in order:
        process_entry(e, snapshot, preempted)
    return entries + inadmissible


def pending_reason(e: Entry, granular: bool) -> str:
    """The QuotaReserved=False reason written for an entry not admitted
    (UnadmittedWorkloadReasonWithFallback). Lab difference: a NoFit with no reason (a
    pod set whose flavors fit for one resource, none covering the next) reads
    ``Pending``; upstream writes an empty reason, which the API server rejects."""
    return (e.reason or api.PENDING) if granular else api.PENDING
