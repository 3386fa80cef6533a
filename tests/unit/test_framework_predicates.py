"""The fit functions and resource arithmetic of gpulab/framework (pure)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpulab.framework import predicates as p
from gpulab.framework.objects import GPU, make_node, make_pod
from gpulab.framework.resources import (
    Resource,
    pod_non_zero_request,
    pod_request,
    pod_requests,
)
from gpulab.framework.snapshot import NodeInfo, PodInfo, new_snapshot


def container(name: str, restart: str | None = None, **requests: str) -> dict:
    c = {"name": name, "image": "x", "resources": {"requests": requests}}
    if restart:
        c["restartPolicy"] = restart
    return c


def test_pod_requests_sum_of_containers_max_of_init_containers_plus_overhead() -> None:
    pod = make_pod(
        "p",
        containers=[container("a", cpu="2", memory="1Gi"), container("b", cpu="1")],
        init_containers=[container("i1", cpu="2", memory="1Gi"), container("i2", memory="3Gi")],
    )
    pod["spec"]["overhead"] = {"cpu": "100m"}
    assert pod_requests(pod) == {"cpu": Decimal("3.1"), "memory": Decimal(3 * 2**30)}


def test_sidecar_init_containers_run_beside_everything_after_them() -> None:
    pod = make_pod(
        "p",
        containers=[container("app", cpu="1")],
        init_containers=[container("side", "Always", cpu="1"), container("setup", cpu="3")],
    )
    # the sidecar runs during 'setup' (1+3) and beside the app (1+1): max(4, 2) = 4
    assert pod_requests(pod)["cpu"] == Decimal(4)


def test_pod_level_requests_override_cpu_and_memory() -> None:
    pod = make_pod("p", requests={"cpu": "1", GPU: 2})
    pod["spec"]["resources"] = {"requests": {"cpu": "4"}}
    assert pod_request(pod) == Resource(milli_cpu=4000, scalar={GPU: 2})


def test_non_zero_request_fills_in_only_missing_cpu_and_memory() -> None:
    nothing = make_pod("p")
    assert pod_non_zero_request(nothing) == Resource(milli_cpu=100, memory=200 * 1024 * 1024)
    explicit_zero = make_pod("q", requests={"cpu": "0"})
    assert pod_non_zero_request(explicit_zero).milli_cpu == 0


def node_info(**alloc: str) -> NodeInfo:
    return NodeInfo.of(make_node("n", allocatable=alloc))


def test_fits_request_names_every_missing_resource() -> None:
    info = node_info(cpu="4", **{GPU: "2"})
    info.add_pod(PodInfo.of(make_pod("busy", requests={"cpu": "3", GPU: 1}, node_name="n")))
    missing = p.fits_request(pod_request(make_pod("x", requests={"cpu": "2", GPU: 2})), info)
    assert [m.reason for m in missing] == ["Insufficient cpu", "Insufficient nvidia.com/gpu"]
    assert not any(m.unresolvable for m in missing)
    too_big = p.fits_request(pod_request(make_pod("y", requests={GPU: 3})), info)
    assert too_big[0].unresolvable


def test_fits_request_pods_limit_and_ignored_resources() -> None:
    info = node_info(pods="1")
    info.add_pod(PodInfo.of(make_pod("a", node_name="n")))
    assert [m.reason for m in p.fits_request(Resource(), info)] == ["Too many pods"]
    other = node_info()
    wants = pod_request(make_pod("x", requests={"example.com/foo": 1}))
    assert p.fits_request(wants, other)
    assert not p.fits_request(wants, other, ignored_resources=frozenset({"example.com/foo"}))
    assert not p.fits_request(wants, other, ignored_groups=frozenset({"example.com"}))


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        ({"key": "gpu", "operator": "Exists"}, {"key": "gpu", "effect": "NoSchedule"}, True),
        ({"key": "gpu", "value": "a"}, {"key": "gpu", "value": "b", "effect": "NoSchedule"}, False),
        ({"operator": "Exists"}, {"key": "anything", "effect": "NoExecute"}, True),
        (
            {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
            {"key": "gpu", "effect": "NoSchedule"},
            False,
        ),
        ({"key": "n", "operator": "Gt", "value": "1"}, {"key": "n", "value": "5"}, False),
    ],
)
def test_toleration_tolerates_taint(toleration: dict, taint: dict, tolerated: bool) -> None:
    assert p.toleration_tolerates_taint(toleration, taint) is tolerated


def test_untolerated_taint_ignores_prefer_no_schedule() -> None:
    node = make_node(
        "n",
        taints=[
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "hard", "value": "x", "effect": "NoSchedule"},
        ],
    )
    assert p.untolerated_taint(make_pod("a"), node)["key"] == "hard"
    tolerant = make_pod("b", tolerations=[{"key": "hard", "operator": "Equal", "value": "x"}])
    assert p.untolerated_taint(tolerant, node) is None
    assert p.count_intolerable_prefer_no_schedule(tolerant, node) == 1


def test_node_unschedulable_unless_tolerated() -> None:
    node = make_node("n", unschedulable=True)
    assert not p.node_unschedulable_fits(make_pod("a"), node)
    ok = make_pod(
        "b", tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]
    )
    assert p.node_unschedulable_fits(ok, node)


@pytest.mark.parametrize(
    ("expr", "matches"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "missing", "operator": "NotIn", "values": ["a"]}, True),
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "zone", "operator": "DoesNotExist"}, False),
        ({"key": "gpus", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "gpus", "operator": "Lt", "values": ["4"]}, False),
        ({"key": "zone", "operator": "Gt", "values": ["4"]}, False),  # not a number
    ],
)
def test_node_selector_requirement(expr: dict, matches: bool) -> None:
    labels = {"zone": "a", "gpus": "8"}
    assert p.requirement_matches(labels, expr) is matches


def test_node_affinity_needs_node_selector_and_one_required_term() -> None:
    node = make_node("gpu-1", labels={"zone": "a"})
    terms = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}
                        ]
                    },
                ]
            }
        }
    }
    assert p.node_affinity_matches(make_pod("a", affinity=terms), node)
    assert not p.node_affinity_matches(
        make_pod("b", affinity=terms, node_selector={"zone": "b"}), node
    )
    empty = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}
        }
    }
    assert not p.node_affinity_matches(make_pod("c", affinity=empty), node)


def test_snapshot_counts_only_bound_unfinished_pods() -> None:
    nodes = [make_node("b"), make_node("a")]
    pods = [
        make_pod("run", requests={"cpu": "1"}, node_name="a"),
        make_pod("done", requests={"cpu": "5"}, node_name="a", phase="Succeeded"),
        make_pod("pending", requests={"cpu": "7"}),
    ]
    snap = new_snapshot(nodes, pods)
    assert [n.name for n in snap] == ["a", "b"]
    a = snap.get("a")
    assert a is not None and a.requested.milli_cpu == 1000 and len(a.pods) == 1
    clone = snap.clone()
    clone.get("a").remove_pod(a.pods[0].uid)
    assert a.requested.milli_cpu == 1000 and clone.get("a").requested.milli_cpu == 0
