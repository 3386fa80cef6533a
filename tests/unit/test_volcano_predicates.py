"""Volcano's predicates plugin with NodePorts and InterPodAffinity, in full sessions: host
ports and pod (anti-)affinity decide where a gang's pods go, including against the pods
the same session just placed, with kube-scheduler's reasons when nothing fits."""

from __future__ import annotations

from typing import Any

from volcano_helpers import gpu_nodes, run

from gpulab.volcano import apis
from gpulab.volcano.objects import podgroup, queue, task_pod
from gpulab.volcano.scheduler.plugins import podfilters

GPU = "nvidia.com/gpu"
HOST = "kubernetes.io/hostname"
Obj = dict[str, Any]


def with_port(pod: Obj, port: int, host_ip: str = "") -> Obj:
    entry: Obj = {"containerPort": port, "hostPort": port}
    if host_ip:
        entry["hostIP"] = host_ip
    pod["spec"]["containers"][0]["ports"] = [entry]
    return pod


def labelled(pod: Obj, **labels: str) -> Obj:
    pod["metadata"]["labels"] = {**(pod["metadata"].get("labels") or {}), **labels}
    return pod


def term(key: str = HOST, **match: str) -> Obj:
    return {"labelSelector": {"matchLabels": match}, "topologyKey": key}


def with_affinity(pod: Obj, kind: str, *terms: Obj) -> Obj:
    affinity = pod["spec"].setdefault("affinity", {})
    affinity[kind] = {"requiredDuringSchedulingIgnoredDuringExecution": list(terms)}
    return pod


def gang(name: str, pods: list[Obj]) -> Obj:
    return podgroup(name, min_member=len(pods), phase=apis.PG_INQUEUE)


def placed(cache: Any) -> dict[str, str]:
    return dict(cache.binds)


def test_a_host_port_in_use_keeps_the_pod_off_that_node() -> None:
    web = with_port(task_pod("old", "w", 0, node="gpu-0", requests={GPU: 1}), 8080)
    pod = with_port(task_pod("g", "w", 0, requests={GPU: 1}), 8080)
    _, cache = run([web, pod], [gang("g", [pod])], gpu_nodes(1), [queue("default")])
    cond = cache.condition("g", apis.PG_UNSCHEDULABLE_TYPE)
    assert cache.binds == [] and cond is not None
    assert "1 node(s) didn't have free ports for the requested pod ports" in cond["message"]
    _, cache = run([web, pod], [gang("g", [pod])], gpu_nodes(2), [queue("default")])
    assert placed(cache) == {"g-w-0": "gpu-1"}


def test_a_gang_wanting_one_host_port_spreads_over_the_nodes() -> None:
    """The second pod sees the port the first took in this same session."""
    pods = [with_port(task_pod("g", "w", i, requests={GPU: 1}), 9000) for i in range(2)]
    _, cache = run(pods, [gang("g", pods)], gpu_nodes(2), [queue("default")])
    assert sorted(placed(cache).values()) == ["gpu-0", "gpu-1"]
    three = [with_port(task_pod("h", "w", i, requests={GPU: 1}), 9000) for i in range(3)]
    _, cache = run(
        three, [gang("h", three)], gpu_nodes(2), [queue("default")], actions=["allocate"]
    )
    assert cache.binds == []
    cond = cache.condition("h", apis.PG_UNSCHEDULABLE_TYPE)
    assert cond is not None and podfilters.ERR_REASON_PORTS in cond["message"]


def test_host_port_conflicts_follow_host_port_info() -> None:
    used = [with_port(task_pod("a", "w", 0), 80, "10.0.0.1")]
    assert podfilters.ports_conflict([("0.0.0.0", "TCP", 80)], used)  # all addresses
    assert podfilters.ports_conflict([("10.0.0.1", "TCP", 80)], used)
    assert not podfilters.ports_conflict([("10.0.0.2", "TCP", 80)], used)
    assert not podfilters.ports_conflict([("0.0.0.0", "UDP", 80)], used)


def test_anti_affinity_puts_each_worker_on_its_own_node() -> None:
    pods = [
        with_affinity(labelled(task_pod("g", "w", i, requests={GPU: 1}), app="trainer"),
                      "podAntiAffinity", term(app="trainer"))
        for i in range(3)
    ]  # fmt: skip
    _, cache = run(pods, [gang("g", pods)], gpu_nodes(3), [queue("default")])
    assert sorted(placed(cache).values()) == ["gpu-0", "gpu-1", "gpu-2"]
    _, cache = run(pods, [gang("g", pods)], gpu_nodes(2), [queue("default")], actions=["allocate"])
    cond = cache.condition("g", apis.PG_UNSCHEDULABLE_TYPE)
    assert cache.binds == [] and cond is not None
    assert podfilters.ERR_REASON_ANTI_AFFINITY in cond["message"]


def test_affinity_follows_an_existing_pod_and_the_first_of_a_group_may_start() -> None:
    db = labelled(task_pod("db", "w", 0, node="gpu-1", requests={GPU: 1}), app="db")
    near = with_affinity(task_pod("g", "w", 0, requests={GPU: 1}), "podAffinity", term(app="db"))
    _, cache = run([db, near], [gang("g", [near])], gpu_nodes(3), [queue("default")])
    assert placed(cache) == {"g-w-0": "gpu-1"}
    # no pod with app=cache exists, but the pod is one: it may start (anywhere)
    first = labelled(task_pod("c", "w", 0, requests={GPU: 1}), app="cache")
    with_affinity(first, "podAffinity", term(app="cache"))
    _, cache = run([first], [gang("c", [first])], gpu_nodes(2), [queue("default")])
    assert list(placed(cache)) == ["c-w-0"]
    # the pod is not one of them and none exists: unresolvable
    lonely = with_affinity(task_pod("l", "w", 0, requests={GPU: 1}), "podAffinity", term(app="x"))
    _, cache = run(
        [lonely], [gang("l", [lonely])], gpu_nodes(2), [queue("default")], actions=["allocate"]
    )
    cond = cache.condition("l", apis.PG_UNSCHEDULABLE_TYPE)
    assert cache.binds == [] and cond is not None
    assert podfilters.ERR_REASON_AFFINITY in cond["message"]


def test_an_existing_pods_anti_affinity_repels_the_newcomer() -> None:
    loner = task_pod("solo", "w", 0, node="gpu-0", requests={GPU: 1})
    with_affinity(loner, "podAntiAffinity", term(team="noisy"))
    noisy = labelled(task_pod("g", "w", 0, requests={GPU: 1}), team="noisy")
    _, cache = run([loner, noisy], [gang("g", [noisy])], gpu_nodes(1), [queue("default")])
    cond = cache.condition("g", apis.PG_UNSCHEDULABLE_TYPE)
    assert cache.binds == [] and cond is not None
    assert podfilters.ERR_REASON_EXISTING_ANTI_AFFINITY in cond["message"]
    other_ns = labelled(task_pod("h", "w", 0, "elsewhere", requests={GPU: 1}), team="noisy")
    pg = podgroup("h", "elsewhere", phase=apis.PG_INQUEUE)
    _, cache = run([loner, other_ns], [pg], gpu_nodes(1), [queue("default")])
    assert placed(cache) == {"h-w-0": "gpu-0"}  # the term names only its own namespace
