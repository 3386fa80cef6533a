"""Benchmark: the HAMi extender.

- ``/filter`` latency: the real app (``gpulab.hami.routes.build_app``) under uvicorn on
  127.0.0.1, an in-memory cluster of 10, 100 and 500 nodes registered exactly as the
  device plugin registers them (``node_devices`` → ``hami.io/node-nvidia-register``, 8x
  A100 or 4x T4 each, two vGPU pods already on every node); p50/p99 of POST /filter with
  every node as a candidate (nodeCacheCapable NodeNames), timed by the client.
- Scheduling throughput: a dedicated local cluster of 100 kwok nodes (50x 8x A100,
  50x 4x T4) with the ``hami`` addon, 500 pods created at once, timed from the first create
  to all pods Bound: plain ``nvidia.com/gpu: 1`` pods on the default scheduler (their
  namespace labelled ``hami.io/webhook=ignore``), then vGPU pods (``gpu: 1, gpumem: 3000,
  gpucores: 10``) through the webhook, kube-scheduler ``hami-scheduler`` and the
  extender's /filter and /bind. 100 device-plugin + node-agent processes are too heavy
  for 2 cores, so this process registers the nodes with the device plugin's own
  ``HamiRegistrar`` threads (annotation + handshake answers, as the plugin writes them)
  and no Allocate runs: the measure ends at Bound.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import uvicorn
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from demos import hami as demo
from gpulab.deviceplugin.hami import HamiRegistrar, node_devices
from gpulab.deviceplugin.rm import GPUInfo
from gpulab.fakegpu import profiles
from gpulab.hami import annotations as ha
from gpulab.hami.fake import FakeCluster
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.routes import build_app
from gpulab.hami.scheduler import Scheduler, SchedulerConfig
from gpulab.hami.score import NODE_POLICY_ANNOTATION, SPREAD
from gpulab.hami.webhook import WebhookConfig
from gpulab.trace import Tracer
from gpulab.wait import wait_for
from harness.local import LocalCluster
from harness.spec import parse

NODE_COUNTS = (10, 100, 500)
PROFILES = ("a100-sxm4-40gb-x8", "t4-x4")  # alternating, node by node
PODS = 500
CLUSTER_NODES = 100
TIMEOUT = 600.0
SPEC = {
    "name": "gpulab-bench-hami",
    "ports": {
        "apiserver": 39443,
        "etcd": 35379,
        "etcdPeer": 35380,
        "controllerManager": 33257,
        "scheduler": 33259,
    },
    "addons": ["hami"],
    "nodes": [
        {"name": "a100", "count": CLUSTER_NODES // 2, "profile": PROFILES[0]},
        {"name": "t4", "count": CLUSTER_NODES // 2, "profile": PROFILES[1]},
    ],
}
Obj = dict[str, Any]


def profile_gpus(node: str, profile: str) -> list[GPUInfo]:
    """The GPUs NVML (the shim) reports on ``node`` with ``profile``."""
    return [
        GPUInfo(
            index=g.index,
            uuid=profiles.gpu_uuid(node, g.index),
            name=g.model.name,
            memory_mib=g.model.memory_mib,
            compute_capability=g.model.compute_capability,
            minor=g.index,
            numa_node=g.numa_node,
        )
        for g in profiles.load(profile).gpus
    ]


def _quiet(component: str) -> Tracer:
    return Tracer(component, None, stream=io.StringIO())


# ------------------------------------------------------------------- /filter latency


def _world(nodes: int) -> tuple[Scheduler, list[str]]:
    cluster = FakeCluster()
    names = [f"node-{i}" for i in range(nodes)]
    for i, name in enumerate(names):
        gpus = profile_gpus(name, PROFILES[i % 2])
        devices = node_devices(gpus, lambda _uuid: True, ha.DEFAULT_SPLIT_COUNT)
        reported = ha.handshake_reported(dt.datetime.now(dt.UTC))
        annotations = {
            ha.NODE_REGISTER: ha.encode_node_devices(devices),
            ha.NODE_HANDSHAKE: reported,
        }
        cluster.add_node({"metadata": {"name": name, "annotations": annotations}})
        for j in range(2):  # two vGPU pods already on the node's first card
            share = ha.ContainerDevice(gpus[0].uuid, ha.DEVICE_TYPE, 3000, 20)
            pod_annos = {
                ha.ASSIGNED_NODE: name,
                ha.DEVICES_ALLOCATED: ha.encode_pod_devices([[share]]),
                ha.BIND_PHASE: ha.BIND_SUCCESS,
            }
            cluster.add_pod(
                {
                    "metadata": {
                        "name": f"{name}-{j}",
                        "namespace": "bench",
                        "annotations": pod_annos,
                    },
                    "spec": {"nodeName": name, "containers": []},
                    "status": {"phase": "Running"},
                }
            )
    pod = demo.vgpu_pod("probe", 3000, 30)
    pod["metadata"].update(namespace="bench", uid="uid-probe")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    pod["spec"]["containers"][0]["resources"]["requests"] = dict(limits)
    cluster.add_pod(pod)
    scheduler = Scheduler(cluster, SchedulerConfig(), _quiet("hami-scheduler"))
    cluster.connect(scheduler)
    scheduler.register_from_node_annotations()
    return scheduler, names


def _serve(scheduler: Scheduler) -> tuple[uvicorn.Server, str]:
    app = build_app(scheduler, WebhookConfig(), ExtenderMetrics(scheduler))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    wait_for(lambda: server.started, 10, "uvicorn to start", interval=0.01)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def filter_latency(nodes: int, requests: int) -> dict[str, float]:
    scheduler, names = _world(nodes)
    server, url = _serve(scheduler)
    probe = scheduler.cluster.get_pod("bench", "probe")
    body = json.dumps({"Pod": probe, "Nodes": None, "NodeNames": names})
    times = []
    # one connection per request: a kept-alive one waits out a 40 ms delayed ACK here
    with httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        for i in range(requests + 10):
            start = time.perf_counter()
            r = http.post(url + "/filter", content=body)
            elapsed = time.perf_counter() - start
            result = r.json()
            if r.status_code != 200 or result.get("Error") or len(result["NodeNames"]) != 1:
                raise RuntimeError(f"/filter over {nodes} nodes: {r.status_code} {r.text[:200]}")
            if i >= 10:  # the first ones warm up
                times.append(elapsed * 1000)
    server.should_exit = True
    q = statistics.quantiles(times, n=100)
    return {"nodes": nodes, "requests": requests, "p50_ms": q[49], "p99_ms": q[98]}


# ------------------------------------------------------------- scheduling throughput


def _create_all(api: client.ApiClient, ns: str, pods: list[Obj]) -> float:
    core = client.CoreV1Api(api)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda p: core.create_namespaced_pod(ns, p), pods))
    return time.monotonic() - start


def _bound(api: client.ApiClient, ns: str) -> int:
    resp = client.CoreV1Api(api).list_namespaced_pod(
        ns, field_selector="spec.nodeName!=", _preload_content=False
    )
    return len(json.loads(resp.data)["items"])


def _schedule(api: client.ApiClient, ns: str, pods: list[Obj], labels: dict[str, str]) -> Obj:
    core = client.CoreV1Api(api)
    meta = client.V1ObjectMeta(name=ns, labels=labels)
    core.create_namespace(client.V1Namespace(metadata=meta))
    wait_for(lambda: core.list_namespaced_service_account(ns).items, 30, "default ServiceAccount")
    start = time.monotonic()
    created = {"s": 0.0}
    creator = threading.Thread(target=lambda: created.update(s=_create_all(api, ns, pods)))
    creator.start()
    wait_for(lambda: _bound(api, ns) == len(pods), TIMEOUT, f"{len(pods)} pods bound in {ns}", 0.25)
    bound = time.monotonic() - start
    creator.join()
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 120, f"pods of {ns} to go", 1.0)
    return {
        "pods": len(pods),
        "created_s": created["s"],
        "bound_s": bound,
        "pods_per_s": len(pods) / bound,
    }


def _plain_pod(name: str) -> Obj:
    pod = demo.vgpu_pod(name, 0, 0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return pod


def _bind_errors(metrics_url: str) -> int:
    """Binds the extender has failed so far (``hami_scheduler_bind_total{result="error"}``)."""
    for family in text_string_to_metric_families(httpx.get(metrics_url + "/metrics").text):
        for sample in family.samples:
            if sample.name == "hami_scheduler_bind_total" and sample.labels["result"] == "error":
                return int(sample.value)
    return 0


def _spread_pod(name: str) -> Obj:
    """A vGPU pod whose node policy is spread: consecutive pods bind on different nodes."""
    pod = demo.vgpu_pod(name, 3000, 10)
    pod["metadata"]["annotations"][NODE_POLICY_ANNOTATION] = SPREAD
    return pod


def throughput(progress: Callable[[str], None] = print) -> Obj:
    local = LocalCluster(parse(SPEC))
    local.down(lambda _m: None)
    local.up(progress)
    registrars = []
    try:
        api = local.api()
        for node in local.spec.nodes:
            assert node.profile
            reg = HamiRegistrar(
                api,
                node.name,
                profile_gpus(node.name, node.profile),
                lambda _uuid: True,
                ha.DEFAULT_SPLIT_COUNT,
                _quiet("device-plugin"),
            )
            reg.start()
            registrars.append(reg)
        cards = sum(len(profiles.load(n.profile).gpus) for n in local.spec.nodes if n.profile)
        urls = demo.extender_urls(local.spec)
        assert urls is not None
        wait_for(
            lambda: httpx.get(urls[1] + "/metrics").text.count("GPUDeviceCoreLimit{") == cards,
            120,
            f"the extender to register {cards} GPUs",
            1.0,
        )
        progress(f"{CLUSTER_NODES} nodes, {cards} GPUs registered; scheduling {PODS} plain pods")
        plain = _schedule(
            api,
            "bench-plain",
            [_plain_pod(f"p-{i}") for i in range(PODS)],
            {"hami.io/webhook": "ignore"},
        )
        progress(f"plain: {plain['pods_per_s']:.1f} pods/s; scheduling {PODS} vGPU pods")
        errors = _bind_errors(urls[1])
        vgpu = _schedule(
            api, "bench-hami", [demo.vgpu_pod(f"v-{i}", 3000, 10) for i in range(PODS)], {}
        )
        vgpu["bind_errors"] = _bind_errors(urls[1]) - errors
        errors += vgpu["bind_errors"]
        progress(f"vGPU: {vgpu['pods_per_s']:.1f} pods/s; again with nodes spread")
        spread = _schedule(
            api, "bench-hami-spread", [_spread_pod(f"s-{i}") for i in range(PODS)], {}
        )
        spread["bind_errors"] = _bind_errors(urls[1]) - errors
        progress(f"vGPU, nodes spread: {spread['pods_per_s']:.1f} pods/s")
        return {
            "nodes": CLUSTER_NODES,
            "gpus": cards,
            "plain": plain,
            "hami": vgpu,
            "hami_spread": spread,
            "ratio": vgpu["pods_per_s"] / plain["pods_per_s"],
            "ratio_spread": spread["pods_per_s"] / plain["pods_per_s"],
        }
    finally:
        for reg in registrars:
            reg.stop()
        local.down(lambda _m: None)


def run() -> Obj:
    latency = [filter_latency(n, 300 if n < 500 else 150) for n in NODE_COUNTS]
    return {"filter": latency, "throughput": throughput()}


def section(r: Obj) -> list[str]:
    t = r["throughput"]
    lines = [
        "## HAMi extender",
        "",
        "`/filter` latency: the real app under uvicorn, in-memory cluster whose nodes are",
        "registered as the device plugin registers them (8x A100 or 4x T4, two vGPU pods",
        "per node), every node a candidate; timed by an HTTP client on the same host.",
        "",
        "| nodes | requests | p50 | p99 |",
        "|---|---|---|---|",
        *(
            f"| {f['nodes']} | {f['requests']} | {f['p50_ms']:.1f} ms | {f['p99_ms']:.1f} ms |"
            for f in r["filter"]
        ),
        "",
        f"Scheduling {t['hami']['pods']} pods on {t['nodes']} kwok nodes ({t['gpus']} GPUs), "
        "first create → all Bound:",
        "",
        "| pods | scheduler | created in | all Bound in | pods/s |",
        "|---|---|---|---|---|",
        f"| `nvidia.com/gpu: 1` | default-scheduler | {t['plain']['created_s']:.1f} s | "
        f"{t['plain']['bound_s']:.1f} s | {t['plain']['pods_per_s']:.1f} |",
        f"| `gpu: 1, gpumem: 3000, gpucores: 10` | hami-scheduler + extender | "
        f"{t['hami']['created_s']:.1f} s | {t['hami']['bound_s']:.1f} s | "
        f"{t['hami']['pods_per_s']:.1f} |",
        f"| the same, `hami.io/node-scheduler-policy: spread` | hami-scheduler + extender | "
        f"{t['hami_spread']['created_s']:.1f} s | {t['hami_spread']['bound_s']:.1f} s | "
        f"{t['hami_spread']['pods_per_s']:.1f} |",
        "",
        f"HAMi / default throughput: **{t['ratio']:.2f}** (nodes binpack, the default), "
        f"{t['ratio_spread']:.2f} with nodes spread.",
        "Under binpack every pod Filter picks lands on the same (fullest) node, so their Binds",
        "queue for that node's `hami.io/mutex.lock` (the extender waits up to 2 s, then fails",
        "the Bind and kube-scheduler retries the pod); spread sends consecutive pods to",
        "different nodes. Failed Binds (the extender's `hami_scheduler_bind_total`): "
        f"{t['hami']['bind_errors']} under binpack, "
        f"{t['hami_spread']['bind_errors']} under spread.",
        "",
        "The 100 nodes' HAMi registrations are written by the device plugin's own",
        "`HamiRegistrar` threads in the benchmark process (100 plugin + node-agent processes do",
        "not fit 2 cores): same annotation, same handshake answers. No Allocate runs, so the",
        "measure ends at Bound.",
    ]
    return lines
