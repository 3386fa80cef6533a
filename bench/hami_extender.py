"""Benchmark: the HAMi extender (HAMi v2.10.0 semantics).

- ``/filter`` latency: the real app (``gpulab.hami.routes.build_app``) under uvicorn on
  127.0.0.1 (configured as the extender runs it, ``server.UVICORN``), in a process of its
  own as the extender is, over an in-memory API server with 10, 100 and 500 nodes
  registered exactly as the device plugin registers them (``node_devices`` →
  ``hami.io/node-nvidia-register``, 8x A100 or 4x T4 each, two vGPU pods already on every
  node); one vGPU pod filtered over and over with every node a candidate
  (nodeCacheCapable NodeNames), as kube-scheduler retries it. The client (``http.client``,
  in this process, as kube-scheduler is a process of its own) keeps its connection alive
  with TCP_NODELAY, as kube-scheduler's Go client does; timed by the client. Beside it,
  the time inside ``filter()`` alone in the server's process, and the server process's
  CPU time per request.
- The whole chain: a dedicated local cluster of 100 kwok nodes (50x 8x A100, 50x 4x T4)
  with the ``hami`` addon (the ``hami-scheduler`` pod under the pod runner); 500 pods
  created at once. Plain ``nvidia.com/gpu: 1`` pods on the default scheduler (namespace
  labelled ``hami.io/webhook=ignore``), timed to all Bound; vGPU pods (``gpu: 1, gpumem:
  3000, gpucores: 10``) through the webhook, kube-scheduler ``hami-scheduler`` and the
  extender's /filter and /bind, with HAMi's lock semantics: Bind takes
  ``hami.io/mutex.lock`` and only the device plugin's Allocate releases it. 100 plugin +
  node-agent processes do not fit 2 cores, so this process plays kubelet + device plugin
  for every node: it advertises each node's vGPU shares (as kubelet after ListAndWatch),
  the plugin's own ``HamiRegistrar`` registers each node's GPUs, and a pod informer calls
  the plugin's own ``HamiAllocator.allocate`` (one thread per node) as soon as a pod is
  bound; timed to all allocated (``hami.io/bind-phase=success``, lock released), from
  that same pod watch. Runs: nodes spread, nodes binpack; with ``experiments`` also
  binpack with the lab experiment ``--gpulab-lock-retry-all`` and spread with
  ``--gpulab-async-filter-patch`` (otherwise their last figures are kept, dated).
- Memory: the extender's caches (informer stores + scheduler) at 500 nodes x 8 GPUs with
  4,000 vGPU pods, measured as the RSS of a fresh process that builds them.
"""

from __future__ import annotations

import io
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from demos import hami as demo
from gpulab.deviceplugin.hami import HamiAllocator, HamiRegistrar, node_devices
from gpulab.deviceplugin.rm import Device, GPUInfo
from gpulab.fakegpu import profiles
from gpulab.hami import annotations as ha
from gpulab.hami import filter as filter_mod
from gpulab.hami.cluster import KubeCluster
from gpulab.hami.events import SchedulerEvents
from gpulab.hami.fake import FakeCluster
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.routes import build_app
from gpulab.hami.scheduler import Scheduler, SchedulerConfig
from gpulab.hami.score import NODE_POLICY_ANNOTATION, SPREAD
from gpulab.hami.server import UVICORN, listen, tune_gc
from gpulab.hami.webhook import WebhookConfig
from gpulab.informer import PODS as POD_RESOURCE
from gpulab.informer import SYNCED, Delta, ListWatch, follow
from gpulab.kube import api_client
from gpulab.state import cluster_dir
from gpulab.trace import Tracer
from gpulab.wait import wait_for
from harness.addons import hami as hami_addon
from harness.apply import MANIFESTS, load_documents
from harness.backends import SYSTEM_NAMESPACE, Backend, get_backend, pod_ready
from harness.podrunner.runtime import find_leftovers
from harness.spec import parse

NODE_COUNTS = (10, 100, 500)
PROFILES = ("a100-sxm4-40gb-x8", "t4-x4")  # alternating, node by node
PODS = 500
CLUSTER_NODES = 100
TIMEOUT = 900.0
RSS_NODES, RSS_PODS = 500, 4000
WARM_UP = 20  # requests not timed
SAVED = Path(__file__).resolve().parent / "reports" / "hami_extender.json"
SPEC = {
    "name": "gpulab-bench-hami",
    "ports": {
        "apiserver": 10443,
        "etcd": 10379,
        "etcdPeer": 10380,
        "controllerManager": 10257,
        "scheduler": 10259,
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


class _Discard:
    """events.k8s.io as the Tracer calls it, dropping what it is given."""

    def create_namespaced_event(self, namespace: str, event: object) -> None:
        pass

    def patch_namespaced_event(self, name: str, namespace: str, body: Obj) -> None:
        pass


def _quiet_scheduler(cluster: FakeCluster) -> Scheduler:
    events = SchedulerEvents(None, "bench", io.StringIO())
    events.trace._events = _Discard()  # the Tracer still builds and aggregates each Event
    return Scheduler(cluster, SchedulerConfig(scheduler_name="hami-scheduler"), events)


# ------------------------------------------------------------------- /filter latency


def world(nodes: int, pods_per_node: int = 2) -> tuple[FakeCluster, Scheduler, list[str]]:
    """An in-memory cluster of ``nodes`` registered nodes with vGPU pods on them."""
    cluster = FakeCluster()
    names = [f"node-{i}" for i in range(nodes)]
    for i, name in enumerate(names):
        gpus = profile_gpus(name, PROFILES[i % 2])
        devices = node_devices(gpus, lambda _uuid: True, ha.DEFAULT_SPLIT_COUNT)
        cluster.add_node(
            {
                "metadata": {
                    "name": name,
                    "annotations": {ha.NODE_REGISTER: ha.encode_node_devices(devices)},
                },
                "status": {"allocatable": {"nvidia.com/gpu": str(len(gpus) * 10)}},
            }
        )
        for j in range(pods_per_node):
            share = ha.ContainerDevice(gpus[j % len(gpus)].uuid, ha.DEVICE_TYPE, 3000, 10)
            pod = demo.vgpu_pod(f"{name}-{j}", 3000, 10)
            pod["metadata"].update(namespace="bench", annotations={
                ha.ASSIGNED_NODE: name,
                ha.DEVICES_ALLOCATED: ha.encode_pod_devices([[share]]),
                ha.BIND_PHASE: ha.BIND_SUCCESS,
            })  # fmt: skip
            pod["spec"]["nodeName"] = name
            pod["status"] = {"phase": "Running"}
            cluster.add_pod(pod)
    scheduler = _quiet_scheduler(cluster)
    cluster.connect(scheduler)
    scheduler.register()
    return cluster, scheduler, names


def _serve(scheduler: Scheduler) -> tuple[uvicorn.Server, socket.socket]:
    app = build_app(scheduler, WebhookConfig(), ExtenderMetrics(scheduler))
    sock = listen(("127.0.0.1", 0), "--http_bind")  # as the extender binds: TCP_NODELAY
    server = uvicorn.Server(uvicorn.Config(app, **UVICORN))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    wait_for(lambda: server.started, 10, "uvicorn to start", interval=0.01)
    return server, sock


def _quantiles(times: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(times, n=100)
    return q[49], q[98]


def serve_child(nodes: int, requests: int) -> None:
    """In a fresh process, as the extender runs: build the world of ``nodes`` nodes, time
    ``filter()`` alone, serve the app, print one JSON line (port, the request body
    kube-scheduler would send, the in-process timings) and serve until stdin closes."""
    cluster, scheduler, names = world(nodes)
    probe = demo.vgpu_pod("probe", 3000, 30)
    probe["metadata"]["namespace"] = "bench"
    cluster.add_pod(probe)
    tune_gc()  # as the extender does once its caches are built (server.start)
    key = ("bench", "probe")
    inner = []
    for i in range(requests + WARM_UP):
        # kube-scheduler sends the pod as it is now (with the last Filter's annotations)
        args = {"Pod": cluster.pods[key], "Nodes": None, "NodeNames": names}
        start = time.perf_counter()
        filter_mod.filter(scheduler, args)
        if i >= WARM_UP:
            inner.append((time.perf_counter() - start) * 1000)
    _server, sock = _serve(scheduler)
    body = json.dumps({"Pod": cluster.pods[key], "Nodes": None, "NodeNames": names})
    print(json.dumps({"port": sock.getsockname()[1], "body": body, "filter_ms": inner}))
    sys.stdout.flush()
    sys.stdin.read()  # until the parent closes it


def filter_latency(nodes: int, requests: int) -> Obj:
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.hami_extender", "--serve", str(nodes), str(requests)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = json.loads(child.stdout.readline())
        body = ready["body"].encode()
        http = HTTPConnection("127.0.0.1", ready["port"], timeout=30)
        http.connect()
        assert http.sock is not None
        http.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go's net/http
        headers = {"Content-Type": "application/json"}
        http_times = []
        cpu_before = 0.0
        for i in range(requests + WARM_UP):
            if i == WARM_UP:
                cpu_before = _cpu_seconds(child.pid)
            start = time.perf_counter()
            http.request("POST", "/filter", body, headers)
            resp = http.getresponse()
            raw = resp.read()
            elapsed = time.perf_counter() - start
            result = json.loads(raw)
            if resp.status != 200 or result.get("Error") or len(result["NodeNames"]) != 1:
                raise RuntimeError(f"/filter over {nodes} nodes: {resp.status} {raw[:200]!r}")
            if i >= WARM_UP:
                http_times.append(elapsed * 1000)
        cpu = _cpu_seconds(child.pid) - cpu_before
        http.close()
    finally:
        child.communicate(timeout=60)
    p50, p99 = _quantiles(http_times)
    in50, in99 = _quantiles(ready["filter_ms"])
    return {
        "nodes": nodes,
        "requests": requests,
        "p50_ms": p50,
        "p99_ms": p99,
        "filter_p50_ms": in50,
        "filter_p99_ms": in99,
        # the server process's CPU (all threads) per timed request: robust to a busy machine
        "server_cpu_ms": 1000 * cpu / requests,
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- memory


def rss_child() -> None:
    """In a fresh process: build the caches of 500 nodes x 8 GPUs and 4,000 pods."""
    base = _rss_mib()
    cluster = FakeCluster()
    per_node = RSS_PODS // RSS_NODES
    for i in range(RSS_NODES):
        name = f"node-{i}"
        gpus = profile_gpus(name, PROFILES[0])
        devices = node_devices(gpus, lambda _uuid: True, ha.DEFAULT_SPLIT_COUNT)
        cluster.add_node(
            {
                "metadata": {
                    "name": name,
                    "annotations": {ha.NODE_REGISTER: ha.encode_node_devices(devices)},
                },
                "status": {"allocatable": {"nvidia.com/gpu": "80"}},
            }
        )
    scheduler = _quiet_scheduler(cluster)
    cluster.connect(scheduler)
    scheduler.register()
    for i in range(RSS_NODES):
        name = f"node-{i}"
        for j in range(per_node):
            pod = demo.vgpu_pod(f"{name}-{j}", 3000, 10)
            pod["metadata"]["namespace"] = "bench"
            pod = cluster.add_pod(pod)
            filter_mod.filter(scheduler, {"Pod": pod, "Nodes": None, "NodeNames": [name]})
    assert len(scheduler.pods) == RSS_PODS, len(scheduler.pods)
    print(json.dumps({"baseline_mib": base, "rss_mib": _rss_mib(), "pods": len(scheduler.pods)}))


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory() -> Obj:
    out = subprocess.run(
        [sys.executable, "-m", "bench.hami_extender", "--rss"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return {"nodes": RSS_NODES, "gpus": RSS_NODES * 8, **data}


# ------------------------------------------------------------------- the whole chain


class Kubelets:
    """Kubelet + the HAMi device plugin of every node, in this process: when a pod is bound
    to a node, that node's plugin Allocates it (one worker per node, as kubelets are)."""

    def __init__(self, api: client.ApiClient, nodes: dict[str, list[GPUInfo]]) -> None:
        cluster = KubeCluster(api)
        tracer = Tracer("device-plugin", None, stream=io.StringIO())
        self.plugins = {
            n: HamiAllocator(client.CoreV1Api(api), n, tracer, cluster=cluster) for n in nodes
        }
        self.devices = {
            n: {
                f"{g.uuid}::{r}": Device(
                    f"{g.uuid}::{r}", g.uuid, g.index, (f"/dev/nvidia{g.index}",), 0, r
                )
                for g in gpus
                for r in range(ha.DEFAULT_SPLIT_COUNT)
            }
            for n, gpus in nodes.items()
        }
        self.workers = {n: ThreadPoolExecutor(max_workers=1) for n in nodes}
        self.done: set[str] = set()
        # when each pod was first seen bound / allocated, by namespace: the runs are timed
        # from the watch this process keeps anyway (polling with LISTs would load the API
        # server under measurement)
        self.bound_at: dict[str, dict[str, float]] = defaultdict(dict)
        self.allocated_at: dict[str, dict[str, float]] = defaultdict(dict)
        self.failed = 0
        self._stop = threading.Event()
        self._api = api

    def register(self, nodes: dict[str, list[GPUInfo]]) -> None:
        """Each node advertises its vGPU shares (kubelet after ListAndWatch) and its plugin
        writes its ``hami.io/node-nvidia-register`` (RegisterInAnnotation)."""
        cluster = KubeCluster(self._api)
        tracer = Tracer("device-plugin", None, stream=io.StringIO())
        core = client.CoreV1Api(self._api)
        for node, gpus in nodes.items():
            shares = str(len(gpus) * ha.DEFAULT_SPLIT_COUNT)  # what ListAndWatch advertises
            gpu = {"nvidia.com/gpu": shares}
            core.patch_node_status(node, {"status": {"capacity": gpu, "allocatable": gpu}})
            HamiRegistrar(
                self._api, node, gpus, lambda _u: True, ha.DEFAULT_SPLIT_COUNT, tracer, cluster
            ).RegisterInAnnotation()

    def start(self) -> Kubelets:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for w in self.workers.values():
            w.shutdown(wait=False, cancel_futures=True)

    def _watch(self) -> None:
        for delta in follow(ListWatch(self._api, POD_RESOURCE), self._stop):
            self._on(delta)

    def _on(self, delta: Delta) -> None:
        if delta.type == SYNCED:
            return
        pod = delta.obj
        meta, node = pod["metadata"], (pod.get("spec") or {}).get("nodeName")
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        annos = meta.get("annotations") or {}
        if delta.type != "DELETED":
            now, ns, name = time.monotonic(), meta.get("namespace"), meta.get("name")
            if node:
                self.bound_at[ns].setdefault(name, now)
            if annos.get(ha.BIND_PHASE) == ha.BIND_SUCCESS:
                self.allocated_at[ns].setdefault(name, now)
        if delta.type == "DELETED" or node not in self.plugins or key in self.done:
            return
        if annos.get(ha.BIND_PHASE) != ha.BIND_ALLOCATING:
            return
        self.done.add(key)
        self.workers[node].submit(self._allocate, node, annos.get(ha.DEVICES_TO_ALLOCATE, ""))

    def _allocate(self, node: str, to_allocate: str) -> None:
        devices, used = self.devices[node], set()
        requests = []
        for ctr in (c for c in ha.decode_pod_devices(to_allocate) if c):
            ids = []
            for share in ctr:
                rid = next(i for i, d in devices.items() if d.uuid == share.uuid and i not in used)
                used.add(rid)
                ids.append(rid)
            requests.append(ids)
        try:
            for ids in requests:  # kubelet asks container by container
                self.plugins[node].allocate([ids], devices)
        except Exception:  # counted; the pod stays unallocated and the run times out
            self.failed += 1


class ExtenderProbe:
    """What the extender did during one run: failed Binds, time per Filter and Bind (the
    lab's ``gpulab_extender_*`` metrics) and the CPU its process used."""

    def __init__(self, metrics_url: str, pid: int) -> None:
        self.url, self.pid = metrics_url, pid
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(httpx.get(self.url + "/metrics").text):
            for s in family.samples:
                route, result = s.labels.get("route"), s.labels.get("result")
                if (
                    s.name == "gpulab_extender_requests_total"
                    and s.labels.get("outcome") == "error"
                ):
                    out[f"{route}_errors"] = out.get(f"{route}_errors", 0) + s.value
                elif s.name.startswith("gpulab_extender_request_duration_seconds_") and result:
                    kind = s.name.rsplit("_", 1)[1]  # sum or count
                    out[f"{route}_{kind}"] = out.get(f"{route}_{kind}", 0) + s.value
        out["cpu_s"] = _cpu_seconds(self.pid)
        out["t"] = time.monotonic()
        return out

    def result(self) -> Obj:
        end = self._read()

        def delta(key: str) -> float:
            return end.get(key, 0) - self._start.get(key, 0)

        def mean_ms(route: str) -> float:
            return 1000 * delta(f"{route}_sum") / max(delta(f"{route}_count"), 1)

        return {
            "bind_errors": int(delta("bind_errors")),
            "filter_ms": mean_ms("filter"),
            "bind_ms": mean_ms("bind"),
            "extender_cpu": delta("cpu_s") / max(delta("t"), 1e-9),
        }


def _component(pid: int, cmdline: list[str], in_pod: bool) -> str:
    """What a process of the cluster is, for the CPU table."""
    if pid == os.getpid():
        return "this process: creates the pods, kubelets + Allocate"
    exe = Path(cmdline[0]).name
    if exe == "kube-scheduler":
        return "kube-scheduler (hami-scheduler pod)" if in_pod else "kube-scheduler (default)"
    if not exe.startswith("python"):
        return exe
    for word, name in (
        ("extender", "HAMi extender (webhook, Filter, Bind)"),
        ("pod-runner", "pod runner"),
        ("node-agent", "node agents"),
    ):
        if word in cmdline:
            return name
    return "other lab processes"


class ClusterProbe:
    """Where one run's work went, from the same run: the API server's requests
    (``apiserver_request_total`` by verb and resource) and the CPU time of every process
    of the cluster (its directory in the command line or, for pod containers, in the
    environment), this process included. The processes are found once, before the
    window opens, so that opening and closing it reads only their ``stat``."""

    def __init__(self, api: client.ApiClient, cluster_dir: Path) -> None:
        self.api, self.marker = api, str(cluster_dir)
        self._requests = self._api_requests()
        self._components = self._find()
        self._cpu = self._cpu_by_component()
        self._t = time.monotonic()

    def _api_requests(self) -> dict[str, float]:
        resp = self.api.call_api(
            "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False
        )
        out: dict[str, float] = defaultdict(float)
        for family in text_string_to_metric_families(resp.data.decode()):
            for s in family.samples:
                if s.name != "apiserver_request_total":
                    continue
                kind = s.labels.get("resource") or s.labels.get("subresource") or "-"
                if s.labels.get("subresource") and s.labels.get("resource"):
                    kind += "/" + s.labels["subresource"]
                out[f"{s.labels.get('verb')} {kind}"] += s.value
        return out

    def _find(self) -> dict[int, str]:
        """pid -> component, for the processes of the cluster running now."""
        in_pods = set(find_leftovers(Path(self.marker)))  # the pod runner's containers
        found: dict[int, str] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue  # gone meanwhile
            pid = int(entry.name)
            in_pod = pid in in_pods
            if in_pod or pid == os.getpid() or any(self.marker in a for a in cmdline):
                found[pid] = _component(pid, cmdline, in_pod)
        return found

    def _cpu_by_component(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, component in self._components.items():
            try:
                out[component] += _cpu_seconds(pid)
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
        return out

    def result(self, pods: int) -> Obj:
        cpu, window = self._cpu_by_component(), time.monotonic() - self._t
        requests = self._api_requests()
        per_pod = {
            k: (v - self._requests.get(k, 0.0)) / pods
            for k, v in requests.items()
            if v - self._requests.get(k, 0.0) >= 0.05 * pods
        }
        used = {k: max(v - self._cpu.get(k, 0.0), 0.0) for k, v in cpu.items()}
        return {
            "requests_per_pod": per_pod,
            "cpu_ms_per_pod": {k: 1000 * v / pods for k, v in used.items() if v > 0},
            "cores_busy": sum(used.values()) / window,
        }


def _schedule(
    api: client.ApiClient,
    kubelets: Kubelets,
    ns: str,
    pods: list[Obj],
    labels: dict[str, str],
    allocated: bool,
    cluster: Path,
) -> Obj:
    """Create ``pods`` at once (8 in flight) in a new namespace; done when all are bound
    (``allocated`` False) or allocated by the device plugin (True), as the watch sees it.
    The work of ``cluster``'s processes is measured from the first create to done."""
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=labels)))
    wait_for(lambda: core.list_namespaced_service_account(ns).items, 30, "default ServiceAccount")
    bound, done = (
        kubelets.bound_at[ns],
        (kubelets.allocated_at if allocated else kubelets.bound_at)[ns],
    )
    probe = ClusterProbe(api, cluster)
    start = time.monotonic()
    marks: dict[str, float] = {}

    def create_all() -> None:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda p: core.create_namespaced_pod(ns, p), pods))
        marks["created"] = time.monotonic() - start

    creator = threading.Thread(target=create_all)
    creator.start()
    wait_for(lambda: len(done) == len(pods), TIMEOUT, f"{len(pods)} pods done in {ns}", 0.05)
    finished = max(done.values()) - start
    work = probe.result(len(pods))
    creator.join()
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(ns).items, 120, f"pods of {ns} to go", 1.0)
    return {
        "pods": len(pods),
        "created_s": marks["created"],
        "bound_s": max(bound.values()) - start,
        "done_s": finished,
        "pods_per_s": len(pods) / finished,
        **work,
    }


def _plain_pod(name: str) -> Obj:
    pod = demo.vgpu_pod(name, 0, 0)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    return pod


def _vgpu_pod(name: str, node_policy: str | None) -> Obj:
    pod = demo.vgpu_pod(name, 3000, 10)
    if node_policy:
        pod["metadata"]["annotations"][NODE_POLICY_ANNOTATION] = node_policy
    return pod


def _restart_extender(backend: Backend, flag: str) -> None:
    """Roll the hami-scheduler Deployment out with ``flag`` added to the extender's
    command (the manifest's command + the flag), then wait for the new pod to register."""
    apps = client.AppsV1Api(backend.api())
    manifest = next(
        d
        for d in load_documents([MANIFESTS / "hami" / "deployment.yaml"])
        if d["kind"] == "Deployment"
    )
    ctr = next(
        c for c in manifest["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    )
    patch = {"name": "extender", "command": [*ctr["command"], flag]}
    apps.patch_namespaced_deployment(
        hami_addon.COMPONENT,
        SYSTEM_NAMESPACE,
        {"spec": {"template": {"spec": {"containers": [patch]}}}},
    )

    def rolled_out() -> bool:
        pods = backend.component_pods(hami_addon.COMPONENT)
        return (
            len(pods) == 1
            and pod_ready(pods[0])
            and any(flag in (c.command or []) for c in pods[0].spec.containers)
        )

    wait_for(rolled_out, 120, f"the hami-scheduler pod with {flag}", 0.5)


# label -> (scheduler's pods, node policy annotation, extender flag of the experiment)
RUNS: dict[str, tuple[str, str | None, str | None]] = {
    "plain": ("plain", None, None),
    "spread": ("vgpu", SPREAD, None),
    "binpack": ("vgpu", None, None),
    "binpack_wait": ("vgpu", None, "--gpulab-lock-retry-all"),
    "spread_async": ("vgpu", SPREAD, "--gpulab-async-filter-patch"),
}
MAIN_RUNS = ("plain", "spread", "binpack")
EXPERIMENTS = ("binpack_wait", "spread_async")


class Chain:
    """The dedicated cluster of the whole-chain runs, with this process's kubelets."""

    def __init__(self, backend: Backend, progress: Callable[[str], None]) -> None:
        self.backend = backend
        self.api = backend.api()
        self.cluster_dir = cluster_dir(backend.spec.name)
        nodes = {n.name: profile_gpus(n.name, n.profile) for n in backend.spec.nodes if n.profile}
        self.cards = sum(len(g) for g in nodes.values())
        ext = hami_addon.extender(backend)
        assert ext is not None
        self.metrics_url = ext.metrics
        # each node's plugin has a connection of its own, as separate processes would
        self.kubelets = Kubelets(
            api_client(backend.kubeconfig, connections=CLUSTER_NODES + 16), nodes
        )
        self.kubelets.register(nodes)
        self.wait_registered(f"the extender to register {self.cards} GPUs")
        self.kubelets.start()
        progress(f"{CLUSTER_NODES} nodes, {self.cards} GPUs registered")

    def wait_registered(self, what: str) -> None:
        wait_for(
            lambda: (
                httpx.get(self.metrics_url + "/metrics").text.count("hami_gpu_core_limit_ratio{")
                == self.cards
            ),
            120,
            what,
            1.0,
        )

    def run(self, label: str, suffix: str = "") -> Obj:
        kind, policy, flag = RUNS[label]
        ns = f"bench-{label.replace('_', '-')}{suffix}"
        if kind == "plain":
            pods = [_plain_pod(f"p-{i}") for i in range(PODS)]
            ignore = {"hami.io/webhook": "ignore"}
            return _schedule(self.api, self.kubelets, ns, pods, ignore, False, self.cluster_dir)
        if flag:
            _restart_extender(self.backend, flag)
            self.wait_registered("the restarted extender to register the GPUs")
        probe = ExtenderProbe(self.metrics_url, hami_addon.extender_pid(self.backend))
        pods = [_vgpu_pod(f"v-{i}", policy) for i in range(PODS)]
        out = _schedule(self.api, self.kubelets, ns, pods, {}, True, self.cluster_dir)
        out.update(probe.result())
        return out


def throughput(experiments: bool = False, progress: Callable[[str], None] = print) -> Obj:
    """The main runs (default scheduler, spread, binpack) on a fresh cluster; with
    ``experiments`` also the lab experiments, each with the extender rolled out again under
    its flag."""
    backend = get_backend("local", parse(SPEC))
    backend.down(lambda _m: None)
    backend.up(progress)
    chain = None
    try:
        chain = Chain(backend, progress)
        runs: Obj = {"load_before": os.getloadavg()[0]}
        for label in (*MAIN_RUNS, *(EXPERIMENTS if experiments else ())):
            runs[label] = chain.run(label)
            runs[label]["load"] = os.getloadavg()[0]  # the last minute's, at its end
            progress(f"{label}: {runs[label]['pods_per_s']:.1f} pods/s")
        runs["plugin_failures"] = chain.kubelets.failed
        return {"nodes": CLUSTER_NODES, "gpus": chain.cards, **runs}
    finally:
        if chain is not None:
            chain.kubelets.stop()
        backend.down(lambda _m: None)


def run(experiments: bool = False) -> Obj:
    """Every measure; the lab experiments' chain runs only with ``experiments`` (they take
    minutes: `python -m bench.run --hami-experiments hami_extender`), else their figures
    are carried over from the last report that has them, with that run's date."""
    latency = []
    for n in NODE_COUNTS:
        load = os.getloadavg()[0]
        latency.append({**filter_latency(n, 400 if n < 500 else 200), "load": load})
    out = {"filter": latency, "memory": memory(), "throughput": throughput(experiments)}
    if not experiments:
        earlier = _earlier_experiments()
        if earlier:
            out["earlier_experiments"] = earlier
    return out


def _earlier_experiments() -> Obj | None:
    """The experiment rows of the saved report (and that run's default-scheduler rate)."""
    try:
        old = json.loads(SAVED.read_text())
    except (OSError, ValueError):
        return None
    if "earlier_experiments" in old:
        return old["earlier_experiments"]
    t = old.get("throughput") or {}
    if not all(k in t for k in EXPERIMENTS):
        return None
    return {
        "when": old.get("when", "?"),
        "plain_pods_per_s": t["plain"]["pods_per_s"],
        **{k: t[k] for k in EXPERIMENTS},
    }


def _latency_verdict(rows: list[Obj]) -> str:
    """The /filter targets against this run's p99."""
    out = []
    for f in rows:
        target = {100: 5.0, 500: 20.0}.get(f["nodes"])
        if target is None:
            continue
        verdict = "met" if f["p99_ms"] <= target else f"missed by {f['p99_ms'] - target:.1f} ms"
        out.append(f"p99 ≤ {target:g} ms at {f['nodes']} nodes: {verdict}")
    return "Targets: " + "; ".join(out) + "." if out else ""


def section(r: Obj) -> list[str]:
    t, m = r["throughput"], r["memory"]
    earlier = r.get("earlier_experiments")

    def row(label: str, x: Obj, plain: float, end: str) -> str:
        extender = (
            f"{x['filter_ms']:.0f} ms | {x['bind_ms']:.0f} ms | {100 * x['extender_cpu']:.0f} %"
            if "filter_ms" in x
            else "— | — | —"
        )
        load = f"{x['load']:.1f}" if "load" in x else "—"
        return (
            f"| {label} | {x['created_s']:.1f} s | {x['bound_s']:.1f} s | "
            f"{end} {x['done_s']:.1f} s | **{x['pods_per_s']:.1f}** | "
            f"{x['pods_per_s'] / plain:.2f}x | {x.get('bind_errors', 0)} | {extender} | {load} |"
        )

    plain = t["plain"]["pods_per_s"]
    experiment_labels = {
        "binpack_wait": "vGPU, binpack, lab `--gpulab-lock-retry-all`",
        "spread_async": "vGPU, spread, lab `--gpulab-async-filter-patch`",
    }
    if all(k in t for k in EXPERIMENTS):
        experiment_rows = [row(experiment_labels[k], t[k], plain, "allocated") for k in EXPERIMENTS]
        experiments_note = "each experiment rolls the Deployment out with its flag added."
    elif earlier:
        when = earlier["when"][:10]
        experiment_rows = [
            row(f"{experiment_labels[k]} (run of {when})", earlier[k], earlier["plain_pods_per_s"],
                "allocated")
            for k in EXPERIMENTS
        ]  # fmt: skip
        experiments_note = (
            f"The two experiment rows are from an earlier run ({earlier['when']}; the ratio "
            "against that run's default-scheduler rate); rerun them with "
            "`python -m bench.run --hami-experiments hami_extender`."
        )
    else:
        experiment_rows, experiments_note = [], ""
    spread = t["spread"]
    return [
        "## HAMi extender (HAMi v2.10.0 semantics)",
        "",
        "`/filter`: the real app under uvicorn in a process of its own (as the extender runs),",
        "an in-memory API server whose nodes are registered as the device plugin registers",
        "them (8x A100 or 4x T4, two vGPU pods per node), every node a candidate; a kept-alive",
        "TCP_NODELAY HTTP/1.1 client (`http.client`) in the benchmark's process, as",
        "kube-scheduler is a process of its own. `filter()` alone: the same request in the",
        "server's process without HTTP. Server CPU: the server process's CPU time (all",
        "threads) per request, less sensitive than wall time to a busy machine; load: the",
        "1-minute load average when the row started (2 cores, shared).",
        "",
        "| nodes | requests | HTTP p50 | HTTP p99 | `filter()` p50 | `filter()` p99 "
        "| server CPU / request | load | target p99 |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {f['nodes']} | {f['requests']} | {f['p50_ms']:.2f} ms | {f['p99_ms']:.2f} ms | "
            f"{f['filter_p50_ms']:.2f} ms | {f['filter_p99_ms']:.2f} ms | "
            f"{f['server_cpu_ms']:.2f} ms | {f['load']:.1f} | "
            + {100: "≤ 5 ms", 500: "≤ 20 ms"}.get(f["nodes"], "—")
            + " |"
            for f in r["filter"]
            if "server_cpu_ms" in f
        ),
        "",
        _latency_verdict(r["filter"]),
        "",
        "Each node keeps its cards' usage, charged and credited as pods come and go, and",
        "reuses its Fit result for the same request shape until its usage changes; a Filter",
        "re-fits only the node the previous Filter reserved on (upstream rebuilds every node's",
        "usage from every pod on each Filter). Once its caches are built the extender moves",
        "them out of the cyclic garbage collector's sight (`gc.freeze`), so a full collection",
        "does not walk them in the middle of a request.",
        "",
        f"The whole chain, {t['plain']['pods']} pods created at once on {t['nodes']} kwok nodes "
        f"({t['gpus']} GPUs); HAMi pods are done when the device plugin's Allocate has run and "
        "released the node lock. The extender and its kube-scheduler run as the",
        "`hami-scheduler` pod under the local backend's pod runner. Times come from the pod",
        "watch the benchmark keeps anyway (no polling LISTs loading the API server under",
        "measurement); load: the 1-minute load average at the end of the row. " + experiments_note,
        "",
        "| pods, scheduler | created in | all Bound in | done in | pods/s | vs default "
        "| failed Binds | Filter (mean) | Bind (mean) | extender CPU | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        row("`nvidia.com/gpu: 1`, default-scheduler", t["plain"], plain, "Bound"),
        row("vGPU, hami-scheduler, nodes **spread**", spread, plain, "allocated"),
        row("vGPU, hami-scheduler, nodes **binpack** (default)", t["binpack"], plain, "allocated"),
        *experiment_rows,
        "",
        (
            f"The machine was shared: its 1-minute load average was {t['load_before']:.0f} when "
            "the chain's cluster had come up. "
            if "load_before" in t
            else ""
        )
        + f"Target: spread at least 0.5x the default scheduler's pods/s in the same run; here "
        f"{spread['pods_per_s'] / plain:.2f}x"
        + (" (met)." if spread["pods_per_s"] >= 0.5 * plain else " (missed)."),
        "",
        "Spread sends consecutive pods to different nodes, so their node locks rarely meet;",
        "what bounds it is kube-scheduler's scheduling cycle, one pod at a time, each waiting",
        f"for /filter: {spread['filter_ms']:.0f} ms on average, nearly all of it the pod",
        "PATCH that Filter makes before it answers (as upstream's Filter does), on an API server",
        "shared with everything else on 2 cores; the extender's own CPU stays low "
        f"({100 * spread['extender_cpu']:.0f} %). Per pod the HAMi chain makes "
        + _requests_ratio(t)
        + " the API requests of the default scheduler's (the tables below: Filter's PATCH, "
        "Bind's lock GETs and PATCH, its pod PATCH and Binding, Allocate's reads, PATCH and "
        "the lock's release, the Events of both), so on a CPU-bound API server it cannot keep "
        "up with a scheduler that only POSTs a Binding. The experiment "
        "`--gpulab-async-filter-patch`",
        "answers first and writes meanwhile, Bind waiting for the write (not upstream's",
        "order): it shows what that wait costs.",
        "Binpack sends every pod to the fullest node: the pods queue for that node's",
        "`hami.io/mutex.lock`, held from Bind until the device plugin's Allocate (upstream's",
        "design: Allocate finds its pod through the lock). A pod outside a PodGroup that meets",
        "the lock fails its Bind at once and kube-scheduler retries it after a back-off (1 s",
        "doubling to 10 s), so the node idles between pods. The experiment",
        "`--gpulab-lock-retry-all` makes every Bind wait for the lock (what v2.10 does only for",
        "PodGroup members): no back-off, and only Binds that waited longer than",
        "`--node-lock-retry-timeout` (28 s) fail, at the price of kube-scheduler binding",
        "goroutines blocked meanwhile. A design without the node-wide lock — Allocate",
        "identifying its pod some other way (e.g. DRA's claims) — would let one node take pods",
        "at the rate of Bind alone, as spread shows.",
        f"In-process device plugins: {t.get('plugin_failures', 0)} failed Allocates.",
        "",
        *_work_section(t),
        f"Memory: the extender's caches for {m['nodes']} nodes x 8 GPUs and {m['pods']} vGPU pods "
        f"(informer stores + scheduler), RSS **{m['rss_mib']:.0f} MiB** in a fresh process "
        f"({m['baseline_mib']:.0f} MiB of it before building them: interpreter and imports). "
        "Part of the caches is the trace's record of the Events it wrote (kept 6 minutes to",
        "aggregate repeats into series); those Event models share one client Configuration.",
    ]


def _work_section(t: Obj) -> list[str]:
    """Where the main runs' work went, per pod, and what 0.5x would need on this machine."""
    runs = [k for k in MAIN_RUNS if "cpu_ms_per_pod" in t.get(k, {})]
    if "spread" not in runs or "plain" not in runs:
        return []
    cpu = {k: t[k]["cpu_ms_per_pod"] for k in runs}
    components = sorted({c for k in runs for c in cpu[k]}, key=lambda c: -cpu["spread"].get(c, 0))
    total = {k: sum(cpu[k].values()) for k in runs}
    req = {k: t[k]["requests_per_pod"] for k in runs}
    kinds = sorted({r for k in runs for r in req[k]}, key=lambda r: -req["spread"].get(r, 0))
    half = 0.5 * t["plain"]["pods_per_s"]
    cores = os.cpu_count() or 2

    def cells(values: dict[str, float], fmt: str) -> str:
        return " | ".join(fmt.format(values[k]) if k in values else "—" for k in runs)

    header = " | ".join(RUN_LABELS[k] for k in runs)
    return [
        "Where the work went, per pod, in the same runs, from the first create until the",
        "last pod was done: the API server's requests (`apiserver_request_total`, kinds of at",
        "least 0.05 per pod) and the CPU time of every process of the cluster, this",
        "benchmark's process (pod creation, the pod watch, the in-process kubelets and device",
        "plugins) included.",
        "",
        f"| API requests per pod | {header} |",
        "|---|" + "---|" * len(runs),
        *(
            f"| {r} | " + cells({k: req[k][r] for k in runs if r in req[k]}, "{:.2f}") + " |"
            for r in kinds
        ),
        "| **all** | " + cells({k: sum(req[k].values()) for k in runs}, "**{:.1f}**") + " |",
        "",
        f"| CPU per pod (ms) | {header} |",
        "|---|" + "---|" * len(runs),
        *(
            f"| {c} | " + cells({k: cpu[k][c] for k in runs if c in cpu[k]}, "{:.1f}") + " |"
            for c in components
        ),
        "| **all** | " + cells(total, "**{:.0f}**") + " |",
        "",
        "Cores busy (the processes' CPU time over the run's wall time): "
        + ", ".join(
            f"{RUN_LABELS[k]} {t[k]['cores_busy']:.2f}" for k in runs if "cores_busy" in t[k]
        )
        + f" of {cores}.",
        "",
        *(_bound_by_cpu(t, total, cpu) if "cores_busy" in t["spread"] else []),
        f"Half the default scheduler's rate is {half:.1f} pods/s. At that rate spread's "
        f"{total['spread']:.0f} ms of CPU per pod would need "
        f"{half * total['spread'] / 1000:.1f} cores, the API server's share alone "
        f"{half * cpu['spread'].get('kube-apiserver', 0) / 1000:.1f}; this machine has {cores}, "
        "shared by the control plane, the nodes' components and the workload generator. The",
        "requests are upstream's: v2.10.0's `LockNode` and `SetNodeLock` each GET the node "
        "before their merge PATCH, `ReleaseNodeLock` GETs it twice, the device plugin reads",
        "the lock from the node and the pod it names, and Filter, Bind and Allocate each",
        "PATCH the pod (`pkg/util/nodelock/nodelock.go`, `pkg/util/util.go`).",
        "",
    ]


def _bound_by_cpu(t: Obj, total: dict[str, float], cpu: dict[str, dict[str, float]]) -> list[str]:
    """When both runs kept the machine busy, their rates are the inverse of their CPU."""
    busy = min(t["plain"]["cores_busy"], t["spread"]["cores_busy"])
    if busy < 0.9 * (os.cpu_count() or 2):
        return []
    need = 2 * total["plain"]
    return [
        f"Both runs kept the cores busy, so the ratio of their rates is the inverse ratio of "
        f"their CPU per pod: {total['plain']:.0f} / {total['spread']:.0f} = "
        f"{total['plain'] / total['spread']:.2f} (measured: "
        f"{t['spread']['pods_per_s'] / t['plain']['pods_per_s']:.2f}x). For 0.5x the whole "
        f"chain would have to cost at most {need:.0f} ms of CPU per pod; upstream's "
        f"{sum(t['spread']['requests_per_pod'].values()):.0f} requests per pod cost the API "
        f"server alone {cpu['spread'].get('kube-apiserver', 0):.0f} ms.",
        "",
    ]


def _requests_ratio(t: Obj) -> str:
    """'N.Nx' the default scheduler's requests per pod, if this run measured them."""
    if "requests_per_pod" not in t["spread"] or "requests_per_pod" not in t["plain"]:
        return "several times"
    ratio = sum(t["spread"]["requests_per_pod"].values()) / sum(
        t["plain"]["requests_per_pod"].values()
    )
    return f"{ratio:.1f}x"


RUN_LABELS = {"plain": "default-scheduler", "spread": "HAMi spread", "binpack": "HAMi binpack"}


if __name__ == "__main__":
    if sys.argv[1:] == ["--rss"]:
        rss_child()
    elif sys.argv[1:2] == ["--serve"]:
        serve_child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        print(json.dumps(run(), indent=1))
