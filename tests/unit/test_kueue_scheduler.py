"""The scheduling cycle, flavor assignment and preemption against upstream Kueue v0.19.2
behaviour: pure functions over a snapshot, no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource
from gpulab.kueue.cache import Cache, dominant_resource_share
from gpulab.kueue.flavorassigner import Mode
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
from gpulab.kueue.queue import Head
from gpulab.kueue.scheduler import Entry, Status, schedule

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
        namespace_selector={},
        **kw,
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


def test_fair_sharing_preemption_takes_from_the_highest_share() -> None:
    fair = Preemption(reclaim_within_cohort=api.ANY)
    queues = [cq("a", {"gpu": 4}, cohort="t", preemption=fair), cq("b", {"gpu": 4}, cohort="t")]
    running = [admitted(f"b-{i}", "b", "gpu", 2, at=NOW - i) for i in range(4)]
    cache = make_cache(queues, running)
    share = dominant_resource_share(cache.snapshot().cluster_queues["b"])
    assert share.borrowing and share.rounded() == 500  # b borrows 4 of the 8 lendable
    e = run(cache, pending("a-4", "a", 4), fair=True)["a-4"]
    assert len(e.targets) == 2  # 4 GPUs back, no more
    assert {t.reason for t in e.targets} == {api.IN_COHORT_RECLAMATION}
