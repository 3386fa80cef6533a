"""HAMi end to end on its own cluster (harness/clusters/hami-e2e.yaml): the extender's
webhook, the real kube-scheduler ``hami-scheduler`` calling /filter and /bind, the node
agent's Allocate and the device plugin's HAMi Allocate, on kwok nodes whose GPUs come from
the NVML shim. Placements are checked by node and GPU UUID.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import Cluster, fresh_namespace, running_cluster
from kubernetes import client
from kubernetes.client.rest import ApiException

from demos import hami as demo
from gpulab.fakegpu.profiles import gpu_uuid
from gpulab.hami import annotations as ha
from gpulab.hami.score import BINPACK, SPREAD
from gpulab.wait import wait_for
from harness.addons.hami import EXTENDER, start_extender
from harness.local import pid_alive

# restarts the extender's host process on its own local cluster
pytestmark = pytest.mark.local_backend

SPEC = "hami-e2e"
# Every test starts on an empty cluster (the ns fixture waits until its pods are gone), so
# placements are exact: node binpack ties go to the first node by name, card ties to the
# lowest index.
A100 = "gpu-a100"


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
    card = gpu_uuid(A100, 0)
    assert {(node, d.uuid) for node, devs in placed for d in devs} == {(A100, card)}
    assert all(d.usedmem == 3000 and d.usedcores == 30 for _, devs in placed for d in devs)
    # the device plugin's Allocate set the hami-core limits for that very card
    pod = demo.read_pod(hami.api, ns, names[0])
    envs = json.loads(demo.annotations(pod)["gpulab.io/allocate-cuda"])["envs"]
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": card,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
    }
    assert demo.annotations(pod)[ha.DEVICES_TO_ALLOCATE] == ";"  # all containers done


def test_three_vgpu_pods_land_on_different_gpus_under_spread(hami: Cluster, ns: str) -> None:
    names = [f"sp-{i}" for i in range(3)]
    for name in names:
        create(hami.api, ns, demo.vgpu_pod(name, 3000, 30, SPREAD))
    placed = [demo.placement(demo.wait_allocated(hami.api, ns, n)) for n in names]
    cards = [(node, d.uuid) for node, devs in placed for d in devs]
    assert sorted(cards) == sorted((A100, gpu_uuid(A100, i)) for i in range(3)), cards


def test_pod_that_fits_no_gpu_stays_pending_with_the_extenders_reason(
    hami: Cluster, ns: str
) -> None:
    create(hami.api, ns, demo.vgpu_pod("too-big", 50000, 10))  # no card has 50000 MiB
    message = wait_for(
        lambda: demo.failed_scheduling(hami.api, ns, "too-big"), 60, "FailedScheduling"
    )
    # kube-scheduler reports the extender's FailedNodes reasons, per node
    assert (
        "0/3 nodes are available: 1 8/8 CardInsufficientMemory, 2 4/4 CardInsufficientMemory"
        in message
    )
    pod = demo.read_pod(hami.api, ns, "too-big")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    assert ha.ASSIGNED_NODE not in demo.annotations(pod)


def test_fifty_concurrent_vgpu_pods_never_overbook_a_gpu(hami: Cluster, ns: str) -> None:
    rng = random.Random(5)
    # GPU binpack piles pods onto the fullest card until its shares, memory or cores run
    # out: every limit is hit while 50 pods race through Filter and Bind.
    pods = [
        demo.vgpu_pod(f"c-{i}", rng.randrange(1000, 6000, 500), rng.randrange(5, 30, 5), BINPACK)
        for i in range(50)
    ]
    create_concurrently(hami.api, ns, pods)
    wait_for(
        lambda: all(
            demo.allocated(p) for p in all_pods(hami.api) if p["metadata"]["namespace"] == ns
        ),
        120,
        "50 pods bound and allocated",
        interval=1.0,
    )
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
    for pod in second:  # created while the webhook is down (failurePolicy Ignore)
        pod["spec"]["schedulerName"] = "hami-scheduler"
    create_concurrently(hami.api, ns, first)

    def done() -> dict[str, dict[str, Any]]:
        pods = [p for p in all_pods(hami.api) if p["metadata"]["namespace"] == ns]
        return {p["metadata"]["name"]: p for p in pods if demo.allocated(p)}

    wait_for(lambda: len(done()) >= 4, 60, "the first allocations")
    rec = next(p for p in hami.local.processes() if p.name == EXTENDER)
    os.kill(rec.pid, signal.SIGTERM)
    wait_for(lambda: not pid_alive(rec.pid, rec.exe), 15, "the extender to exit")
    before = done()
    print(f"extender killed with {len(before)}/{len(first)} of the first batch allocated")
    create_concurrently(hami.api, ns, second)
    start_extender(hami.local, rec.ports[0], rec.ports[1])
    hami.local.wait_http(f"https://127.0.0.1:{rec.ports[0]}/readyz", "restarted extender")

    total = len(first) + len(second)
    after = wait_for(lambda: (d := done()) and len(d) == total and d, 120, f"all {total} pods")
    for name, pod in before.items():  # allocations made before the kill are unchanged
        assert demo.placement(after[name]) == demo.placement(pod)
    usage = assert_within_capacity(hami.api)
    assert len(usage) == total // 2 and all(c == 100 for _, _, c in usage.values()), usage
    # the restarted extender rebuilt its books from the annotations: its metrics agree
    urls = demo.extender_urls(hami.local.spec)
    assert urls is not None
    text = httpx.get(urls[1] + "/metrics", timeout=5).text
    for (node, card), (_, mem, _) in usage.items():
        line = next(
            x
            for x in text.splitlines()
            if x.startswith("GPUDeviceMemoryAllocated{") and card in x and f'nodeid="{node}"' in x
        )
        assert float(line.rsplit(" ", 1)[1]) == mem * 2**20, line


def test_webhook_sets_scheduler_name_and_rejects_bad_gpu_pods(hami: Cluster, ns: str) -> None:
    gpu = create(hami.api, ns, demo.vgpu_pod("mutated", 1000, 0))
    assert gpu.spec.scheduler_name == "hami-scheduler"
    cpu_only = demo.vgpu_pod("cpu-only", 1, 0)
    cpu_only["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "100m"}}
    assert create(hami.api, ns, cpu_only).spec.scheduler_name == "default-scheduler"

    privileged = demo.vgpu_pod("privileged", 1000, 0)
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiException) as exc:
        create(hami.api, ns, privileged)
    assert "container cuda is privileged" in exc.value.body

    memonly = demo.vgpu_pod("memonly", 1000, 0)
    del memonly["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    with pytest.raises(ApiException) as exc:
        create(hami.api, ns, memonly)
    assert "without nvidia.com/gpu" in exc.value.body
    names = {p.metadata.name for p in client.CoreV1Api(hami.api).list_namespaced_pod(ns).items}
    assert names == {"mutated", "cpu-only"}


def test_demo_runs_against_the_hami_cluster(hami: Cluster) -> None:
    args = argparse.Namespace(spec=SPEC, backend="local", diagram=None)
    assert demo.run(args) == 0
