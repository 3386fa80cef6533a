"""Admission decisions of gpulab.kueue.scheduler over gpulab.kueue.cache (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest

from gpulab.kueue import api, cache, model
from gpulab.kueue.api import FlavorResource
from gpulab.kueue.scheduler import (
    Mode,
    Outcome,
    assign_flavors,
    find_preemption_targets,
    schedule,
)

ALL_NS: dict[str, Any] = {}


def cq(
    name: str,
    flavors: list[tuple[str, dict[str, Any]]],
    *,
    resources: tuple[str, ...] = ("cpu",),
    **spec: Any,
) -> model.ClusterQueue:
    """A ClusterQueue with one resource group; quotas as {resource: nominal | dict}."""
    fqs = []
    for flavor, quotas in flavors:
        rs = []
        for r in resources:
            q = quotas[r]
            rs.append({"name": r, **(q if isinstance(q, dict) else {"nominalQuota": q})})
        fqs.append({"name": flavor, "resources": rs})
    obj = {
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": list(resources), "flavors": fqs}],
            **spec,
        },
    }
    return model.cluster_queue_from_obj(obj)


def wl(
    name: str,
    cpu: str,
    *,
    queue: str = "cq",
    priority: int = 0,
    created: str = "2026-01-01T00:00:00Z",
    count: int = 1,
    admitted_flavor: str | None = None,
    reserved_at: str = "2026-01-01T00:00:10Z",
    selector: dict[str, str] | None = None,
) -> model.WorkloadInfo:
    obj: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
        },
        "spec": {
            "queueName": "user-queue",
            "priority": priority,
            "podSets": [
                {
                    "name": "main",
                    "count": count,
                    "template": {
                        "spec": {
                            "nodeSelector": selector or {},
                            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
                        }
                    },
                }
            ],
        },
    }
    if admitted_flavor:
        total = api.format_quantity(api.quantity(cpu) * count)
        obj["status"] = {
            "admission": {
                "clusterQueue": queue,
                "podSetAssignments": [
                    {
                        "name": "main",
                        "flavors": {"cpu": admitted_flavor},
                        "resourceUsage": {"cpu": total},
                        "count": count,
                    }
                ],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": reserved_at}
            ],
        }
    return model.workload_from_obj(obj, cluster_queue=queue)


def flavors(*names: str, **specs: dict[str, Any]) -> list[model.Flavor]:
    out = [model.Flavor(n) for n in names]
    out += [model.flavor_from_obj({"metadata": {"name": n}, "spec": s}) for n, s in specs.items()]
    return out


def make_cache(
    cqs: list[model.ClusterQueue],
    fl: list[model.Flavor],
    admitted: Sequence[model.WorkloadInfo] = (),
) -> cache.Cache:
    """The cache as the manager rebuilds it on start: flavors, queues, admitted Workloads."""
    c = cache.Cache()
    for f in fl:
        c.add_or_update_flavor(f)
    for q in cqs:
        c.add_or_update_cluster_queue(q)
    for w in admitted:
        c.add_workload(w)
    return c


def CPU(flavor: str) -> FlavorResource:
    return FlavorResource(flavor, "cpu")


def test_admits_until_nominal_quota_then_waits_for_quota() -> None:
    c = make_cache([cq("cq", [("default-flavor", {"cpu": 9})])], flavors("default-flavor"))
    pending = [wl(f"w{i}", "3", created=f"2026-01-01T00:00:0{i}Z") for i in range(4)]
    decisions = {d.workload.name: d for d in schedule(pending, c, ALL_NS)}
    assert [decisions[f"w{i}"].outcome for i in range(4)] == [Outcome.ADMIT] * 3 + [Outcome.PENDING]
    assert c.used("cq", CPU("default-flavor")) == 9
    assert decisions["w3"].reason == api.REASON_WAITING_FOR_QUOTA
    assert decisions["w3"].message == (
        "couldn't assign flavors to pod set main: insufficient unused quota for cpu in flavor "
        "default-flavor, 3 more needed"
    )
    adm = decisions["w0"].admission
    assert adm == {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {
                "name": "main",
                "flavors": {"cpu": "default-flavor"},
                "resourceUsage": {"cpu": "3"},
                "count": 1,
            }
        ],
    }


def test_request_over_maximum_capacity_is_exceeds_max_quota() -> None:
    c = make_cache([cq("cq", [("default-flavor", {"cpu": 9})])], flavors("default-flavor"))
    [d] = schedule([wl("big", "500m", count=20)], c, ALL_NS)
    assert d.outcome is Outcome.PENDING
    assert d.reason == api.REASON_EXCEEDS_MAX_QUOTA
    assert "current podset request (10) > maximum capacity (9)" in d.message


def test_flavors_are_tried_in_order() -> None:
    queue = cq("cq", [("on-demand", {"cpu": 2}), ("spot", {"cpu": 10})])
    c = make_cache([queue], flavors("on-demand", "spot"))
    assert assign_flavors(wl("a", "2"), queue, c).flavors == {"main": {"cpu": "on-demand"}}
    assert assign_flavors(wl("b", "3"), queue, c).flavors == {"main": {"cpu": "spot"}}
    # Once on-demand is used up, the next Workload goes to spot.
    decisions = schedule([wl("a", "2"), wl("b", "2", created="2026-01-01T00:00:01Z")], c, ALL_NS)
    assert [d.admission["podSetAssignments"][0]["flavors"]["cpu"] for d in decisions] == [
        "on-demand",
        "spot",
    ]


def test_untolerated_taint_and_node_selector_skip_a_flavor() -> None:
    queue = cq("cq", [("spot", {"cpu": 10}), ("on-demand", {"cpu": 10})])
    spot = {
        "nodeLabels": {"instance-type": "spot"},
        "nodeTaints": [{"key": "spot", "value": "true", "effect": "NoSchedule"}],
    }
    c = make_cache([queue], flavors("on-demand", spot=spot))
    a = assign_flavors(wl("a", "1"), queue, c)
    assert a.flavors == {"main": {"cpu": "on-demand"}}
    # The flavor's own tolerations make the taint acceptable.
    tolerant = {
        **spot,
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    }
    c2 = make_cache([queue], flavors("on-demand", spot=tolerant))
    assert assign_flavors(wl("a", "1"), queue, c2).flavors == {"main": {"cpu": "spot"}}
    # A pod asking for another instance type cannot use spot.
    b = assign_flavors(wl("b", "1", selector={"instance-type": "on-demand"}), queue, c2)
    assert b.flavors == {"main": {"cpu": "on-demand"}}


def test_no_matching_flavor_reason() -> None:
    queue = cq("cq", [("spot", {"cpu": 10})])
    c = make_cache([queue], flavors(spot={"nodeLabels": {"instance-type": "spot"}}))
    a = assign_flavors(wl("a", "1", selector={"instance-type": "gpu"}), queue, c)
    assert a.mode == Mode.NO_FIT
    assert a.reason == api.REASON_NO_MATCHING_FLAVOR
    assert "flavor spot doesn't match node affinity" in a.message


def test_borrowing_from_cohort() -> None:
    a = cq("a", [("f", {"cpu": 4})], cohortName="team")
    b = cq("b", [("f", {"cpu": 6})], cohortName="team")
    c = make_cache([a, b], flavors("f"))
    assert c.available(a, CPU("f")) == 10
    [d] = schedule([wl("x", "8", queue="a")], c, ALL_NS)
    assert d.outcome is Outcome.ADMIT
    assert c.available(b, CPU("f")) == 2  # B's unused quota was lent to A
    usage = c.flavors_usage(a)
    assert usage == [{"name": "f", "resources": [{"name": "cpu", "total": "8", "borrowed": "4"}]}]


def test_borrowing_limit_caps_borrowing() -> None:
    a = cq("a", [("f", {"cpu": {"nominalQuota": 4, "borrowingLimit": 2}})], cohortName="team")
    b = cq("b", [("f", {"cpu": 6})], cohortName="team")
    c = make_cache([a, b], flavors("f"))
    assert c.potential_available(a, CPU("f")) == 6
    [d] = schedule([wl("x", "7", queue="a")], c, ALL_NS)
    assert d.outcome is Outcome.PENDING and d.reason == api.REASON_EXCEEDS_MAX_QUOTA
    [d] = schedule([wl("y", "6", queue="a")], c, ALL_NS)
    assert d.outcome is Outcome.ADMIT


def test_lending_limit_keeps_quota_for_the_lender() -> None:
    a = cq("a", [("f", {"cpu": 4})], cohortName="team")
    b = cq("b", [("f", {"cpu": {"nominalQuota": 6, "lendingLimit": 2}})], cohortName="team")
    c = make_cache([a, b], flavors("f"))
    assert c.potential_available(a, CPU("f")) == 6
    assert c.potential_available(b, CPU("f")) == 10
    [d] = schedule([wl("x", "7", queue="a")], c, ALL_NS)
    assert d.outcome is Outcome.PENDING
    [d] = schedule([wl("y", "6", queue="a")], c, ALL_NS)
    assert d.outcome is Outcome.ADMIT
    # B still has the 4 it does not lend.
    assert c.available(b, CPU("f")) == 4


def test_other_members_usage_reduces_what_can_be_borrowed() -> None:
    a = cq("a", [("f", {"cpu": 4})], cohortName="team")
    b = cq("b", [("f", {"cpu": 6})], cohortName="team")
    c = make_cache([a, b], flavors("f"), [wl("busy", "5", queue="b", admitted_flavor="f")])
    assert c.available(a, CPU("f")) == 5
    [d] = schedule([wl("x", "6", queue="a")], c, ALL_NS)
    assert d.outcome is Outcome.PENDING and d.reason == api.REASON_WAITING_FOR_QUOTA


def test_no_cohort_means_no_borrowing() -> None:
    a = cq("a", [("f", {"cpu": 4})])
    b = cq("b", [("f", {"cpu": 6})])
    c = make_cache([a, b], flavors("f"))
    [d] = schedule([wl("x", "5", queue="a")], c, ALL_NS)
    assert d.reason == api.REASON_EXCEEDS_MAX_QUOTA


@pytest.mark.parametrize(
    ("strategy", "small_admitted"), [("StrictFIFO", False), ("BestEffortFIFO", True)]
)
def test_head_of_line_blocking(strategy: str, small_admitted: bool) -> None:
    queue = cq("cq", [("f", {"cpu": 4})], queueingStrategy=strategy)
    c = make_cache([queue], flavors("f"), [wl("running", "2", admitted_flavor="f")])
    old_big = wl("old-big", "3", created="2026-01-01T00:00:01Z")
    new_small = wl("new-small", "1", created="2026-01-01T00:00:02Z")
    decisions = {d.workload.name: d for d in schedule([new_small, old_big], c, ALL_NS)}
    assert decisions["old-big"].outcome is Outcome.PENDING
    assert ("new-small" in decisions and decisions["new-small"].outcome is Outcome.ADMIT) is (
        small_admitted
    )
    assert c.used("cq", CPU("f")) == (3 if small_admitted else 2)


def test_priority_orders_the_queue() -> None:
    queue = cq("cq", [("f", {"cpu": 2})], queueingStrategy="StrictFIFO")
    c = make_cache([queue], flavors("f"))
    low = wl("low", "2", created="2026-01-01T00:00:01Z")
    high = wl("high", "2", priority=100, created="2026-01-01T00:00:09Z")
    decisions = schedule([low, high], c, ALL_NS)
    assert decisions[0].workload.name == "high" and decisions[0].outcome is Outcome.ADMIT


def test_preemption_within_cluster_queue_picks_lowest_priority_most_recent() -> None:
    queue = cq("cq", [("f", {"cpu": 4})], preemption={"withinClusterQueue": "LowerPriority"})
    running = [
        wl("old-low", "2", admitted_flavor="f", reserved_at="2026-01-01T00:00:01Z"),
        wl("new-low", "2", admitted_flavor="f", reserved_at="2026-01-01T00:00:05Z"),
    ]
    c = make_cache([queue], flavors("f"), running)
    [d] = schedule([wl("high", "2", priority=10)], c, ALL_NS)
    assert d.outcome is Outcome.PREEMPT
    assert [t.workload.name for t in d.targets] == ["new-low"]
    assert d.targets[0].reason == api.IN_CLUSTER_QUEUE
    assert d.message.endswith("Pending the preemption of 1 workload(s)")
    # Quota is not taken until the preempted Workload releases it.
    assert c.used("cq", CPU("f")) == 4


def test_preemption_prefers_lower_priority_over_recency_and_takes_minimal_set() -> None:
    queue = cq("cq", [("f", {"cpu": 6})], preemption={"withinClusterQueue": "LowerPriority"})
    running = [
        wl("p1", "2", priority=1, admitted_flavor="f", reserved_at="2026-01-01T00:00:09Z"),
        wl("p0-big", "4", priority=0, admitted_flavor="f", reserved_at="2026-01-01T00:00:01Z"),
    ]
    c = make_cache([queue], flavors("f"), running)
    [d] = schedule([wl("high", "3", priority=10)], c, ALL_NS)
    assert [t.workload.name for t in d.targets] == ["p0-big"]


def test_no_preemption_of_equal_or_higher_priority_or_when_never() -> None:
    running = [wl("same", "4", priority=10, admitted_flavor="f")]
    for spec in ({"preemption": {"withinClusterQueue": "LowerPriority"}}, {}):
        queue = cq("cq", [("f", {"cpu": 4})], **spec)
        c = make_cache([queue], flavors("f"), running)
        [d] = schedule([wl("high", "2", priority=10)], c, ALL_NS)
        assert d.outcome is Outcome.PENDING and d.reason == api.REASON_WAITING_FOR_QUOTA
        assert not d.targets


def test_reclaim_within_cohort_evicts_the_borrower() -> None:
    a = cq("a", [("f", {"cpu": 4})], cohortName="team")
    b = cq("b", [("f", {"cpu": 4})], cohortName="team", preemption={"reclaimWithinCohort": "Any"})
    running = [wl("borrower", "6", queue="a", admitted_flavor="f", priority=100)]
    c = make_cache([a, b], flavors("f"), running)
    wants = wl("mine", "4", queue="b")
    assignment = assign_flavors(wants, b, c)
    assert assignment.mode == Mode.PREEMPT
    targets = find_preemption_targets(wants, assignment, b, c)
    assert [(t.workload.name, t.reason) for t in targets] == [
        ("borrower", api.IN_COHORT_RECLAMATION)
    ]


def test_inactive_cluster_queue_and_namespace_selector() -> None:
    queue = cq("cq", [("missing-flavor", {"cpu": 4})])
    c = make_cache([queue], [])
    assert c.active_condition(queue) == (
        False,
        "FlavorNotFound",
        "Can't admit new workloads: references missing ResourceFlavor(s): missing-flavor.",
    )
    [d] = schedule([wl("a", "1")], c, ALL_NS)
    assert (d.reason, d.message) == ("Suspended", "ClusterQueue cq is inactive")

    nothing = model.cluster_queue_from_obj(
        {
            "metadata": {"name": "cq"},
            "spec": {
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {"name": "f", "resources": [{"name": "cpu", "nominalQuota": 4}]}
                        ],
                    }
                ]
            },
        }
    )
    c2 = make_cache([nothing], flavors("f"))
    [d] = schedule([wl("a", "1")], c2, ALL_NS)
    assert (d.reason, d.message) == (
        api.REASON_MISCONFIGURED,
        "workload namespace doesn't match ClusterQueue selector",
    )
    team = cq("cq", [("f", {"cpu": 4})], namespaceSelector={"matchLabels": {"team": "ml"}})
    c3 = make_cache([team], flavors("f"))
    assert schedule([wl("a", "1")], c3, {"default": {"team": "ml"}})[0].outcome is Outcome.ADMIT


def test_unknown_cluster_queue_and_uncovered_resource() -> None:
    queue = cq("cq", [("f", {"cpu": 4})])
    c = make_cache([queue], flavors("f"))
    [d] = schedule([wl("a", "1", queue="nope")], c, ALL_NS)
    assert (d.reason, d.message) == (api.REASON_MISCONFIGURED, "ClusterQueue nope not found")
    gpu = model.workload_from_obj(
        {
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "spec": {
                                "containers": [
                                    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                                ]
                            }
                        },
                    }
                ]
            },
        },
        cluster_queue="cq",
    )
    a = assign_flavors(gpu, queue, c)
    assert a.mode == Mode.NO_FIT
    assert "resource nvidia.com/gpu unavailable in ClusterQueue" in a.message


def test_cache_rebuild_and_release() -> None:
    queue = cq("cq", [("f", {"cpu": 4})])
    running = [wl("a", "1500m", admitted_flavor="f"), wl("b", "1", admitted_flavor="f", count=2)]
    c = make_cache([queue], flavors("f"), running)
    assert c.used("cq", CPU("f")) == Decimal("3.5")
    assert c.flavors_usage(queue)[0]["resources"][0]["total"] == "3500m"
    c.remove_workload("default/b")
    assert c.used("cq", CPU("f")) == Decimal("1.5")
    assert c.remove_workload("default/b") is None


@pytest.mark.parametrize(
    ("text", "formatted"),
    [
        ("3", "3"),
        ("500m", "500m"),
        ("1800Mi", "1800Mi"),
        ("36Gi", "36Gi"),
        ("1.5", "1500m"),
        ("0", "0"),
        ("1000", "1000"),
    ],
)
def test_quantities_round_trip(text: str, formatted: str) -> None:
    assert api.format_quantity(api.quantity(text)) == formatted
    assert api.quantity(api.format_quantity(api.quantity(text))) == api.quantity(text)
