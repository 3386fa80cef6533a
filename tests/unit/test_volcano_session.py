"""Volcano's session, actions and plugins on snapshots (no cluster): gang all-or-nothing,
the gang message, enqueue against queue capability, shares by weight, reclaim."""

from __future__ import annotations

from volcano_helpers import gpu_nodes, run

from gpulab.volcano import apis
from gpulab.volcano.objects import podgroup, queue, task_pod

GPU = "nvidia.com/gpu"


def gang(name: str, n: int, gpus: int, q: str = "default", phase: str = apis.PG_INQUEUE):
    pg = podgroup(
        name,
        min_member=n,
        queue=q,
        phase=phase,
        min_resources={GPU: n * gpus},
    )
    pods = [task_pod(name, "worker", i, requests={GPU: gpus}) for i in range(n)]
    return pg, pods


def test_a_gang_that_fits_binds_whole_in_one_session() -> None:
    pg, pods = gang("g", 4, 3)
    ssn, cache = run(pods, [pg], gpu_nodes(2), [queue("default")])
    assert sorted(n for n, _ in cache.binds) == [f"g-worker-{i}" for i in range(4)]
    # 3 GPUs each on 8-GPU nodes: two per node
    assert sorted(node for _, node in cache.binds) == ["gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    assert cache.condition("g", apis.PG_SCHEDULED) is not None
    assert any(r.action == "allocate" and "committed" in r.message for r in ssn.records)


def test_a_gang_that_does_not_fit_binds_nothing_and_says_why() -> None:
    pg, pods = gang("g", 4, 5)  # one 5-GPU task per 8-GPU node: only 2 of 4 fit
    _, cache = run(pods, [pg], gpu_nodes(2), [queue("default")], actions=["allocate"])
    assert cache.binds == []
    cond = cache.condition("g", apis.PG_UNSCHEDULABLE_TYPE)
    assert cond is not None and cond["reason"] == apis.NOT_ENOUGH_RESOURCES_REASON
    assert cond["message"] == (
        "2/4 tasks in gang unschedulable: pod group is not ready, 4 Pending, 4 minAvailable; "
        "Pending: 2 Schedulable, 2 Unschedulable. Origin reason is g-worker-2: "
        "0/2 nodes are unavailable: 2 Insufficient nvidia.com/gpu."
    )
    assert cache.phase("g") == apis.PG_INQUEUE


def test_enqueue_lets_a_job_in_only_within_its_queue_capability() -> None:
    small, _ = gang("small", 1, 2, q="team", phase=apis.PG_PENDING)
    big, _ = gang("big", 2, 4, q="team", phase=apis.PG_PENDING)
    q = queue("team", capability={GPU: 4})
    _, cache = run([], [small, big], gpu_nodes(2), [q])
    assert cache.phase("small") == apis.PG_INQUEUE
    assert cache.phase("big") == apis.PG_PENDING
    assert (
        "big",
        apis.PG_UNSCHEDULABLE_TYPE,
        "queue resource quota insufficient: insufficient nvidia.com/gpu",
    ) in cache.events


def test_a_closed_queue_enqueues_nothing() -> None:
    pg, _ = gang("g", 1, 1, q="shut", phase=apis.PG_PENDING)
    _, cache = run([], [pg], gpu_nodes(1), [queue("shut", state=apis.QUEUE_CLOSED)])
    assert cache.phase("g") == apis.PG_PENDING


def elastic(name: str, q: str, replicas: int, gpus: int = 1):
    """A job that runs with one task and grows to ``replicas``."""
    pg = podgroup(name, queue=q, min_member=1, phase=apis.PG_INQUEUE, min_resources={GPU: gpus})
    pods = [task_pod(name, "w", i, requests={GPU: gpus}) for i in range(replicas)]
    return pg, pods


def test_queues_share_the_gpus_by_weight() -> None:
    a, a_pods = elastic("a", "qa", 32)
    b, b_pods = elastic("b", "qb", 32)
    queues = [queue("qa", 1), queue("qb", 3)]
    _, cache = run(a_pods + b_pods, [a, b], gpu_nodes(4), queues)  # 32 GPUs
    per_job = {"a": 0, "b": 0}
    for name, _ in cache.binds:
        per_job[name.split("-")[0]] += 1
    assert per_job == {"a": 8, "b": 24}
    assert cache.queue_updates["qa"][GPU] == "8"
    assert cache.queue_updates["qb"][GPU] == "24"


def running(pods: list, nodes: list[str]) -> list:
    for i, pod in enumerate(pods):
        pod["spec"]["nodeName"] = nodes[i % len(nodes)]
        pod["status"] = {"phase": "Running"}
    return pods


def test_reclaim_evicts_only_from_the_over_share_queue() -> None:
    # 24 GPUs. qa (weight 1) runs 16 one-GPU tasks on gpu-0/1, qc (weight 2) 4 on gpu-2,
    # qb (weight 3) brings a 6x2 gang: deserved qa 8, qb 12, qc 4 - only qa is over
    a, a_pods = elastic("a", "qa", 16)
    c, c_pods = elastic("c", "qc", 4)
    b, b_pods = gang("b", 6, 2, q="qb")
    pods = [*running(a_pods, ["gpu-0", "gpu-1"]), *running(c_pods, ["gpu-2"]), *b_pods]
    queues = [queue("qa", 1), queue("qb", 3), queue("qc", 2)]
    ssn, cache = run(pods, [a, b, c], gpu_nodes(3), queues, actions=["reclaim"])
    evicted = {name for name, _ in cache.evictions}
    assert evicted and all(name.startswith("a-") for name in evicted)
    assert all(reason == "reclaim" for _, reason in cache.evictions)
    assert len(evicted) == 8  # down to qa's deserved share, no further
    assert any(r.action == "reclaim" and r.job == "default/b" for r in ssn.records)


def test_a_queue_that_is_not_reclaimable_keeps_its_tasks() -> None:
    a, a_pods = elastic("a", "qa", 16)
    b, b_pods = gang("b", 4, 3, q="qb")
    pods = [*running(a_pods, ["gpu-0", "gpu-1"]), *b_pods]
    queues = [queue("qa", 1, reclaimable=False), queue("qb", 3)]
    _, cache = run(pods, [a, b], gpu_nodes(2), queues, actions=["reclaim"])
    assert cache.evictions == []


def test_a_not_ready_node_counts_in_the_total_but_its_taint_keeps_pods_off() -> None:
    """setNodeState ignores node conditions: the NotReady node's 8 GPUs are in the
    session's total, so proportion lets a 12-GPU gang into an uncapped queue of a 16-GPU
    cluster; the node-lifecycle taint keeps every pod on the Ready node."""
    nodes = gpu_nodes(2)
    nodes[1]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes[1].setdefault("spec", {})["taints"] = [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    ]
    big, _ = gang("big", 12, 1, q="team", phase=apis.PG_PENDING)
    e, e_pods = elastic("e", "team", 16)
    ssn, cache = run(e_pods, [big, e], nodes, [queue("team")])
    assert ssn.total_resource.get(GPU) == 16000
    assert cache.phase("big") == apis.PG_INQUEUE
    assert len(cache.binds) == 8 and {node for _, node in cache.binds} == {"gpu-0"}


def test_allocate_tells_the_predicates_and_nodeorder_of_a_jobs_first_task() -> None:
    pg, pods = gang("g", 4, 3)
    ssn, _ = run(pods, [pg], gpu_nodes(2), [queue("default")], actions=["allocate"])
    told = {r.step: r.message for r in ssn.records if r.action == "allocate" and r.step}
    assert told == {
        "predicates": "g-worker-0: gpu-0 passed, gpu-1 passed",
        "nodeorder": "g-worker-0: gpu-1=481, gpu-0=481 -> gpu-0 (a tie, broken by name)",
    }
    # and a node the task does not fit is named with the predicate's reason
    big = [task_pod("b", "worker", 0, requests={GPU: 9})]
    ssn, _ = run(big, [podgroup("b", min_member=1, phase=apis.PG_INQUEUE)], gpu_nodes(2),
                 [queue("default")], actions=["allocate"])  # fmt: skip
    (predicates,) = [r.message for r in ssn.records if r.step == "predicates"]
    assert predicates == (
        "b-worker-0: gpu-0 Insufficient nvidia.com/gpu, gpu-1 Insufficient nvidia.com/gpu"
    )
