"""The HAMi extender over real HTTP (uvicorn on 127.0.0.1) with an in-memory cluster.

Requests are the extender v1 / AdmissionReview v1 wire format in tests/fixtures/hami/.
The helpers here (``World``, ``serve``) are shared with the other test_hami_* modules.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import io
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from gpulab.hami import annotations as ann
from gpulab.hami import nodelock
from gpulab.hami import scheduler as scheduler_mod
from gpulab.hami.cluster import ClusterError
from gpulab.hami.commands import explain_rows
from gpulab.hami.fake import FakeCluster
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.routes import build_app
from gpulab.hami.scheduler import FILTER_RESULT, Scheduler, SchedulerConfig
from gpulab.hami.webhook import WebhookConfig
from gpulab.trace import Tracer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hami"
RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class World:
    """A FakeCluster with the fixture nodes, a synced Scheduler and its app."""

    def __init__(self, cfg: SchedulerConfig | None = None, connect: bool = True) -> None:
        self.cluster = FakeCluster()
        for node in fixture("nodes.json")["items"]:
            self.cluster.add_node(node)
        self.log = io.StringIO()
        self.scheduler = Scheduler(
            self.cluster, cfg or SchedulerConfig(), Tracer("hami-scheduler", stream=self.log)
        )
        self.metrics = ExtenderMetrics(self.scheduler)
        self.app = build_app(self.scheduler, WebhookConfig(), self.metrics)
        if connect:
            self.sync()

    def sync(self) -> None:
        self.cluster.connect(self.scheduler)
        self.scheduler.register_from_node_annotations()

    def add_vgpu_pod(
        self,
        name: str,
        mem: int = 10000,
        cores: int = 30,
        nums: int = 1,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        pod = copy.deepcopy(fixture("filter_args.json")["Pod"])
        pod["metadata"].update(name=name, uid=f"uid-{name}", annotations=annotations or {})
        res = {
            "nvidia.com/gpu": str(nums),
            "nvidia.com/gpumem": str(mem),
            "nvidia.com/gpucores": str(cores),
        }
        pod["spec"]["containers"][0]["resources"] = {"limits": res, "requests": dict(res)}
        self.cluster.add_pod(pod)
        return pod

    def annotations(self, name: str, namespace: str = "default") -> dict[str, str]:
        return self.cluster.pods[(namespace, name)]["metadata"].get("annotations", {})


def filter_args(pod: dict[str, Any], nodes: list[str] | None = None) -> dict[str, Any]:
    return {
        "Pod": pod,
        "Nodes": None,
        "NodeNames": nodes or ["gpu-node-1", "gpu-node-2", "cpu-node"],
    }


def bind_args(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start an app under uvicorn on a free 127.0.0.1 port; yields a starter."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any) -> httpx.Client:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        servers.append((server, thread))
        # One connection per request: on a kept-alive connection every request here
        # waits out a 40 ms delayed ACK.
        return httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=30,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def test_healthz_and_readyz_follow_the_cache_sync(serve: Any) -> None:
    world = World(connect=False)
    http = serve(world.app)
    assert http.get("/healthz").status_code == 200
    assert http.get("/readyz").status_code == 503
    world.sync()
    assert http.get("/readyz").status_code == 200


def test_filter_picks_one_node_and_records_the_decision(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    args = fixture("filter_args.json")
    world.cluster.add_pod(args["Pod"])
    resp = http.post("/filter", json=args)
    assert resp.status_code == 200
    result = resp.json()
    assert set(result) == RESULT_KEYS
    # binpack over two empty nodes: equal scores, the first name wins.
    assert result["NodeNames"] == ["gpu-node-1"]
    assert result["FailedNodes"] == {"cpu-node": "node unregistered"}
    assert result["Error"] == "" and result["Nodes"] is None
    annos = world.annotations("vgpu-a")
    assert annos[ann.ASSIGNED_NODE] == "gpu-node-1"
    (ctr,) = ann.decode_pod_devices(annos[ann.DEVICES_TO_ALLOCATE])
    assert [(d.uuid, d.usedmem, d.usedcores) for d in ctr] == [("GPU-gpu-node-1-00", 10000, 30)]
    record = json.loads(annos[FILTER_RESULT])
    assert record["chosen"] == "gpu-node-1" and record["nodePolicy"] == "binpack"
    rows = explain_rows(record)
    assert rows[0][:2] == ("★ gpu-node-1", "yes") and rows[0][4] == "GPU-gpu-node-1-00"
    assert ("cpu-node", "no", "node unregistered", "", "") in rows


def test_bind_locks_annotates_binds_and_releases(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    args = fixture("filter_args.json")
    world.cluster.add_pod(args["Pod"])
    assert http.post("/filter", json=args).json()["NodeNames"] == ["gpu-node-1"]
    resp = http.post("/bind", json=fixture("bind_args.json"))
    assert resp.status_code == 200 and resp.json() == {"Error": ""}
    assert world.cluster.bindings == [("default", "vgpu-a", "gpu-node-1")]
    annos = world.annotations("vgpu-a")
    assert annos[ann.BIND_PHASE] == ann.BIND_ALLOCATING
    assert annos[ann.BIND_TIME].isdigit()
    assert annos[ann.DEVICES_TO_ALLOCATE] == "GPU-gpu-node-1-00,NVIDIA,10000,30:;"
    node_annos = world.cluster.nodes["gpu-node-1"]["metadata"]["annotations"]
    assert nodelock.NODE_LOCK_KEY not in node_annos
    steps = [json.loads(line)["step"] for line in world.log.getvalue().splitlines()]
    assert steps[-3:] == ["LockNode", "Bind", "ReleaseNodeLock"]


def test_keep_node_lock_leaves_it_for_the_device_plugin() -> None:
    world = World(SchedulerConfig(keep_node_lock=True))
    pod = world.add_vgpu_pod("p")
    world.scheduler.filter(filter_args(pod))
    assert world.scheduler.bind(bind_args(pod, "gpu-node-1")) == {"Error": ""}
    lock = world.cluster.nodes["gpu-node-1"]["metadata"]["annotations"][nodelock.NODE_LOCK_KEY]
    assert nodelock.owned_by(lock, "default", "p")


def test_failed_binding_marks_the_pod_and_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    pod = world.add_vgpu_pod("p")
    world.scheduler.filter(filter_args(pod))

    def refuse(*_: object) -> None:
        raise ClusterError("binding refused: HTTP 403")

    monkeypatch.setattr(world.cluster, "create_binding", refuse)
    result = world.scheduler.bind(bind_args(pod, "gpu-node-1"))
    assert result["Error"] == "binding refused: HTTP 403"
    assert world.annotations("p")[ann.BIND_PHASE] == ann.BIND_FAILED
    assert (
        nodelock.NODE_LOCK_KEY not in world.cluster.nodes["gpu-node-1"]["metadata"]["annotations"]
    )
    # The reservation is given back.
    assert all(c.usedmem == 0 for c in world.scheduler.usage()["gpu-node-1"])


def test_bind_on_a_node_locked_by_a_live_pod_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_mod, "LOCK_WAIT", 0.1)
    world = World()
    holder = world.add_vgpu_pod("holder")
    pod = world.add_vgpu_pod("p")
    world.cluster.patch_node_annotations(
        "gpu-node-1",
        {nodelock.NODE_LOCK_KEY: nodelock.encode(dt.datetime.now(dt.UTC), "default", "holder")},
    )
    world.scheduler.filter(filter_args(pod))
    result = world.scheduler.bind(bind_args(pod, "gpu-node-1"))
    assert "locked by default/holder" in result["Error"]
    assert world.annotations("p")[ann.BIND_PHASE] == ann.BIND_FAILED
    assert world.cluster.bindings == [] and holder


def test_no_fit_gives_per_node_reasons_and_a_best_node(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    big = world.add_vgpu_pod("big", mem=50000, nums=2)
    result = http.post("/filter", json=filter_args(big)).json()
    assert result["NodeNames"] == ["gpu-node-2"]  # only the 80 GB H100s hold 50000 MiB
    assert result["FailedNodes"]["gpu-node-1"] == "2/2 CardInsufficientMemory"
    huge = world.add_vgpu_pod("huge", mem=1000, nums=3)
    result = http.post("/filter", json=filter_args(huge)).json()
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {
        "gpu-node-1": "NodeInsufficientDevice",
        "gpu-node-2": "NodeInsufficientDevice",
        "cpu-node": "node unregistered",
    }
    assert json.loads(world.annotations("huge")[FILTER_RESULT])["chosen"] is None
    assert ann.ASSIGNED_NODE not in world.annotations("huge")


def test_node_policy_spread_override_and_gpu_binpack(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    first = world.add_vgpu_pod("first", mem=5000)
    assert http.post("/filter", json=filter_args(first, ["gpu-node-1", "cpu-node"])).json()[
        "NodeNames"
    ] == ["gpu-node-1"]
    binpack = world.add_vgpu_pod(
        "b", mem=5000, annotations={"hami.io/gpu-scheduler-policy": "binpack"}
    )
    http.post("/filter", json=filter_args(binpack))
    assert world.annotations("b")[ann.DEVICES_TO_ALLOCATE].startswith("GPU-gpu-node-1-00,")
    spread = world.add_vgpu_pod(
        "s", mem=5000, annotations={"hami.io/node-scheduler-policy": "spread"}
    )
    assert http.post("/filter", json=filter_args(spread)).json()["NodeNames"] == ["gpu-node-2"]


def test_full_node_objects_when_not_node_cache_capable(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    pod = world.add_vgpu_pod("p")
    nodes = fixture("nodes.json")
    result = http.post("/filter", json={"Pod": pod, "Nodes": nodes, "NodeNames": None}).json()
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-node-1"]


def test_non_gpu_pod_passes_through() -> None:
    world = World()
    pod = copy.deepcopy(fixture("filter_args.json")["Pod"])
    pod["spec"]["containers"][0]["resources"] = {}
    result = world.scheduler.filter(filter_args(pod))
    assert result["NodeNames"] == ["gpu-node-1", "gpu-node-2", "cpu-node"]


def test_restarted_extender_rebuilds_usage_from_pod_annotations() -> None:
    world = World()
    for i in range(4):
        pod = world.add_vgpu_pod(f"p{i}", mem=10000, cores=20)
        world.scheduler.filter(filter_args(pod, ["gpu-node-1"]))
        assert world.scheduler.bind(bind_args(pod, "gpu-node-1")) == {"Error": ""}
    before = {c.id: (c.used, c.usedmem, c.usedcores) for c in world.scheduler.usage()["gpu-node-1"]}
    assert sum(u[1] for u in before.values()) == 40000
    fresh = Scheduler(world.cluster, SchedulerConfig(), Tracer("t", stream=io.StringIO()))
    world.cluster.connect(fresh)
    fresh.register_from_node_annotations()
    after = {c.id: (c.used, c.usedmem, c.usedcores) for c in fresh.usage()["gpu-node-1"]}
    assert after == before
    # A finished pod gives its share back.
    done = copy.deepcopy(world.cluster.pods[("default", "p0")])
    done["status"] = {"phase": "Succeeded"}
    fresh.on_pod_event("MODIFIED", done)
    assert sum(c.usedmem for c in fresh.usage()["gpu-node-1"]) == 30000


def test_device_plugin_that_stops_answering_drops_its_node() -> None:
    world = World()
    assert "gpu-node-1" in world.scheduler.usage()
    stamp = (dt.datetime.now() - dt.timedelta(minutes=2)).strftime("%Y-%m-%d %H:%M:%S")
    world.cluster.patch_node_annotations("gpu-node-1", {ann.NODE_HANDSHAKE: f"Requesting_{stamp}"})
    world.scheduler.register_from_node_annotations()
    pod = world.add_vgpu_pod("p")
    result = world.scheduler.filter(filter_args(pod))
    assert result["FailedNodes"]["gpu-node-1"] == "node unregistered"
    assert result["NodeNames"] == ["gpu-node-2"]
    handshake = world.cluster.nodes["gpu-node-1"]["metadata"]["annotations"][ann.NODE_HANDSHAKE]
    assert handshake.startswith("Deleted_")
    # The device plugin reports again: the node is back.
    world.cluster.patch_node_annotations(
        "gpu-node-1", {ann.NODE_HANDSHAKE: ann.handshake_reported(dt.datetime.now(dt.UTC))}
    )
    world.scheduler.register_from_node_annotations()
    assert "gpu-node-1" in world.scheduler.usage()


def test_unhealthy_card_is_not_handed_out() -> None:
    world = World()
    node = world.cluster.nodes["gpu-node-1"]
    devices = ann.decode_node_devices(node["metadata"]["annotations"][ann.NODE_REGISTER])
    sick = [ann.NodeDevice(**{**d.__dict__, "health": d.index != 0}) for d in devices]
    # The device plugin re-registers and reports in one patch.
    world.cluster.patch_node_annotations(
        "gpu-node-1",
        {
            ann.NODE_REGISTER: ann.encode_node_devices(sick),
            ann.NODE_HANDSHAKE: ann.handshake_reported(dt.datetime.now(dt.UTC)),
        },
    )
    world.scheduler.register_from_node_annotations()
    pod = world.add_vgpu_pod("p", annotations={"hami.io/gpu-scheduler-policy": "binpack"})
    world.scheduler.filter(filter_args(pod, ["gpu-node-1"]))
    assert world.annotations("p")[ann.DEVICES_TO_ALLOCATE].startswith("GPU-gpu-node-1-01,")


def test_webhook_fixtures(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    gpu = http.post("/webhook", json=fixture("admission_review_gpu.json")).json()
    assert gpu["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert gpu["response"]["allowed"] is True and gpu["response"]["patchType"] == "JSONPatch"
    cpu = http.post("/webhook", json=fixture("admission_review_cpu.json")).json()
    assert cpu["response"] == {"uid": "8a1d3c20-6393-11e8-b7cc-42010a800003", "allowed": True}


def test_prioritize_returns_host_priority_list(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    pod = world.add_vgpu_pod("p")
    scores = http.post("/prioritize", json=filter_args(pod)).json()
    assert [s["Host"] for s in scores] == ["gpu-node-1", "gpu-node-2", "cpu-node"]
    assert all(set(s) == {"Host", "Score"} and 0 <= s["Score"] <= 10 for s in scores)


def test_bad_bodies_get_400_or_413_with_a_message(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    big = http.post("/filter", content=b"{" + b" " * (1 << 20) + b"}")
    assert big.status_code == 413 and "exceeds" in big.json()["Error"]
    bad = http.post("/bind", content=b"{not json")
    assert bad.status_code == 400 and "not JSON" in bad.json()["Error"]
    no_pod = http.post("/filter", json={"NodeNames": ["gpu-node-1"]})
    assert no_pod.status_code == 400 and "Pod" in no_pod.json()["Error"]
    assert http.get("/filter").status_code == 405


def test_metrics_on_their_own_port() -> None:
    world = World()
    pod = world.add_vgpu_pod("p", mem=10000, cores=30)
    world.scheduler.filter(filter_args(pod))
    world.scheduler.bind(bind_args(pod, "gpu-node-1"))
    world.metrics.filter_duration.labels("success").observe(0.01)
    port = free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry=world.metrics.registry)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    samples = {
        (s.name, s.labels.get("deviceuuid")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("GPUDeviceMemoryAllocated", "GPU-gpu-node-1-00")] == 10000 * 2**20
    assert samples[("GPUDeviceCoreAllocated", "GPU-gpu-node-1-00")] == 30
    assert samples[("GPUDeviceSharedNum", "GPU-gpu-node-1-00")] == 1
    assert samples[("GPUDeviceMemoryLimit", "GPU-gpu-node-2-00")] == 81920 * 2**20
    assert samples[("hami_scheduler_filter_duration_seconds_count", None)] == 1


def test_replay_of_what_a_real_kube_scheduler_sent() -> None:
    """captured_*.json: kube-scheduler v1.36.3 (nodeCacheCapable) against this extender;
    the API server had turned gpumem "10000" into "10k"."""
    args = fixture("captured_filter_args.json")
    world = World(connect=False)
    world.cluster.nodes.clear()
    for real, item in zip(("gpu-a100", "gpu-h100"), fixture("nodes.json")["items"], strict=False):
        world.cluster.add_node({**item, "metadata": {**item["metadata"], "name": real}})
    world.cluster.add_pod(args["Pod"])
    world.sync()
    assert (
        args["Nodes"] is None
        and args["Pod"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"]
        == "10k"
    )
    result = world.scheduler.filter(args)
    assert result["NodeNames"] == ["gpu-a100"]
    assert set(result["FailedNodes"]) == {"cpu-only", "gpu-t4", "gpu-a100-mig"}
    (ctr,) = ann.decode_pod_devices(
        world.annotations("vgpu-capture", "hami-capture")[ann.DEVICES_TO_ALLOCATE]
    )
    assert (ctr[0].usedmem, ctr[0].usedcores) == (10000, 30)
    bind = fixture("captured_bind_args.json")
    assert world.scheduler.bind(bind) == {"Error": ""}
    assert world.cluster.bindings == [("hami-capture", "vgpu-capture", "gpu-a100")]


def test_replay_of_what_a_real_api_server_sent_to_the_webhook(serve: Any) -> None:
    """captured_admission_review_*.json: kube-apiserver v1.36.3 calling /webhook; it
    accepted the patch (pod gpu got hami-scheduler and the defaults) and showed the
    denials to kubectl."""
    world = World()
    cfg = WebhookConfig(default_mem=2000, default_cores=20)
    http = serve(build_app(world.scheduler, cfg, world.metrics))
    answers = {
        name: http.post("/webhook", json=fixture(f"captured_admission_review_{name}.json")).json()
        for name in ("gpu", "cpu", "priv", "memonly")
    }
    gpu = answers["gpu"]["response"]
    ops = json.loads(base64.b64decode(gpu["patch"]))
    assert (
        gpu["allowed"]
        and {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in ops
    )
    assert {op["path"] for op in ops} >= {
        "/spec/containers/0/resources/limits/nvidia.com~1gpumem",
        "/spec/containers/0/resources/requests/nvidia.com~1gpucores",
    }
    assert answers["cpu"]["response"] == {
        "uid": fixture("captured_admission_review_cpu.json")["request"]["uid"],
        "allowed": True,
    }
    assert answers["priv"]["response"]["status"]["message"] == "container main is privileged"
    assert "without nvidia.com/gpu" in answers["memonly"]["response"]["status"]["message"]
