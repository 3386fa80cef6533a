"""The visibility API (kueue v0.19.2 pkg/visibility): positions from the queue manager's
Snapshot, which is the order its heap pops Workloads; limit/offset; discovery; authz."""

from __future__ import annotations

from typing import Any

from gpulab.kueue import api, visibility
from gpulab.kueue.model import LocalQueue, PodSetResources, PodSetSpec, WorkloadInfo
from gpulab.kueue.queue import Manager, RequeueReason

GPU = "nvidia.com/gpu"


def wl(name: str, lq: str, priority: int = 0, at: float = 0.0, ns: str = "ns") -> WorkloadInfo:
    return WorkloadInfo(
        namespace=ns,
        name=name,
        uid=f"uid-{name}",
        queue_name=lq,
        total_requests=(PodSetResources("main", 1, {GPU: 1}),),
        pod_sets=(PodSetSpec("main", 1),),
        priority=priority,
        created=at,
        queue_ts=at,
        obj={
            "metadata": {
                "name": name,
                "namespace": ns,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": f"job-{name}", "uid": "u"}
                ],
            },
            "spec": {"priority": priority, "queueName": lq},
        },
    )


def manager() -> Manager:
    m = Manager(clock=lambda: 100.0)
    m.add_or_update_cluster_queue("cq", api.BEST_EFFORT_FIFO, {}, None)
    m.add_or_update_local_queue(LocalQueue("ns", "lq-a", "cq"))
    m.add_or_update_local_queue(LocalQueue("ns", "lq-b", "cq"))
    return m


def names(items: list[dict[str, Any]]) -> list[str]:
    return [i["metadata"]["name"] for i in items]


def test_positions_are_the_order_the_heap_pops() -> None:
    m = manager()
    for w in (
        wl("low-old", "lq-a", 0, 1),
        wl("high", "lq-b", 100, 5),
        wl("low-new", "lq-a", 0, 3),
        wl("mid", "lq-b", 50, 9),
    ):
        m.add_or_update_workload(w)
    listed = visibility.pending_in_cluster_queue(m.pending_workloads_info("cq") or [])
    assert names(listed) == ["high", "mid", "low-old", "low-new"]
    assert [i["positionInClusterQueue"] for i in listed] == [0, 1, 2, 3]
    assert [i["positionInLocalQueue"] for i in listed] == [0, 1, 0, 1]
    assert listed[0]["priority"] == 100 and listed[0]["localQueueName"] == "lq-b"
    assert listed[0]["metadata"]["ownerReferences"][0]["name"] == "job-high"
    popped = []
    while (head := m.cluster_queues["cq"].pop()) is not None:
        popped.append(head.name)
    assert popped == names(listed)


def test_snapshot_keeps_inflight_inadmissible_and_sticky_preemptor_first() -> None:
    m = manager()
    for w in (wl("a", "lq-a", 10, 1), wl("b", "lq-a", 5, 2), wl("c", "lq-a", 1, 3)):
        m.add_or_update_workload(w)
    cq = m.cluster_queues["cq"]
    head = cq.pop()
    assert head is not None and head.name == "a"
    # in flight: still pending, still first
    assert names(visibility.pending_in_cluster_queue(m.pending_workloads_info("cq") or [])) == [
        "a",
        "b",
        "c",
    ]
    m.requeue_workload(head, RequeueReason.NO_FIT)  # parked as inadmissible
    assert "a" in [w.name for w in cq.inadmissible.values()]
    b = cq.pop()
    assert b is not None
    m.requeue_workload(b, RequeueReason.PENDING_PREEMPTION)  # the sticky preemptor
    listed = names(visibility.pending_in_cluster_queue(m.pending_workloads_info("cq") or []))
    assert listed == ["b", "a", "c"]
    assert cq.pop() is b  # the scheduler takes the sticky Workload next, as listed


def test_local_queue_positions_limit_and_offset() -> None:
    m = manager()
    for i in range(5):
        m.add_or_update_workload(wl(f"a{i}", "lq-a", 0, i))
        m.add_or_update_workload(wl(f"b{i}", "lq-b", 0, i + 0.5))
    snap = m.pending_workloads_info("cq") or []
    lq = visibility.pending_in_local_queue(snap, "ns", "lq-b", limit=2, offset=1)
    assert names(lq) == ["b1", "b2"]
    assert [i["positionInLocalQueue"] for i in lq] == [1, 2]
    assert [i["positionInClusterQueue"] for i in lq] == [3, 5]
    cq = visibility.pending_in_cluster_queue(snap, limit=3, offset=2)
    assert names(cq) == ["a1", "b1", "a2"]
    assert [i["positionInLocalQueue"] for i in cq] == [1, 1, 2]
    assert visibility.bounded_limit_offset(-5, -1) == (0, 0)
    assert visibility.bounded_limit_offset(10**9, 3) == (100_000, 3)


def _allow(*_: Any) -> bool:
    return True


def _deny(*_: Any) -> bool:
    return False


def test_handle_routes_discovery_and_errors() -> None:
    m = manager()
    m.add_or_update_workload(wl("x", "lq-a", 0, 1))
    who = visibility.Request("alice", ["system:authenticated"], {})
    base = "/apis/visibility.kueue.x-k8s.io"
    code, body = visibility.handle(
        m, "GET", f"{base}/v1beta2/clusterqueues/cq/pendingworkloads", who, _allow
    )
    assert code == 200 and body["kind"] == "PendingWorkloadsSummary"
    assert body["apiVersion"] == "visibility.kueue.x-k8s.io/v1beta2" and names(body["items"]) == [
        "x"
    ]
    code, body = visibility.handle(
        m,
        "GET",
        f"{base}/v1beta1/namespaces/ns/localqueues/lq-a/pendingworkloads?limit=1",
        who,
        _allow,
    )
    assert code == 200 and names(body["items"]) == ["x"]
    code, body = visibility.handle(
        m, "GET", f"{base}/v1beta2/clusterqueues/nope/pendingworkloads", who, _allow
    )
    assert (
        code == 404 and body["message"] == 'clusterqueue.visibility.kueue.x-k8s.io "nope" not found'
    )
    code, body = visibility.handle(
        m, "GET", f"{base}/v1beta2/clusterqueues/cq/pendingworkloads", who, _deny
    )
    assert code == 403 and 'User "alice" cannot get' in body["message"]
    code, body = visibility.handle(m, "GET", f"{base}/v1beta2", who, _deny)
    assert code == 200 and body["kind"] == "APIResourceList"
    assert {r["name"] for r in body["resources"]} >= {
        "clusterqueues/pendingworkloads",
        "localqueues/pendingworkloads",
    }
    code, body = visibility.handle(m, "GET", "/apis", who, _allow)
    assert body["groups"][0]["preferredVersion"]["version"] == "v1beta2"
