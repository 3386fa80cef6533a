"""The scheduling cycle, flavor assignment and preemption against upstream Kueue v0.19.2
behaviour: pure functions over a snapshot, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource
from gpulab.kueue.cache import Cache, dominant_resource_share
from gpulab.kueue.flavorassigner import Assignment, FlavorAssignment, Mode, PodSetAssignment
from gpulab.kueue.model import (
    ClusterQueue,
    Cohort,
    Flavor,
    FlavorFungibility,
    PodSetResources,
    PodSetSpec,
    Preemption,
    Quota,
    ResourceGroup,
    WorkloadInfo,
)
from gpulab.kueue.preemption import Preemptor
from gpulab.kueue.queue import Head, RequeueReason
from gpulab.kueue.scheduler import Entry, Status, pending_reason, schedule

GPU = "nvidia.com/gpu"
NOW = 1_000_000.0


def cq(
    name: str,
    quotas: dict[str, int | tuple[int, int | None, int | None]],
    cohort: str | None = None,
    resource: str = GPU,
    **kw: Any,
) -> ClusterQueue:
    """A ClusterQueue covering ``resource`` with flavors in the given order; a quota is
    the nominal or (nominal, borrowingLimit, lendingLimit)."""
    q = {}
    for flavor, value in quotas.items():
        nominal, borrow, lend = value if isinstance(value, tuple) else (value, None, None)
        q[FlavorResource(flavor, resource)] = Quota(nominal, borrow, lend)
    return ClusterQueue(
        name=name,
        resource_groups=(ResourceGroup((resource,), tuple(quotas)),),
        quotas=q,
        cohort=cohort,
        **{"namespace_selector": {}, **kw},
    )


def admitted(
    name: str, queue: str, flavor: str, gpus: int, priority: int = 0, at: float = 0.0
) -> WorkloadInfo:
    return WorkloadInfo(
        namespace="ns",
        name=name,
        uid=name,
        queue_name="lq",
        total_requests=(PodSetResources("main", 1, {GPU: gpus}, {GPU: flavor}),),
        pod_sets=(PodSetSpec("main", 1),),
        priority=priority,
        cluster_queue=queue,
        admission={"clusterQueue": queue},
        quota_reserved_at=at,
    )


def pending(name: str, queue: str, gpus: int, priority: int = 0, at: float = 0.0) -> WorkloadInfo:
    return WorkloadInfo(
        namespace="ns",
        name=name,
        uid=name,
        queue_name="lq",
        total_requests=(PodSetResources("main", 1, {GPU: gpus}),),
        pod_sets=(PodSetSpec("main", 1),),
        priority=priority,
        created=at,
        queue_ts=at,
        cluster_queue=queue,
    )


def make_cache(
    queues: list[ClusterQueue],
    running: list[WorkloadInfo] = (),  # type: ignore[assignment]
    cohorts: list[Cohort] = (),  # type: ignore[assignment]
) -> Cache:
    c = Cache()
    for q in queues:
        for name in q.flavor_names():
            c.add_or_update_flavor(Flavor(name))
        c.add_or_update_cluster_queue(q)
    for co in cohorts:
        c.add_or_update_cohort(co)
    for wl in running:
        assert c.add_or_update_workload(wl)
    return c


def run(cache: Cache, *heads: WorkloadInfo, fair: bool = False) -> dict[str, Entry]:
    preemptor = Preemptor(fair_sharing=fair, clock=lambda: NOW)
    entries = schedule(
        [Head(h) for h in heads], cache.snapshot(), preemptor, lambda _ns: {}, fair_sharing=fair
    )
    return {e.info.name: e for e in entries}


def victims(e: Entry) -> set[str]:
    return {t.workload.name for t in e.targets}


# -- flavor assignment simulates preemption (flavorassigner SimulatePreemption) --------------


def test_flavor_without_preemption_candidates_ranks_below_one_that_can_preempt() -> None:
    # a100 is held by a higher-priority Workload (no candidates), h100 by a lower one.
    queue = cq("gpus", {"a100": 4, "h100": 4}, preemption=Preemption(api.LOWER_PRIORITY))
    cache = make_cache(
        [queue],
        [admitted("vip", "gpus", "a100", 4, priority=100), admitted("low", "gpus", "h100", 4)],
    )
    e = run(cache, pending("mid", "gpus", 4, priority=50))["mid"]
    assert e.preempt and e.assignment is not None
    assert e.assignment.pod_sets[0].flavors[GPU].name == "h100"
    assert victims(e) == {"low"}
    assert e.reason == api.REASON_WAITING_FOR_PREEMPTED


def test_no_candidates_anywhere_leaves_the_workload_waiting_for_quota() -> None:
    queue = cq("gpus", {"a100": 4, "h100": 4}, preemption=Preemption(api.LOWER_PRIORITY))
    cache = make_cache(
        [queue],
        [
            admitted("vip", "gpus", "a100", 4, priority=100),
            admitted("vip2", "gpus", "h100", 4, priority=100),
        ],
    )
    e = run(cache, pending("mid", "gpus", 4, priority=50))["mid"]
    assert not e.preempt and not e.targets and e.admission is None
    assert e.assignment is not None and e.assignment.mode() == Mode.PREEMPT
    assert e.reason == api.REASON_WAITING_FOR_QUOTA
    assert "insufficient unused quota for nvidia.com/gpu in flavor a100, 4 more needed" in e.message


# -- reclaim candidates are re-checked as victims are removed (candidateIsValid) --------------


def test_reclaim_skips_a_queue_that_is_back_within_nominal() -> None:
    # nominal A=4, B=4, C=0; B runs 1 + 4 GPUs, C borrows 3; A asks for 4.
    queues = [
        cq("a", {"gpu": 4}, cohort="team", preemption=Preemption(reclaim_within_cohort=api.ANY)),
        cq("b", {"gpu": 4}, cohort="team"),
        cq("c", {"gpu": 0}, cohort="team"),
    ]
    cache = make_cache(
        queues,
        [
            admitted("c-3", "c", "gpu", 3, at=NOW - 30),
            admitted("b-4", "b", "gpu", 4, at=NOW - 20),
            admitted("b-1", "b", "gpu", 1, at=NOW - 10),  # the newest: tried first
        ],
    )
    e = run(cache, pending("a-4", "a", 4))["a-4"]
    assert e.preempt
    assert victims(e) == {"b-1", "c-3"}  # not b-4: once b-1 is gone, b is within nominal
    assert {t.reason for t in e.targets} == {api.IN_COHORT_RECLAMATION}


# -- a Workload that will preempt reserves its capacity (quotaResourcesToReserve) ------------


def test_preemptor_without_candidates_reserves_its_nominal_quota_in_the_cycle() -> None:
    queues = [
        cq(
            "a",
            {"gpu": 4},
            cohort="team",
            preemption=Preemption(reclaim_within_cohort="LowerPriority"),
        ),
        cq("b", {"gpu": 4}, cohort="team"),
        cq("c", {"gpu": 0}, cohort="team"),
    ]
    # b borrows 2 GPUs of a's quota with Workloads a cannot preempt (higher priority)
    cache = make_cache(queues, [admitted("b-6", "b", "gpu", 6, priority=100)])
    entries = run(cache, pending("a-4", "a", 4, priority=10), pending("c-2", "c", 2))
    a, c = entries["a-4"], entries["c-2"]
    assert a.assignment is not None and a.assignment.mode() == Mode.PREEMPT and not a.targets
    assert c.admission is None and c.status is Status.SKIPPED
    assert c.message == "Workload no longer fits after processing another workload"


def test_reclaim_any_does_not_reserve() -> None:
    queues = [
        cq("a", {"gpu": 4}, cohort="team", preemption=Preemption(reclaim_within_cohort=api.ANY)),
        cq("b", {"gpu": 4}, cohort="team", preemption=Preemption(within_cluster_queue=api.NEVER)),
        cq("c", {"gpu": 0}, cohort="team"),
    ]
    # b borrows with a Workload a may reclaim; c's head also borrows, and fits now
    cache = make_cache(queues, [admitted("b-6", "b", "gpu", 6, priority=100)])
    entries = run(cache, pending("c-2", "c", 2))
    assert entries["c-2"].admission is not None


# -- borrowWithinCohort ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", [api.NEVER, api.LOWER_PRIORITY])
def test_borrow_within_cohort_lets_a_preemptor_reclaim_while_borrowing(policy: str) -> None:
    a = cq(
        "a",
        {"gpu": 4},
        cohort="team",
        preemption=Preemption(
            reclaim_within_cohort=api.LOWER_PRIORITY, borrow_within_cohort=policy
        ),
    )
    cache = make_cache([a, cq("b", {"gpu": 4}, cohort="team")], [admitted("b-8", "b", "gpu", 8)])
    e = run(cache, pending("a-6", "a", 6, priority=10))["a-6"]
    if policy == api.NEVER:
        assert e.assignment is not None and e.assignment.mode() == Mode.NO_FIT
        assert not e.targets
    else:
        assert victims(e) == {"b-8"}
        assert e.targets[0].reason == api.IN_COHORT_RECLAIM_WHILE_BORROWING


def test_max_priority_threshold_protects_candidates_above_it() -> None:
    a = cq(
        "a",
        {"gpu": 4},
        cohort="team",
        preemption=Preemption(
            reclaim_within_cohort=api.LOWER_PRIORITY,
            borrow_within_cohort=api.LOWER_PRIORITY,
            max_priority_threshold=5,
        ),
    )
    cache = make_cache(
        [a, cq("b", {"gpu": 4}, cohort="team")], [admitted("b-8", "b", "gpu", 8, priority=7)]
    )
    e = run(cache, pending("a-6", "a", 6, priority=10))["a-6"]
    assert not e.targets


# -- the cycle: admissions see each other, StrictFIFO, iterator order ----------------------


def test_admissions_in_one_cycle_never_exceed_quota() -> None:
    queues = [cq("a", {"gpu": 4}, cohort="t"), cq("b", {"gpu": 0}, cohort="t")]
    entries = run(make_cache(queues), pending("a-3", "a", 3), pending("b-3", "b", 3))
    assert entries["a-3"].admission is not None  # not borrowing: goes first
    assert entries["b-3"].admission is None
    assert entries["b-3"].message == "Workload no longer fits after processing another workload"


def test_admission_records_flavors_and_usage() -> None:
    entries = run(make_cache([cq("a", {"a100": 4})]), pending("w", "a", 2))
    assert entries["w"].admission == {
        "clusterQueue": "a",
        "podSetAssignments": [
            {"name": "main", "flavors": {GPU: "a100"}, "resourceUsage": {GPU: "2"}, "count": 1}
        ],
    }


def test_exceeding_the_maximum_capacity_is_no_fit_with_upstream_message() -> None:
    e = run(make_cache([cq("a", {"a100": 4})]), pending("w", "a", 5))["w"]
    assert e.assignment is not None and e.assignment.mode() == Mode.NO_FIT
    assert e.reason == api.REASON_EXCEEDS_MAX_QUOTA
    assert e.message == (
        "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in "
        "flavor a100, previously considered podsets requests (0) + current podset request (5) "
        "> maximum capacity (4)"
    )


def test_try_next_flavor_when_borrowing() -> None:
    queue = cq(
        "a",
        {"spot": 2, "on-demand": 4},
        cohort="t",
        fungibility=FlavorFungibility(when_can_borrow=api.TRY_NEXT_FLAVOR),
    )
    lender = cq("b", {"spot": 4, "on-demand": 0}, cohort="t")
    e = run(make_cache([queue, lender]), pending("w", "a", 3))["w"]
    assert e.assignment is not None
    assert e.assignment.pod_sets[0].flavors[GPU].name == "on-demand"  # fits without borrowing


def test_may_stop_search_borrows_in_the_first_flavor() -> None:
    queue = cq("a", {"spot": 2, "on-demand": 4}, cohort="t")
    lender = cq("b", {"spot": 4, "on-demand": 0}, cohort="t")
    e = run(make_cache([queue, lender]), pending("w", "a", 3))["w"]
    assert e.assignment is not None and e.assignment.pod_sets[0].flavors[GPU].name == "spot"
    assert e.assignment.borrowing == 1


def test_inactive_and_mismatched_queues_are_inadmissible() -> None:
    queue = cq("a", {"missing": 4})
    cache = Cache()
    cache.add_or_update_cluster_queue(queue)
    e = run(cache, pending("w", "a", 1))["w"]
    assert (e.reason, e.message) == (api.REASON_SUSPENDED, "ClusterQueue a is inactive")
    assert e.requeue_reason is RequeueReason.GENERIC

    selective = cq("b", {"a100": 4}, namespace_selector={"matchLabels": {"team": "b"}})
    e = run(make_cache([selective]), pending("w", "b", 1))["w"]
    assert (e.reason, e.message) == (
        api.REASON_MISCONFIGURED,
        "workload namespace doesn't match ClusterQueue selector",
    )
    assert e.requeue_reason is RequeueReason.NAMESPACE_MISMATCH
    assert e.assignment is None and e.admission is None

    e = run(make_cache([selective]), pending("w", "gone", 1))["w"]
    assert (e.reason, e.message) == (api.REASON_MISCONFIGURED, "ClusterQueue gone not found")


# -- hierarchical cohorts with quota at the cohort level -----------------------------------


def test_cohort_quota_is_borrowable_by_its_queues() -> None:
    org = Cohort(
        "org",
        resource_groups=(ResourceGroup((GPU,), ("gpu",)),),
        quotas={FlavorResource("gpu", GPU): Quota(8)},
    )
    team = Cohort("team", parent="org")
    cache = make_cache([cq("a", {"gpu": 2}, cohort="team")], cohorts=[org, team])
    node = cache.snapshot().cluster_queues["a"]
    assert node.available(FlavorResource("gpu", GPU)) == 10
    entries = run(cache, pending("w", "a", 10))
    assert entries["w"].admission is not None
    assert entries["w"].assignment is not None and entries["w"].assignment.borrowing == 2


def test_lending_limit_keeps_quota_local() -> None:
    queues = [cq("a", {"gpu": (4, None, 1)}, cohort="t"), cq("b", {"gpu": 0}, cohort="t")]
    cache = make_cache(queues)
    assert cache.snapshot().cluster_queues["b"].available(FlavorResource("gpu", GPU)) == 1


# -- fair sharing ------------------------------------------------------------------------------


def test_fair_sharing_admits_the_queue_with_the_lower_share_first() -> None:
    queues = [
        cq("a", {"gpu": 2}, cohort="t"),
        cq("b", {"gpu": 2}, cohort="t"),
        cq("pool", {"gpu": 4}, cohort="t"),
    ]
    # a already borrows 2; both heads need to borrow 2, only one can
    cache = make_cache(queues, [admitted("a-4", "a", "gpu", 4)])
    entries = run(cache, pending("a-2", "a", 2, at=1), pending("b-4", "b", 4, at=2), fair=True)
    assert entries["b-4"].admission is not None
    assert entries["a-2"].admission is None


def test_fair_sharing_preemptor_within_nominal_takes_back_only_what_it_needs() -> None:
    """FairSharingPreemptWithinNominal: a preemptor within its nominal quota reclaims
    without the strategies (InCohortReclamation); the strategies and the ordering by
    share are test_fair_sharing_preemption_as_upstream's."""
    fair = Preemption(reclaim_within_cohort=api.ANY)
    queues = [cq("a", {"gpu": 4}, cohort="t", preemption=fair), cq("b", {"gpu": 4}, cohort="t")]
    running = [admitted(f"b-{i}", "b", "gpu", 2, at=NOW - i) for i in range(4)]
    cache = make_cache(queues, running)
    share = dominant_resource_share(cache.snapshot().cluster_queues["b"])
    assert share.borrowing and share.rounded() == 500  # b borrows 4 of the 8 lendable
    e = run(cache, pending("a-4", "a", 4), fair=True)["a-4"]
    assert len(e.targets) == 2  # 4 GPUs back, no more
    assert {t.reason for t in e.targets} == {api.IN_COHORT_RECLAMATION}


# -- why a Workload fits nowhere (resolveNoFitReason) -------------------------------------


def test_a_resource_the_cluster_queue_does_not_cover_is_no_matching_flavor() -> None:
    """No flavor was tried: NoMatchingFlavor, not WaitingForQuota (no quota will come)."""
    typo = WorkloadInfo(
        namespace="ns",
        name="w",
        uid="w",
        queue_name="lq",
        total_requests=(PodSetResources("main", 1, {"nvidia.com/gpus": 1}),),
        pod_sets=(PodSetSpec("main", 1),),
        cluster_queue="a",
    )
    e = run(make_cache([cq("a", {"a100": 4})]), typo)["w"]
    assert e.assignment is not None and e.assignment.mode() == Mode.NO_FIT
    assert (e.reason, e.message) == (
        api.REASON_NO_MATCHING_FLAVOR,
        "couldn't assign flavors to pod set main: resource nvidia.com/gpus unavailable in "
        "ClusterQueue",
    )
    assert pending_reason(e, granular=True) == api.REASON_NO_MATCHING_FLAVOR


def test_a_typo_after_an_assigned_resource_reads_pending() -> None:
    """The GPU got a100 first, so the pod set has a Fit attempt and none NoFit:
    resolveNoFitReason finds no reason. Upstream writes that empty reason (the API
    server refuses it); the lab writes Pending (docs/kueue.md, Bad input)."""
    typo = pending("w", "a", 1)
    typo.total_requests = (PodSetResources("main", 1, {GPU: 1, "nvidia.com/gpus": 1}),)
    e = run(make_cache([cq("a", {"a100": 4})]), typo)["w"]
    assert e.assignment is not None and e.assignment.mode() == Mode.NO_FIT
    assert e.reason == ""
    assert e.message == (
        "couldn't assign flavors to pod set main: resource nvidia.com/gpus unavailable in "
        "ClusterQueue"
    )
    assert pending_reason(e, granular=True) == api.PENDING
    assert pending_reason(e, granular=False) == api.PENDING


def test_the_least_severe_flavor_of_a_resource_group_names_the_reason() -> None:
    """a100 can never hold 4 GPUs (ExceedsMaxQuota) but h100 can once the lender's
    Workload ends (WaitingForQuota): the learner is told to wait, as upstream does."""
    queues = [
        cq("a", {"a100": 2, "h100": 2}, cohort="t"),
        cq("b", {"a100": 0, "h100": 6}, cohort="t"),
    ]
    cache = make_cache(queues, [admitted("b-6", "b", "h100", 6)])
    e = run(cache, pending("w", "a", 4))["w"]
    assert e.assignment is not None and e.assignment.mode() == Mode.NO_FIT
    assert e.reason == api.REASON_WAITING_FOR_QUOTA
    assert "insufficient quota for nvidia.com/gpu in flavor a100" in e.message
    assert "insufficient unused quota for nvidia.com/gpu in flavor h100, 2 more needed" in e.message


def test_across_resource_groups_the_most_severe_reason_wins() -> None:
    """Two resource groups are co-requisites: the GPU group finds a100 after h100 is
    WaitingForQuota (the lender's h100 is in use), then the cpu group's only flavor can
    never hold 2 CPUs (ExceedsMaxQuota). resolveNoFitReason takes the least severe
    reason within a group and the most severe across groups: ExceedsMaxQuota. The GPU
    is requested first, the order upstream tries them in too (resources sorted by
    FNV-1a hash under VectorizedResourceRequests, Beta and on in v0.19)."""

    def two_groups(name: str, h100: int, a100: int, cpus: int) -> ClusterQueue:
        return ClusterQueue(
            name=name,
            resource_groups=(
                ResourceGroup((GPU,), ("h100", "a100")),
                ResourceGroup(("cpu",), ("default",)),
            ),
            quotas={
                FlavorResource("h100", GPU): Quota(h100),
                FlavorResource("a100", GPU): Quota(a100),
                FlavorResource("default", "cpu"): Quota(cpus),
            },
            cohort="t",
            namespace_selector={},
        )

    queues = [two_groups("a", 0, 4, 1000), two_groups("b", 4, 0, 0)]
    cache = make_cache(queues, [admitted("b-4", "b", "h100", 4)])
    wl = pending("w", "a", 2)
    wl.total_requests = (PodSetResources("main", 1, {GPU: 2, "cpu": 2000}),)
    e = run(cache, wl)["w"]
    assert e.assignment is not None and e.assignment.mode() == Mode.NO_FIT
    attempts = {
        a.flavor: (a.mode, a.no_fit_reason) for a in e.assignment.pod_sets[0].attempts.values()
    }
    assert attempts == {
        "h100": (Mode.NO_FIT, api.REASON_WAITING_FOR_QUOTA),
        "a100": (Mode.FIT, ""),
        "default": (Mode.NO_FIT, api.REASON_EXCEEDS_MAX_QUOTA),
    }
    assert e.reason == api.REASON_EXCEEDS_MAX_QUOTA
    assert "insufficient quota for cpu in flavor default" in e.message


# -- a ClusterQueue covering pods (flavorassigner.go assignFlavors) -------------------------


def test_a_cluster_queue_covering_pods_counts_them() -> None:
    pods = ClusterQueue(
        name="a",
        resource_groups=(ResourceGroup((GPU, api.PODS), ("a100",)),),
        quotas={FlavorResource("a100", GPU): Quota(8), FlavorResource("a100", api.PODS): Quota(3)},
        namespace_selector={},
    )
    two = admitted("two-pods", "a", "a100", 2)
    two.total_requests = (
        PodSetResources("main", 2, {GPU: 2, api.PODS: 2}, {GPU: "a100", api.PODS: "a100"}),
    )
    cache = make_cache([pods], [two])

    def pods_of(name: str, count: int) -> WorkloadInfo:
        wl = pending(name, "a", count)
        wl.total_requests = (PodSetResources("main", count, {GPU: count}),)
        wl.pod_sets = (PodSetSpec("main", count),)
        return wl

    e = run(cache, pods_of("more", 2))["more"]
    assert e.admission is None
    assert e.message == (
        "couldn't assign flavors to pod set main: insufficient unused quota for pods in "
        "flavor a100, 1 more needed"
    )
    e = run(cache, pods_of("one", 1))["one"]
    assert e.admission is not None
    assert e.admission["podSetAssignments"][0]["resourceUsage"] == {GPU: "1", api.PODS: "1"}


# -- fair sharing preemption: strategies and ordering (preemption_fair_test.go) -------------


def cpu_admitted(name: str, queue: str, millis: int, priority: int = 0) -> WorkloadInfo:
    wl = admitted(name, queue, "default", 0, priority)
    wl.total_requests = (PodSetResources("main", 1, {"cpu": millis}, {"cpu": "default"}),)
    return wl


FAIR_CASES: dict[str, tuple[Any, ...]] = {
    # upstream case name: (admitted (name, queue, millicores, priority), incoming
    # (queue, millicores), strategies, expected {victim: reason}[, quota of the
    # "preemptible" queue in millicores, 0 when left out])
    "reclaim borrowable quota from user using the most": (
        [(f"a{i}", "a", 1000, 0) for i in (1, 2, 3)]
        + [(f"b{i}", "b", 1000, 0) for i in (1, 2, 3, 4, 5)]
        + [("c1", "c", 1000, 0)],
        ("a", 1000),
        (),
        {"b1": api.IN_COHORT_FAIR_SHARING},
    ),
    "can't preempt when it would switch the imbalance": (
        [(f"a{i}", "a", 1000, 0) for i in (1, 2, 3)]
        + [(f"b{i}", "b", 1000, 0) for i in (1, 2, 3, 4, 5)],
        ("a", 2000),
        (),
        {},
    ),
    "preempt lower priority first, even if big": (
        [("a1", "a", 3000, 0), ("b_low", "b", 5000, 0), ("b_high", "b", 1000, 1)],
        ("a", 1000),
        ("LessThanInitialShare",),
        {"b_low": api.IN_COHORT_FAIR_SHARING},
    ),
    "preempt workload that doesn't transfer the imbalance, even if high priority": (
        [("a1", "a", 3000, 0), ("b_low", "b", 5000, 0), ("b_high", "b", 1000, 1)],
        ("a", 1000),
        ("LessThanOrEqualToFinalShare",),
        {"b_high": api.IN_COHORT_FAIR_SHARING},
    ),
    "prefer to preempt workloads that don't make the target CQ have the biggest share": (
        [("b1", "b", 2000, 0), ("b2", "b", 1000, 0), ("b3", "b", 2000, 0), ("c1", "c", 1000, 0)],
        ("a", 3500),
        (),
        {"b2": api.IN_COHORT_FAIR_SHARING},
    ),
    "preempt from different cluster queues if the end result has a smaller max share": (
        [("b1", "b", 2000, 0), ("b2", "b", 2500, 0), ("c1", "c", 2000, 0), ("c2", "c", 2500, 0)],
        ("a", 3500),
        (),
        {"b1": api.IN_COHORT_FAIR_SHARING, "c1": api.IN_COHORT_FAIR_SHARING},
    ),
    # The lab's own case in upstream's setting: b and c both borrow from the lender
    # ("preemptible", 6 CPUs), b more (3 CPUs above nominal against c's 2), and either victim
    # alone satisfies LessThanOrEqualToFinalShare; TargetClusterQueueOrdering
    # (fairsharing/ordering.go nextTarget) visits the highest share first, so b1 goes.
    "take from the queue borrowing the most when two borrow": (
        [(f"a{i}", "a", 1000, 0) for i in (1, 2, 3)]
        + [(f"b{i}", "b", 1000, 0) for i in range(1, 7)]
        + [(f"c{i}", "c", 1000, 0) for i in range(1, 6)],
        ("a", 1000),
        (),
        {"b1": api.IN_COHORT_FAIR_SHARING},
        6000,
    ),
}


@pytest.mark.parametrize("case", list(FAIR_CASES))
def test_fair_sharing_preemption_as_upstream(case: str) -> None:
    """Cases of upstream's TestFairPreemptions: queues a, b, c (3 CPUs each, reclaim Any,
    borrowWithinCohort LowerPriority below -3) and "preemptible" (0 unless the case gives
    a quota) in one cohort; the preemptor borrows, so the strategies decide and the
    borrowing queues are tried in order of share. The snapshot is unchanged afterwards."""
    running, (queue, millis), strategies, want, *rest = FAIR_CASES[case]
    lender_quota = rest[0] if rest else 0
    policy = Preemption(api.LOWER_PRIORITY, api.ANY, api.LOWER_PRIORITY, -3)
    queues = [
        cq(name, {"default": 3000}, cohort="all", resource="cpu", preemption=policy)
        for name in ("a", "b", "c")
    ]
    queues.append(cq("preemptible", {"default": lender_quota}, cohort="all", resource="cpu"))
    cache = make_cache(queues, [cpu_admitted(*r) for r in running])
    snapshot = cache.snapshot()

    def usage() -> dict[str, dict[FlavorResource, int]]:
        return {
            n: {k: v for k, v in q.usage.items() if v} for n, q in snapshot.cluster_queues.items()
        }

    before = usage()
    incoming = pending("incoming", queue, 0)
    incoming.total_requests = (PodSetResources("main", 1, {"cpu": millis}),)
    fr = FlavorResource("default", "cpu")
    assignment = Assignment(
        pod_sets=[
            PodSetAssignment(
                "main",
                1,
                {"cpu": millis},
                {"cpu": FlavorAssignment("default", Mode.PREEMPT)},
                ["preempt"],
            )
        ],
        usage={fr: millis},
    )
    preemptor = Preemptor(fair_sharing=True, clock=lambda: NOW)
    if strategies:
        preemptor.strategies = strategies
    targets = preemptor.get_targets(incoming, assignment, snapshot)
    assert {t.workload.name: t.reason for t in targets} == want
    assert usage() == before
