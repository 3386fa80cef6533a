"""Benchmark: the dashboard at 100 nodes x 8 GPUs and 1,000 pods, in headless Chromium.

A dedicated local cluster of 100 kwok nodes (8x A100-SXM4-40GB each). Their GPUs are
registered for HAMi (``hami.io/node-nvidia-register``, written here as the device
plugin's registrar writes it) and 1,000 pods are created already bound, carrying HAMi's
allocation annotations as the extender's Bind leaves them (one 2000 MiB / 10 % share on
one GPU each): 100 device-plugin processes and 1,000 scheduling cycles do not fit 2
cores, and the dashboard only reads what they write. Then:

- start-up: a fresh dashboard (informers list everything, every view computed);
- first paint: a new page -> all 800 GPU boxes and 1,000 slices in the DOM;
- update latency: create one more such pod -> its slice in the right GPU box, end to end
  (API write, watch, view worker, server-sent event, render), 30 times; and how many node
  cards re-rendered per update (1 = no full re-render);
- a burst of 100 pods: time until all 100 slices show, and the page's long tasks.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from gpulab.dashboard import headless, server
from gpulab.dashboard.hub import Hub
from gpulab.fakegpu import profiles
from gpulab.hami import annotations as ha
from gpulab.wait import wait_for
from harness.local import LocalCluster
from harness.ports import free_port
from harness.spec import parse

NODES = 100
GPUS = 8
PODS = 1000
UPDATES = 30
BURST = 100
PROFILE = "a100-sxm4-40gb-x8"
NAMESPACE = "bench-dashboard"
SPEC = {
    "name": "gpulab-bench-dashboard",
    "ports": {
        "apiserver": 17443,
        "etcd": 17379,
        "etcdPeer": 17380,
        "controllerManager": 17257,
        "scheduler": 17259,
    },
    "nodes": [{"name": "gpu", "count": NODES, "profile": PROFILE}],
}
Obj = dict[str, Any]


def registration(node: str) -> str:
    model = profiles.MODELS["A100-SXM4-40GB"]
    return ha.encode_node_devices(
        [
            ha.NodeDevice(
                profiles.gpu_uuid(node, i), i, ha.DEFAULT_SPLIT_COUNT, model.memory_mib, 100,
                ha.device_type(model.name), i // 4, True,
            )
            for i in range(GPUS)
        ]
    )  # fmt: skip


def bound_pod(name: str, node: str, gpu: int) -> Obj:
    share = ha.ContainerDevice(profiles.gpu_uuid(node, gpu), ha.DEVICE_TYPE, 2000, 10)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {
                ha.ASSIGNED_NODE: node,
                ha.DEVICES_ALLOCATED: ha.encode_pod_devices([[share]]),
                ha.BIND_PHASE: ha.BIND_SUCCESS,
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}},
                }
            ],
        },
    }


def slot(i: int) -> tuple[str, int]:
    """Pod i's node and GPU: round robin over every GPU of the cluster."""
    return f"gpu-{i % NODES}", (i // NODES) % GPUS


def selector(name: str, node: str, gpu: int) -> str:
    box = f'.node[data-node="{node}"] .gpu[data-uuid="{profiles.gpu_uuid(node, gpu)}"]'
    return f'{box} .slice[data-pod="{NAMESPACE}/{name}"]'


def _populate(api: client.ApiClient) -> float:
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    wait_for(lambda: core.list_namespaced_service_account(NAMESPACE).items, 60, "default SA")
    for n in range(NODES):
        name = f"gpu-{n}"
        core.patch_node(name, {"metadata": {"annotations": {ha.NODE_REGISTER: registration(name)}}})
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(
            pool.map(
                lambda i: core.create_namespaced_pod(NAMESPACE, bound_pod(f"p-{i}", *slot(i))),
                range(PODS),
            )
        )
    return time.monotonic() - start


def run() -> dict[str, Any]:
    local = LocalCluster(parse(SPEC))
    local.down(lambda _m: None)
    local.up(lambda _m: None)
    try:
        api = local.api()
        created_s = _populate(api)
        return {"created_s": created_s, **_measure(api)}
    finally:
        local.down(lambda _m: None)


def _measure(api: client.ApiClient) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    start = time.monotonic()
    hub = Hub(api, "bench").start()
    wait_for(
        lambda: (
            len(hub.fanout.keys("node:")) == NODES
            and sum(
                len(g["slices"])
                for k in hub.fanout.keys("node:")
                for g in hub.fanout.view(k)["gpus"]
            )
            == PODS
        ),
        120,
        "every node view with every slice",
        interval=0.05,
    )
    synced_s = time.monotonic() - start
    page_server = server.start(hub, free_port())
    try:
        with headless.browser(1600, 1200) as ctx:
            page = ctx.new_page()
            page.goto(page_server.url)
            page.wait_for_function(
                f"document.querySelectorAll('.gpu').length === {NODES * GPUS}"
                f" && document.querySelectorAll('.slice').length === {PODS}",
                timeout=120_000,
                polling=50,
            )
            first_paint_ms = page.evaluate("performance.now()")
            snapshot_kb = len(page.evaluate("document.documentElement.outerHTML")) / 1024

            latencies, renders = [], []
            for i in range(PODS, PODS + UPDATES):
                name, (node, gpu) = f"p-{i}", slot(i)
                before = page.evaluate("window.gpulab.renders.node")
                t0 = time.perf_counter()
                core.create_namespaced_pod(NAMESPACE, bound_pod(name, node, gpu))
                page.wait_for_selector(selector(name, node, gpu), timeout=10_000)
                latencies.append(time.perf_counter() - t0)
                page.wait_for_timeout(300)  # let kwok's status updates for the pod land too
                renders.append(page.evaluate("window.gpulab.renders.node") - before)

            page.evaluate(
                """window.longTasks = [];
                new PerformanceObserver((l) => window.longTasks.push(...l.getEntries()))
                  .observe({ type: "longtask" });"""
            )
            first = PODS + UPDATES
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(
                    pool.map(
                        lambda i: core.create_namespaced_pod(
                            NAMESPACE, bound_pod(f"p-{i}", *slot(i))
                        ),
                        range(first, first + BURST),
                    )
                )
            page.wait_for_function(
                f"document.querySelectorAll('.slice').length === {PODS + UPDATES + BURST}",
                timeout=60_000,
                polling=50,
            )
            burst_s = time.perf_counter() - t0
            long_tasks = page.evaluate("window.longTasks.map((t) => t.duration)")
    finally:
        page_server.stop()
    latencies.sort()
    return {
        "nodes": NODES,
        "gpus": NODES * GPUS,
        "pods": PODS,
        "synced_s": synced_s,
        "first_paint_ms": first_paint_ms,
        "dom_kb": snapshot_kb,
        "updates": UPDATES,
        "update_p50_ms": 1000 * statistics.median(latencies),
        "update_p95_ms": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
        "update_max_ms": 1000 * latencies[-1],
        "node_renders_per_update": statistics.mean(renders),
        "burst": BURST,
        "burst_s": burst_s,
        "long_tasks": len(long_tasks),
        "long_task_max_ms": max(long_tasks, default=0.0),
    }


def section(r: Obj) -> list[str]:
    return [
        "## Dashboard",
        "",
        f"{r['nodes']} kwok nodes x 8 GPUs ({r['gpus']} GPU boxes), {r['pods']:,} bound pods",
        "each holding a HAMi share (annotations as the extender's Bind leaves them), one",
        "dashboard process, Debian's headless Chromium on the same 2 cores.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| dashboard start → every view computed | {r['synced_s']:.1f} s |",
        f"| first paint: page load → {r['gpus']} GPU boxes and {r['pods']:,} slices in the DOM "
        f"| {r['first_paint_ms']:.0f} ms ({r['dom_kb']:.0f} kB of DOM) |",
        f"| update: create a pod → its slice in its GPU box (p50 / p95 / max of "
        f"{r['updates']}) | {r['update_p50_ms']:.0f} / {r['update_p95_ms']:.0f} / "
        f"{r['update_max_ms']:.0f} ms |",
        f"| node cards re-rendered per update | {r['node_renders_per_update']:.1f} "
        f"(of {r['nodes']}) |",
        f"| burst: {r['burst']} pods created at once → all slices shown | {r['burst_s']:.1f} s |",
        f"| long tasks (> 50 ms) on the page during the burst | {r['long_tasks']} "
        f"(longest {r['long_task_max_ms']:.0f} ms) |",
        "",
        "Each view (a node with its GPUs) is a signal of its own: a change to one node",
        "re-renders that node's card only, never the page. The update latency includes the",
        "API write, the watch, the view worker, the server-sent event and the render.",
    ]
