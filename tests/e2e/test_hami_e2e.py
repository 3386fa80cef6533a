"""HAMi (v2.10.0) end to end on its own cluster (harness/clusters/hami-e2e.yaml): the
extender's webhook, the real kube-scheduler ``hami-scheduler`` calling /filter and /bind,
the node agent's Allocate and the device plugin's HAMi Allocate, on kwok nodes whose GPUs
come from the NVML shim. Placements are checked by node and GPU UUID; the node lock is
watched from Bind to Allocate.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import Cluster, fresh_namespace, running_cluster
from golden import assert_shape
from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import hami as demo
from gpulab.fakegpu.profiles import gpu_uuid
from gpulab.hami import annotations as ha
from gpulab.hami.bind import POD_GROUP_LABEL
from gpulab.hami.device import ALLOCATE_MODE
from gpulab.hami.score import BINPACK, NODE_POLICY_ANNOTATION, SPREAD
from gpulab.informer import NODES, PODS, SYNCED, ListWatch, follow
from gpulab.wait import wait_for
from harness.addons import hami as hami_addon

# HAMi runs on its own local cluster (`--spec hami-e2e`); kind/k3d refuse the addon
pytestmark = pytest.mark.local_backend

SPEC = "hami-e2e"
# Every test starts on an empty cluster (the ns fixture waits until its pods are gone), so
# placements are exact: node binpack ties go to the first node by name; among equally used
# cards Fit walks upstream's sort order from its end: the higher NUMA node, then the lowest
# index (the A100 profile has GPUs 0-3 on NUMA 0, 4-7 on NUMA 1).
A100 = "gpu-a100"
FIRST_CARD = 4


@pytest.fixture(scope="module")
def hami() -> Iterator[Cluster]:
    with running_cluster(SPEC) as c:
        yield c


@pytest.fixture
def ns(hami: Cluster) -> Iterator[str]:
    with fresh_namespace(hami.api, "hami") as name:
        yield name


def create(api: client.ApiClient, ns: str, pod: dict[str, Any]) -> client.V1Pod:
    return client.CoreV1Api(api).create_namespaced_pod(ns, pod)


def all_pods(api: client.ApiClient) -> list[dict[str, Any]]:
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces()
    return api.sanitize_for_serialization(pods)["items"]


def assert_within_capacity(api: client.ApiClient) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Per GPU: shares, memory and cores summed over every pod never exceed the card."""
    cards = demo.registered_gpus(api)
    usage = demo.gpu_usage(all_pods(api))
    for key, (shares, mem, cores) in usage.items():
        card = cards[key]
        assert shares <= card.count, f"{key}: {shares} shares > split count {card.count}"
        assert mem <= card.devmem, f"{key}: {mem} MiB > {card.devmem} MiB"
        assert cores <= card.devcore, f"{key}: {cores} % cores > {card.devcore} %"
    return usage


def create_concurrently(api: client.ApiClient, ns: str, pods: list[dict[str, Any]]) -> None:
    with ThreadPoolExecutor(max_workers=10) as pool:
        list(pool.map(lambda p: create(api, ns, p), pods))


def test_three_vgpu_pods_share_one_gpu_under_binpack(hami: Cluster, ns: str) -> None:
    names = [f"bp-{i}" for i in range(3)]
    for name in names:
        create(hami.api, ns, demo.vgpu_pod(name, 3000, 30, BINPACK))
    placed = [demo.placement(demo.wait_allocated(hami.api, ns, n)) for n in names]
    card = gpu_uuid(A100, FIRST_CARD)
    assert {(node, d.uuid) for node, devs in placed for d in devs} == {(A100, card)}
    assert all(d.usedmem == 3000 and d.usedcores == 30 for _, devs in placed for d in devs)
    # the device plugin's Allocate set the hami-core limits for that very card
    pod = demo.read_pod(hami.api, ns, names[0])
    record = json.loads(demo.annotations(pod)["gpulab.io/allocate-cuda"])
    envs = {k: v for k, v in record["envs"].items() if k != "FAKE_GPU_CONFIG"}
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": card,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    # kubelet's unit of the card is one of HAMi's IDs <uuid>-<n> (not <uuid>::<n>)
    (unit,) = record["devices"]["nvidia.com/gpu"]
    head, _, n = unit.rpartition("-")
    assert head == card and n.isdigit() and 0 <= int(n) < 10
    # HAMi's device plugin writes no GFD labels
    labels = client.CoreV1Api(hami.api).read_node(A100).metadata.labels
    assert not [k for k in labels if k.startswith("nvidia.com/gpu.")], labels
    # every slot erased (the empty tail slot is kept at each round, as upstream)
    assert demo.annotations(pod)[ha.DEVICES_TO_ALLOCATE] == ";;"


def test_three_vgpu_pods_land_on_different_gpus_under_spread(hami: Cluster, ns: str) -> None:
    names = [f"sp-{i}" for i in range(3)]
    for name in names:
        create(hami.api, ns, demo.vgpu_pod(name, 3000, 30, SPREAD))
    placed = [demo.placement(demo.wait_allocated(hami.api, ns, n)) for n in names]
    cards = [(node, d.uuid) for node, devs in placed for d in devs]
    assert cards == [(A100, gpu_uuid(A100, i)) for i in (4, 5, 6)], cards


def test_a_pod_asking_for_nvidia_com_priority_schedules(hami: Cluster, ns: str) -> None:
    """No node advertises nvidia.com/priority: kube-scheduler leaves it to the extender
    (managedResources, ignoredByScheduler, as the chart), else the pod stays Pending."""
    pod = demo.vgpu_pod("prio", 2000, 20)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/priority"] = "1"
    create(hami.api, ns, pod)
    placed = demo.wait_allocated(hami.api, ns, "prio")
    assert placed["spec"]["nodeName"]
    env = {e["name"]: e.get("value") for e in placed["spec"]["containers"][0]["env"]}
    assert env["CUDA_TASK_PRIORITY"] == "1"  # the webhook's, for HAMi-core


def test_pod_that_fits_no_gpu_stays_pending_with_the_extenders_reason(
    hami: Cluster, ns: str
) -> None:
    create(hami.api, ns, demo.vgpu_pod("too-big", 50000, 10))  # no card has 50000 MiB
    message = wait_for(
        lambda: demo.failed_scheduling(hami.api, ns, "too-big"), 60, "FailedScheduling"
    )
    # kube-scheduler reports the extender's FailedNodes reasons, per node (the MIG node's
    # cards are as short of memory as the others)
    assert (
        "0/4 nodes are available: 2 4/4 CardInsufficientMemory, 2 8/8 CardInsufficientMemory"
        in message
    )
    pod = demo.read_pod(hami.api, ns, "too-big")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert ha.ASSIGNED_NODE not in demo.annotations(pod)


def test_fifty_concurrent_vgpu_pods_never_overbook_a_gpu(hami: Cluster, ns: str) -> None:
    rng = random.Random(5)
    # GPU binpack piles pods onto the fullest card of a node until its shares, memory or
    # cores run out: every limit is hit while 50 pods race through Filter and Bind. Node
    # spread (the pod's hami.io/node-scheduler-policy) deals them over all three nodes, so
    # three node locks are in play at once and their Binds run concurrently; under node
    # binpack all 50 would queue for one node's lock, one pod per Allocate (minutes).
    # Both paths of a Bind that meets the lock: every fifth pod fails it at once and
    # comes back after kube-scheduler's back-off (1 s doubling to 10 s: the test's tail);
    # the others are PodGroup members, whose Bind waits for the lock
    # (--node-lock-retry-timeout), as v2.10 does for them.
    pods = []
    for i in range(50):
        pod = demo.vgpu_pod(
            f"c-{i}", rng.randrange(1000, 6000, 500), rng.randrange(5, 30, 5), BINPACK
        )
        pod["metadata"]["annotations"][NODE_POLICY_ANNOTATION] = SPREAD
        pod["metadata"]["annotations"][ALLOCATE_MODE] = ha.MODE_HAMI_CORE  # not the MIG node
        if i % 5:
            pod["metadata"].setdefault("labels", {})[POD_GROUP_LABEL] = "fifty"
        pods.append(pod)
    create_concurrently(hami.api, ns, pods)
    wait_for(
        lambda: all(
            demo.allocated(p) for p in all_pods(hami.api) if p["metadata"]["namespace"] == ns
        ),
        300,
        "50 pods bound and allocated",
        interval=1.0,
    )
    placed = [p for p in all_pods(hami.api) if p["metadata"]["namespace"] == ns]
    assert len({p["spec"]["nodeName"] for p in placed}) == 3  # every node lock was contended
    usage = assert_within_capacity(hami.api)
    cards = demo.registered_gpus(hami.api)
    # binpack really filled cards to a limit (else the capacity check proved nothing)
    assert any(
        s == cards[k].count or c > cards[k].devcore - 5 or m > cards[k].devmem - 1000
        for k, (s, m, c) in usage.items()
    ), usage


def test_extender_restart_mid_run_loses_no_allocation(hami: Cluster, ns: str) -> None:
    # 50 % cores each: two pods fill a card. A restarted extender that forgot the first
    # batch would see full cards as empty and binpack the second batch onto them.
    first = [demo.vgpu_pod(f"a-{i}", 2000, 50, BINPACK) for i in range(16)]
    second = [demo.vgpu_pod(f"b-{i}", 2000, 50, BINPACK) for i in range(12)]
    for pod in first + second:  # three node locks in play, not one (see the test above)
        pod["metadata"]["annotations"][NODE_POLICY_ANNOTATION] = SPREAD
        pod["metadata"]["annotations"][ALLOCATE_MODE] = ha.MODE_HAMI_CORE  # not the MIG node
    for pod in second:  # created while the webhook may be down (failurePolicy Ignore)
        pod["spec"]["schedulerName"] = "hami-scheduler"
    create_concurrently(hami.api, ns, first)

    def done() -> dict[str, dict[str, Any]]:
        pods = [p for p in all_pods(hami.api) if p["metadata"]["namespace"] == ns]
        return {p["metadata"]["name"]: p for p in pods if demo.allocated(p)}

    wait_for(lambda: len(done()) >= 4, 60, "the first allocations")
    (old,) = hami.backend.component_pods(hami_addon.COMPONENT)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # as `kubectl delete pod`: the Deployment brings a new scheduler pod
        restarted = pool.submit(hami.backend.restart, hami_addon.COMPONENT)
        wait_for(
            lambda: (
                not any(
                    p.metadata.uid == old.metadata.uid and not p.metadata.deletion_timestamp
                    for p in hami.backend.component_pods(hami_addon.COMPONENT)
                )
            ),
            30,
            "the old hami-scheduler pod to be deleted",
        )
        before = done()
        print(f"scheduler pod deleted with {len(before)}/{len(first)} of the first batch allocated")
        create_concurrently(hami.api, ns, second)
        new = restarted.result()
    assert new.metadata.uid != old.metadata.uid

    total = len(first) + len(second)
    after = wait_for(lambda: (d := done()) and len(d) == total and d, 300, f"all {total} pods")
    for name, pod in before.items():  # allocations made before the restart are unchanged
        assert demo.placement(after[name]) == demo.placement(pod)
    usage = assert_within_capacity(hami.api)  # a forgotten card would now hold 150 %
    assert sum(n for n, _, _ in usage.values()) == total
    # GPU binpack held across the restart: each node fills a half-used card before it
    # opens another, so a node ends with at most one card at 50 %
    halves = Counter(node for (node, _), (_, _, c) in usage.items() if c == 50)
    assert (
        all(c in (50, 100) for _, _, c in usage.values()) and max(halves.values(), default=0) <= 1
    ), usage
    # the new extender rebuilt its books from the annotations: its metrics agree
    ext = hami_addon.extender(hami.backend)
    assert ext is not None
    text = httpx.get(ext.metrics + "/metrics", timeout=5).text
    for (node, card), (_, mem, _) in usage.items():
        line = next(
            x
            for x in text.splitlines()
            if x.startswith("hami_gpu_memory_allocated_bytes{")
            and card in x
            and f'node="{node}"' in x
        )
        assert float(line.rsplit(" ", 1)[1]) == mem * 2**20, line


def test_webhook_sets_scheduler_name_defaults_and_rejects(hami: Cluster, ns: str) -> None:
    card_only = demo.vgpu_pod("card-only", 1000, 0)
    card_only["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    created = create(hami.api, ns, card_only)
    assert created.spec.scheduler_name == "hami-scheduler"
    # a card-only request gets the whole card's cores (defaultExclusiveCoreIfNeeded)
    assert created.spec.containers[0].resources.limits["nvidia.com/gpucores"] == "100"
    memonly = demo.vgpu_pod("memonly", 1000, 0)
    del memonly["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    # gpumem without nvidia.com/gpu gets defaultGPUNum (1), as v2.10 does
    assert (
        create(hami.api, ns, memonly).spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    )
    cpu_only = demo.vgpu_pod("cpu-only", 1, 0)
    cpu_only["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "100m"}}
    assert create(hami.api, ns, cpu_only).spec.scheduler_name == "default-scheduler"

    privileged = demo.vgpu_pod("privileged", 1000, 0)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as exc:
        create(hami.api, ns, privileged)
    assert "container cuda is privileged" in exc.value.body
    names = {p.metadata.name for p in client.CoreV1Api(hami.api).list_namespaced_pod(ns).items}
    assert names == {"card-only", "memonly", "cpu-only"}


def test_node_lock_is_held_from_bind_until_the_device_plugins_allocate(
    hami: Cluster, ns: str
) -> None:
    """The lock appears with the pod's name, the plugin marks the pod allocated, and only
    then does the lock go (ordered by etcd's resourceVersions)."""
    stop = threading.Event()
    seen: list[tuple[int, str | None]] = []
    success: list[int] = []

    def watch_nodes() -> None:
        lw = ListWatch(hami.api, NODES, field_selector=f"metadata.name={A100}")
        for delta in follow(lw, stop):
            if delta.type == SYNCED:
                continue
            value = (delta.obj["metadata"].get("annotations") or {}).get(ha.NODE_LOCK)
            if not seen or seen[-1][1] != value:
                seen.append((int(delta.obj["metadata"]["resourceVersion"]), value))

    def watch_pod() -> None:
        for delta in follow(ListWatch(hami.api, PODS, namespace=ns), stop):
            if delta.type == SYNCED:
                continue
            annos = delta.obj["metadata"].get("annotations") or {}
            if not success and annos.get(ha.BIND_PHASE) == ha.BIND_SUCCESS:
                success.append(int(delta.obj["metadata"]["resourceVersion"]))

    for target in (watch_nodes, watch_pod):
        threading.Thread(target=target, daemon=True).start()
    try:
        wait_for(lambda: seen, 30, "the node watch to list gpu-a100")
        create(hami.api, ns, demo.vgpu_pod("locked", 2000, 20, BINPACK))
        demo.wait_allocated(hami.api, ns, "locked")
        wait_for(lambda: len(seen) >= 3 and seen[-1][1] is None and success, 30, "the release")
    finally:
        stop.set()
    taken = [(rv, v) for rv, v in seen if v and v.endswith(f",{ns},locked")]
    assert taken, seen
    released = next(rv for rv, v in seen if rv > taken[0][0] and v is None)
    # Bind took it, the plugin marked the pod allocated, then released it
    assert taken[0][0] < success[0] < released, (seen, success)


def test_init_container_gets_the_first_slot(hami: Cluster, ns: str) -> None:
    pod = demo.vgpu_pod("with-init", 3000, 30, BINPACK)
    init = copy.deepcopy(pod["spec"]["containers"][0])
    init.update(name="warmup", command=["true"])
    init["resources"]["limits"]["nvidia.com/gpumem"] = "8000"
    pod["spec"]["initContainers"] = [init]
    create(hami.api, ns, pod)
    done = demo.wait_allocated(hami.api, ns, "with-init")
    card = gpu_uuid(A100, FIRST_CARD)
    assert demo.annotations(done)[ha.DEVICES_ALLOCATED] == (
        f"{card},NVIDIA,8000,30:;{card},NVIDIA,3000,30:;"
    )
    # the device plugin marks bind-phase success inside Allocate; the node agent records
    # each container's Allocate response (its checkpoint) just after: wait for both
    keys = {c: f"gpulab.io/allocate-{c}" for c in ("warmup", "cuda")}
    recorded = wait_for(
        lambda: (
            (a := demo.annotations(demo.read_pod(hami.api, ns, "with-init")))
            and all(k in a for k in keys.values())
            and a
        ),
        30,
        "the node agent's record of both containers' Allocate",
    )
    envs = {c: json.loads(recorded[k])["envs"] for c, k in keys.items()}
    assert envs["warmup"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m"
    assert envs["cuda"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


def test_an_unschedulable_pod_keeps_one_filter_warning_while_retried(
    hami: Cluster, ns: str
) -> None:
    create(hami.api, ns, demo.vgpu_pod("never", 50000, 10))
    core = client.CoreV1Api(hami.api)

    def events(reason: str) -> list[client.CoreV1Event]:
        selector = f"involvedObject.name=never,reason={reason}"
        return core.list_namespaced_event(ns, field_selector=selector).items

    wait_for(lambda: events("FailedScheduling"), 60, "the first FailedScheduling")
    # cluster events make kube-scheduler retry the pod: pods come and go on the nodes
    for i in range(4):
        create(hami.api, ns, demo.vgpu_pod(f"churn-{i}", 1000, 5, SPREAD))
        demo.wait_allocated(hami.api, ns, f"churn-{i}")
    # kube-scheduler's own recorder aggregates too: a series (count 2) proves a retry
    wait_for(
        lambda: any(e.series and e.series.count >= 2 for e in events("FailedScheduling")),
        120,
        "kube-scheduler to retry the pod (positive control)",
        interval=1.0,
    )
    assert len(events("Filter")) == 1  # one Warning Event, its series counting the retries
    # HAMi's two notes (the reason with its nodes, the summary): one Event each
    notes = [e.message for e in events("FilteringFailed")]
    assert len(notes) == len(set(notes)) == 2, notes


def test_the_extender_talks_as_its_service_account(hami: Cluster, ns: str) -> None:
    """RBAC of manifests/hami is enforced: without `patch` on nodes the extender cannot
    take the node lock, so Bind fails with 403; with the ClusterRole restored the pod binds
    (kube-scheduler retries it)."""
    rbac = client.RbacAuthorizationV1Api(hami.api)
    name = "gpulab-hami-scheduler"
    role = rbac.read_cluster_role(name)
    original = copy.deepcopy(role.rules)
    for rule in role.rules:
        if "nodes" in rule.resources:
            rule.verbs = [v for v in rule.verbs if v != "patch"]
    rbac.replace_cluster_role(name, role)
    core = client.CoreV1Api(hami.api)

    def bind_failures() -> list[str]:
        selector = "involvedObject.name=denied,reason=BindingFailed"
        return [e.message for e in core.list_namespaced_event(ns, field_selector=selector).items]

    try:
        create(hami.api, ns, demo.vgpu_pod("denied", 1000, 10, BINPACK))
        failures = wait_for(bind_failures, 60, "a BindingFailed Event for denied")
        assert any("403" in m for m in failures), failures
        assert not demo.allocated(demo.read_pod(hami.api, ns, "denied"))
    finally:
        role = rbac.read_cluster_role(name)
        role.rules = original
        rbac.replace_cluster_role(name, role)
    demo.wait_allocated(hami.api, ns, "denied")  # positive control: the same pod, allowed


def test_demo_runs_against_the_hami_cluster(
    hami: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(spec=SPEC, backend="local", diagram=None)
    assert demo.run(args) == 0
    # seed 003's steps in their order (tests/e2e/golden/hami.yaml)
    assert_shape("hami", capsys.readouterr().out)
