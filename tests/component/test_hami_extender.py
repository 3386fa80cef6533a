"""The HAMi extender over real HTTP (uvicorn on 127.0.0.1) with an in-memory API server,
checked against HAMi v2.10.0's behaviour. Requests are the extender v1 / AdmissionReview v1
wire format in tests/fixtures/hami/ (some captured from the real kube-scheduler and
kube-apiserver). ``World`` and ``serve`` are shared with the other test_hami_* modules.
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
from kubernetes.client import ApiClient
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from gpulab.deviceplugin.hami import HamiAllocator, plugin_devices
from gpulab.deviceplugin.rm import GPUInfo
from gpulab.hami import annotations as ann
from gpulab.hami import bind as bind_mod
from gpulab.hami import events as ev
from gpulab.hami import filter as filter_mod
from gpulab.hami import nodelock
from gpulab.hami.cluster import ClusterError
from gpulab.hami.commands import explain_rows
from gpulab.hami.events import SchedulerEvents
from gpulab.hami.fake import FakeCluster
from gpulab.hami.filter import FILTER_RESULT
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.routes import build_app
from gpulab.hami.scheduler import Scheduler, SchedulerConfig
from gpulab.hami.server import listen, registered_routes
from gpulab.hami.webhook import WebhookConfig
from gpulab.trace import Tracer
from gpulab.wait import wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hami"
RESULT_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
CANDIDATES = ["gpu-node-1", "gpu-node-2", "cpu-node"]
HAMI_REASONS = {ev.FILTERING_FAILED, ev.FILTERING_SUCCEED, ev.BINDING_FAILED, ev.BINDING_SUCCEED}


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class Sink:
    """events.k8s.io/v1 as the Tracer calls it (EventsV1Api), in memory."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []

    def create_namespaced_event(self, namespace: str, event: Any) -> None:
        self.created.append(ApiClient().sanitize_for_serialization(event))

    def patch_namespaced_event(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.patched.append((name, body))

    def reasons(self, pod: str) -> list[str]:
        return [e["reason"] for e in self.created if e["regarding"]["name"] == pod]


class World:
    """A FakeCluster with the fixture nodes, a synced Scheduler and its app."""

    def __init__(
        self,
        cfg: SchedulerConfig | None = None,
        connect: bool = True,
        webhook: WebhookConfig | None = None,
    ) -> None:
        self.cluster = FakeCluster()
        for node in fixture("nodes.json")["items"]:
            self.cluster.add_node(node)
        self.log = io.StringIO()
        self.sink = Sink()
        self.events = SchedulerEvents(None, "hami-scheduler-test", stream=self.log)
        self.events.trace._events = self.sink  # the Tracer's events.k8s.io client
        self.scheduler = Scheduler(self.cluster, cfg or SchedulerConfig(), self.events)
        self.metrics = ExtenderMetrics(self.scheduler)
        self.app = build_app(
            self.scheduler, webhook or WebhookConfig(scheduler_name="hami-scheduler"), self.metrics
        )
        if connect:
            self.sync()

    def sync(self) -> None:
        self.cluster.connect(self.scheduler)
        self.scheduler.register()

    def add_vgpu_pod(
        self,
        name: str,
        mem: int = 10000,
        cores: int = 30,
        nums: int = 1,
        annotations: dict[str, str] | None = None,
        namespace: str = "default",
        **meta: Any,
    ) -> dict[str, Any]:
        pod = copy.deepcopy(fixture("filter_args.json")["Pod"])
        pod["metadata"].update(
            name=name, namespace=namespace, uid=f"uid-{name}", annotations=annotations or {}, **meta
        )
        res = {
            "nvidia.com/gpu": str(nums),
            "nvidia.com/gpumem": str(mem),
            "nvidia.com/gpucores": str(cores),
        }
        pod["spec"]["containers"][0]["resources"] = {"limits": res, "requests": dict(res)}
        return self.cluster.add_pod(pod)

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        return self.cluster.pods[(namespace, name)]

    def annotations(self, name: str, namespace: str = "default") -> dict[str, str]:
        return self.pod(name, namespace)["metadata"].get("annotations", {})

    def node_lock(self, node: str = "gpu-node-1") -> str | None:
        return (
            self.cluster.nodes[node]["metadata"].get("annotations", {}).get(nodelock.NODE_LOCK_KEY)
        )

    def steps(self) -> list[str]:
        """The lab's call-chain steps logged (HAMi's own Event reasons left out)."""
        lines = (json.loads(line)["step"] for line in self.log.getvalue().splitlines())
        return [step for step in lines if step not in HAMI_REASONS]

    def allocate(self, node: str = "gpu-node-1") -> None:
        """The device plugin's Allocate on ``node``: one container, its first share."""
        plugin = HamiAllocator(
            None, node, Tracer("device-plugin", None, stream=io.StringIO()), cluster=self.cluster
        )  # type: ignore[arg-type]
        gpus = [
            GPUInfo(g, f"GPU-{node}-0{g}", "NVIDIA A100-SXM4-40GB", 40960, (8, 0), g, 0)
            for g in range(2)
        ]  # the fixture registers gpu-node-1 so
        # HAMi's GetPluginDevices: 10 IDs <uuid>-<n> per GPU (deviceSplitCount)
        devices = {d.id: d for d in plugin_devices(gpus, 10, numa_topology=False)}
        pod = plugin.pending_pod()
        shares = [
            c
            for c in ann.decode_pod_devices(pod["metadata"]["annotations"][ann.DEVICES_TO_ALLOCATE])
            if c
        ]
        ids = [next(i for i, d in devices.items() if d.uuid == s.uuid) for s in shares[0]]
        plugin.allocate([ids], devices)


def filter_args(pod: dict[str, Any], nodes: list[str] | None = None) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": nodes or list(CANDIDATES)}


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
        sock = listen(("127.0.0.1", 0), "--http_bind")
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        wait_for(lambda: server.started, 10, "uvicorn to start", interval=0.01)
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


def test_routes_as_the_release_serves_them(serve: Any) -> None:
    world = World(connect=False)
    # the start-up's router line (httprouter's table: no HEAD twins of the GETs)
    assert registered_routes(world.app) == (
        "POST /filter, POST /bind, POST /webhook, GET /healthz, GET /readyz"
    )
    http = serve(world.app)
    for path in ("/healthz", "/readyz"):  # 200 with an empty body, synced or not
        r = http.get(path)
        assert (r.status_code, r.content) == (200, b"")
    assert http.post("/prioritize", json={}).status_code == 404  # HAMi decides in Filter
    assert http.get("/filter").status_code == 405


def test_filter_picks_one_node_and_writes_the_allocation(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    args = fixture("filter_args.json")
    world.cluster.add_pod(args["Pod"])
    resp = http.post("/filter", json=args)
    assert resp.status_code == 200
    result = resp.json()
    assert set(result) == RESULT_KEYS
    # binpack over two empty nodes: equal scores, the first name wins; upstream's success
    # result carries no FailedNodes
    assert result == {**filter_mod.result(names=["gpu-node-1"])}
    annos = world.annotations("vgpu-a")
    assert annos[ann.ASSIGNED_NODE] == "gpu-node-1" and annos[ann.ASSIGNED_TIME].isdigit()
    assert (
        annos[ann.DEVICES_TO_ALLOCATE]
        == annos[ann.DEVICES_ALLOCATED]
        == "GPU-gpu-node-1-00,NVIDIA,10000,30:;"
    )
    assert world.pod("vgpu-a")["metadata"]["labels"][ann.ASSIGNED_NODE] == "gpu-node-1"
    record = json.loads(annos[FILTER_RESULT])
    rows = explain_rows(record)
    assert rows[0][:2] == ("★ gpu-node-1", "yes") and rows[0][4] == "GPU-gpu-node-1-00"
    assert ("cpu-node", "no", "node unregistered", "", "") in rows
    world.events.flush()
    assert world.sink.reasons("vgpu-a") == ["FilteringSucceed", "Filter"]
    succeed = next(e for e in world.sink.created if e["reason"] == "FilteringSucceed")
    assert succeed["reportingController"] == "gpulab.io/hami-scheduler"
    fits = "gpu-node-2:0.00,gpu-node-1:0.00"  # sorted as upstream: the chosen node last
    assert succeed["note"] == f"find fit node(gpu-node-1), 1 nodes not fit, 2 nodes fit({fits})"


def test_bind_takes_the_node_lock_and_leaves_it_for_allocate(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    args = fixture("filter_args.json")
    world.cluster.add_pod(args["Pod"])
    assert http.post("/filter", json=args).json()["NodeNames"] == ["gpu-node-1"]
    resp = http.post("/bind", json=fixture("bind_args.json"))
    assert (resp.status_code, resp.json()) == (200, {"Error": ""})
    assert world.cluster.bindings == [("default", "vgpu-a", "gpu-node-1")]
    annos = world.annotations("vgpu-a")
    assert annos[ann.BIND_PHASE] == ann.BIND_ALLOCATING and annos[ann.BIND_TIME].isdigit()
    assert nodelock.owned_by(world.node_lock() or "", "default", "vgpu-a")  # still held
    assert world.steps()[-2:] == ["LockNode", "Bind"]
    world.allocate()
    assert (
        world.node_lock() is None
        and world.annotations("vgpu-a")[ann.BIND_PHASE] == ann.BIND_SUCCESS
    )
    world.events.flush()
    assert "BindingSucceed" in world.sink.reasons("vgpu-a")


def test_a_second_pod_on_a_locked_node_fails_at_once_until_allocate_releases() -> None:
    world = World()
    first, second = world.add_vgpu_pod("first"), world.add_vgpu_pod("second")
    for pod in (first, second):
        assert filter_mod.filter(world.scheduler, filter_args(pod, ["gpu-node-1"]))["NodeNames"]
    assert bind_mod.bind(world.scheduler, bind_args(first, "gpu-node-1")) == {"Error": ""}
    start = time.monotonic()
    result = bind_mod.bind(world.scheduler, bind_args(second, "gpu-node-1"))
    assert time.monotonic() - start < 0.5  # no retry for pods outside a PodGroup
    assert result["Error"] == "node gpu-node-1 has been locked within 5m0s: node lock contention"
    assert nodelock.owned_by(world.node_lock() or "", "default", "first")
    assert world.cluster.bindings == [("default", "first", "gpu-node-1")]
    world.allocate()  # the device plugin allocates "first" and releases the lock
    assert bind_mod.bind(world.scheduler, bind_args(second, "gpu-node-1")) == {"Error": ""}
    world.events.flush()
    assert "BindingFailed" in world.sink.reasons("second")


def test_a_pod_group_member_waits_for_the_lock() -> None:
    world = World(SchedulerConfig(node_lock_retry_timeout=dt.timedelta(seconds=5)))
    first = world.add_vgpu_pod("first")
    member = world.add_vgpu_pod("member", labels={"scheduling.x-k8s.io/pod-group": "gang"})
    for pod in (first, member):
        filter_mod.filter(world.scheduler, filter_args(pod, ["gpu-node-1"]))
    assert bind_mod.bind(world.scheduler, bind_args(first, "gpu-node-1")) == {"Error": ""}
    releaser = threading.Timer(0.5, world.allocate)
    releaser.start()
    start = time.monotonic()
    assert bind_mod.bind(world.scheduler, bind_args(member, "gpu-node-1")) == {"Error": ""}
    assert 0.4 < time.monotonic() - start < 4
    releaser.join()
    short = World(SchedulerConfig(node_lock_retry_timeout=dt.timedelta(milliseconds=300)))
    a = short.add_vgpu_pod("a")
    b = short.add_vgpu_pod("b", labels={"scheduling.x-k8s.io/pod-group": "gang"})
    for pod in (a, b):
        filter_mod.filter(short.scheduler, filter_args(pod, ["gpu-node-1"]))
    bind_mod.bind(short.scheduler, bind_args(a, "gpu-node-1"))
    assert bind_mod.bind(short.scheduler, bind_args(b, "gpu-node-1"))["Error"] == (
        "timed out after 300ms waiting for node gpu-node-1 to be unlocked: node lock contention"
    )


def test_a_failed_binding_releases_this_pods_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    pod = world.add_vgpu_pod("p")
    filter_mod.filter(world.scheduler, filter_args(pod))

    def refuse(*_: object) -> None:
        raise ClusterError("binding refused: HTTP 403")

    monkeypatch.setattr(world.cluster, "create_binding", refuse)
    assert bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1")) == {
        "Error": "binding refused: HTTP 403"
    }
    assert world.node_lock() is None


def test_an_unreadable_lock_fails_the_bind() -> None:
    world = World()
    pod = world.add_vgpu_pod("p")
    filter_mod.filter(world.scheduler, filter_args(pod))
    world.cluster.patch_node_annotations("gpu-node-1", {nodelock.NODE_LOCK_KEY: "a,b"})
    assert (
        "cannot read hami.io/mutex.lock"
        in bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1"))["Error"]
    )
    assert world.node_lock() == "a,b"  # names some owner: never replaced
    # a value without ',' reads as the legacy timestamp-only lock, which has no owner: the
    # failed Bind's ReleaseNodeLock drops it, as upstream's does
    world.cluster.patch_node_annotations("gpu-node-1", {nodelock.NODE_LOCK_KEY: "yesterday"})
    assert "cannot read" in bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1"))["Error"]
    assert world.node_lock() is None
    assert bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1")) == {"Error": ""}


def test_an_unschedulable_pod_writes_one_event_series_not_one_per_retry(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    big = world.add_vgpu_pod("big", mem=50000, nums=2)
    result = http.post("/filter", json=filter_args(big)).json()
    assert result["NodeNames"] == ["gpu-node-2"]  # only the 80 GB H100s hold 50000 MiB
    world.add_vgpu_pod("huge", mem=1000, nums=3)
    patches = world.cluster.calls.count("patch pod")
    first: list[str] = []
    for i in range(20):  # kube-scheduler retries the pod, sending it as it is now
        candidates = CANDIDATES[::-1] if i % 2 else CANDIDATES  # in varying order
        result = http.post("/filter", json=filter_args(world.pod("huge"), candidates)).json()
        assert (
            result["NodeNames"] is None
            and result["FailedNodes"]["gpu-node-2"] == "NodeInsufficientDevice"
        )
        if i == 0:
            world.events.flush()
            first = world.sink.reasons("huge")
    # the record is written once; an unchanged pod stays in kube-scheduler's unschedulable queue
    assert world.cluster.calls.count("patch pod") == patches + 1
    assert json.loads(world.annotations("huge")[FILTER_RESULT])["chosen"] is None
    world.events.flush()
    # the retries add no Event: each note of the first Filter became a series
    assert "Filter" in first and "FilteringFailed" in first
    assert world.sink.reasons("huge") == first
    assert {name for name, _ in world.sink.patched} == {
        e["metadata"]["name"] for e in world.sink.created if e["regarding"]["name"] == "huge"
    }
    assert all(body["series"]["count"] == 2 for _, body in world.sink.patched)


def test_a_stale_assignment_is_dropped_when_nothing_fits() -> None:
    world = World()
    pod = world.add_vgpu_pod("p", mem=30000)
    filter_mod.filter(world.scheduler, filter_args(pod, ["gpu-node-1"]))
    other = world.add_vgpu_pod("other", mem=30000)
    filter_mod.filter(world.scheduler, filter_args(other, ["gpu-node-1"]))
    # "p" is filtered again (say its Bind failed) and now fits nowhere: it holds nothing
    assert not filter_mod.filter(world.scheduler, filter_args(world.pod("p"), ["cpu-node"]))[
        "NodeNames"
    ]
    assert ann.ASSIGNED_NODE not in world.annotations("p")
    world.cluster.update_pod(world.pod("p"))  # any later update must not charge it again
    assert sum(c.usedmem for c in world.scheduler.usage()["gpu-node-1"]) == 30000  # "other" only


def test_undecodable_bodies_get_200_with_the_error(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    big = http.post("/filter", content=b"{" + b" " * (1 << 20) + b"}")
    assert big.status_code == 200 and "unexpected EOF" in big.json()["Error"]
    bad = http.post("/bind", content=b"{not json")
    assert bad.status_code == 200 and set(bad.json()) == {"Error"} and bad.json()["Error"]
    no_pod = http.post("/filter", json={"NodeNames": ["gpu-node-1"]})
    assert no_pod.json() == filter_mod.result(error="extender args missing pod")
    empty = http.post("/filter", content=b"")
    assert empty.json()["Error"] == "EOF"


def test_an_unknown_policy_is_reported_not_defaulted(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    pod = world.add_vgpu_pod("p", annotations={"hami.io/gpu-scheduler-policy": "topology"})
    result = http.post("/filter", json=filter_args(pod)).json()
    assert result["NodeNames"] is None
    assert result["Error"].startswith(
        "calcScore failed unknown hami.io/gpu-scheduler-policy 'topology'"
    )
    assert ann.ASSIGNED_NODE not in world.annotations("p")
    world.events.flush()
    assert "FilteringFailed" in world.sink.reasons("p")


def test_node_and_gpu_policy_annotations(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    first = world.add_vgpu_pod("first", mem=5000)
    assert http.post("/filter", json=filter_args(first, ["gpu-node-1"])).json()["NodeNames"] == [
        "gpu-node-1"
    ]
    binpack = world.add_vgpu_pod(
        "b", mem=5000, annotations={"hami.io/gpu-scheduler-policy": "binpack"}
    )
    http.post("/filter", json=filter_args(binpack))
    assert world.annotations("b")[ann.DEVICES_TO_ALLOCATE].startswith("GPU-gpu-node-1-00,")
    spread = world.add_vgpu_pod(
        "s", mem=5000, annotations={"hami.io/node-scheduler-policy": "spread"}
    )
    assert http.post("/filter", json=filter_args(spread)).json()["NodeNames"] == ["gpu-node-2"]


def test_init_containers_get_the_first_slot_and_shrink_when_done() -> None:
    world = World()
    pod = world.add_vgpu_pod("init", mem=3000, cores=30)
    gpu = pod["spec"]["containers"][0]["resources"]
    pod["spec"]["initContainers"] = [
        {"name": "setup", "image": "x"},
        {"name": "warmup", "image": "x", "resources": copy.deepcopy(gpu)},
    ]
    pod["spec"]["initContainers"][1]["resources"]["limits"]["nvidia.com/gpumem"] = "8000"
    world.cluster.update_pod(pod)
    filter_mod.filter(world.scheduler, filter_args(world.pod("init"), ["gpu-node-1"]))
    layout = world.annotations("init")[ann.DEVICES_TO_ALLOCATE]
    assert layout == ";GPU-gpu-node-1-00,NVIDIA,8000,30:;GPU-gpu-node-1-00,NVIDIA,3000,30:;"
    card = world.scheduler.usage()["gpu-node-1"][0]
    assert (card.used, card.usedmem, card.usedcores) == (1, 8000, 30)  # init peak, one slot
    done = copy.deepcopy(world.pod("init"))
    done["status"] = {
        "phase": "Running",
        "initContainerStatuses": [
            {"name": n, "state": {"terminated": {"exitCode": 0}}} for n in ("setup", "warmup")
        ],
    }
    world.cluster.update_pod(done)
    card = world.scheduler.usage()["gpu-node-1"][0]
    assert (card.used, card.usedmem, card.usedcores) == (1, 3000, 30)  # app containers only


def test_resource_quota_limits_a_namespace(serve: Any) -> None:
    world = World()
    world.cluster.add_quota(
        {
            "metadata": {"name": "gpu", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "8000", "requests.cpu": "4"}},
        }
    )
    http = serve(world.app)
    one = world.add_vgpu_pod("one", mem=6000, namespace="team")
    assert http.post("/filter", json=filter_args(one)).json()["NodeNames"] == ["gpu-node-1"]
    two = world.add_vgpu_pod("two", mem=6000, namespace="team")
    failed = http.post("/filter", json=filter_args(two)).json()["FailedNodes"]
    assert failed["gpu-node-1"] == "2/2 ResourceQuotaNotFit"
    elsewhere = world.add_vgpu_pod("three", mem=6000)  # another namespace: no quota
    assert http.post("/filter", json=filter_args(elsewhere)).json()["NodeNames"]
    review = fixture("admission_review_gpu.json")
    obj = review["request"]["object"]
    obj["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
    }
    review["request"]["namespace"] = obj["metadata"]["namespace"] = "team"
    answer = http.post("/webhook", json=review).json()["response"]
    assert answer["allowed"] is False and answer["status"]["message"] == "exceeding resource quota"


def test_registration_waits_for_a_node_add_or_the_ticker_not_every_update() -> None:
    world = World()
    node = world.cluster.nodes["gpu-node-1"]
    devices = ann.decode_node_devices(node["metadata"]["annotations"][ann.NODE_REGISTER])
    sick = [ann.NodeDevice(**{**d.__dict__, "health": d.index != 0}) for d in devices]
    world.scheduler.node_notify.clear()
    world.cluster.patch_node_annotations(
        "gpu-node-1", {ann.NODE_REGISTER: ann.encode_node_devices(sick)}
    )
    assert not world.scheduler.node_notify.is_set()  # an update is no notification
    pod = world.add_vgpu_pod("p", annotations={"hami.io/gpu-scheduler-policy": "binpack"})
    filter_mod.filter(world.scheduler, filter_args(pod, ["gpu-node-1"]))
    assert world.annotations("p")[ann.DEVICES_TO_ALLOCATE].startswith("GPU-gpu-node-1-00,")
    world.scheduler.register()  # the 15 s ticker: the changed registration is read now
    late = world.add_vgpu_pod("late", annotations={"hami.io/gpu-scheduler-policy": "binpack"})
    filter_mod.filter(world.scheduler, filter_args(late, ["gpu-node-1"]))
    assert world.annotations("late")[ann.DEVICES_TO_ALLOCATE].startswith("GPU-gpu-node-1-01,")
    world.cluster.add_node({**node, "metadata": {**node["metadata"], "name": "gpu-node-3"}})
    assert world.scheduler.node_notify.is_set()  # an added node is


def test_a_node_without_gpu_allocatable_is_cleaned_up() -> None:
    world = World()
    node = copy.deepcopy(world.cluster.nodes["gpu-node-1"])
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    world.cluster.nodes["gpu-node-1"] = node  # kubelet: the plugin is gone
    world.scheduler.register()
    assert "gpu-node-1" not in world.scheduler.usage()
    assert ann.NODE_HANDSHAKE not in world.cluster.nodes["gpu-node-1"]["metadata"]["annotations"]
    assert "NodeCleanUp" in world.steps()
    pod = world.add_vgpu_pod("p")
    assert filter_mod.filter(world.scheduler, filter_args(pod))["NodeNames"] == ["gpu-node-2"]
    world.cluster.delete_node("gpu-node-2")
    assert "gpu-node-2" not in world.scheduler.usage()


def test_node_objects_are_a_simulation_that_changes_nothing(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    pod = world.add_vgpu_pod("p")
    nodes = fixture("nodes.json")
    result = http.post("/filter", json={"Pod": pod, "Nodes": nodes, "NodeNames": None}).json()
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-node-1"]
    assert result["FailedNodes"] == {"cpu-node": "node unregistered"}
    assert ann.ASSIGNED_NODE not in world.annotations("p")


def test_non_gpu_pod_passes_through() -> None:
    world = World()
    pod = copy.deepcopy(fixture("filter_args.json")["Pod"])
    pod["spec"]["containers"][0]["resources"] = {}
    assert filter_mod.filter(world.scheduler, filter_args(pod)) == filter_mod.result(
        names=CANDIDATES
    )


def test_restarted_extender_rebuilds_usage_from_pod_annotations() -> None:
    world = World()
    for i in range(4):
        pod = world.add_vgpu_pod(f"p{i}", mem=10000, cores=20)
        filter_mod.filter(world.scheduler, filter_args(pod, ["gpu-node-1"]))
        assert bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1")) == {"Error": ""}
        world.allocate()
    before = {c.id: (c.used, c.usedmem, c.usedcores) for c in world.scheduler.usage()["gpu-node-1"]}
    assert sum(u[1] for u in before.values()) == 40000
    fresh = Scheduler(
        world.cluster,
        SchedulerConfig(),
        SchedulerEvents(None, "t", io.StringIO()),
    )
    world.cluster.connect(fresh)
    fresh.register()
    assert {c.id: (c.used, c.usedmem, c.usedcores) for c in fresh.usage()["gpu-node-1"]} == before
    done = copy.deepcopy(world.pod("p0"))
    done["status"] = {"phase": "Succeeded"}
    world.cluster.update_pod(done)
    assert sum(c.usedmem for c in fresh.usage()["gpu-node-1"]) == 30000


def test_metrics_use_the_release_names_and_labels() -> None:
    world = World()
    pod = world.add_vgpu_pod("p", mem=10000, cores=30)
    filter_mod.filter(world.scheduler, filter_args(pod))
    world.cluster.add_quota(
        {
            "metadata": {"name": "q", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "50000"}},
        }
    )
    port = free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry=world.metrics.registry)
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    samples = {
        (s.name, s.labels.get("device_uuid")): s
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    alloc = samples[("hami_gpu_memory_allocated_bytes", "GPU-gpu-node-1-00")]
    assert alloc.value == 10000 * 2**20
    assert alloc.labels == {
        "node": "gpu-node-1", "device_uuid": "GPU-gpu-node-1-00", "device_index": "0",
        "device_cores": "100", "device_type": "NVIDIA A100-SXM4-40GB", "zone": "vGPU",
    }  # fmt: skip
    assert samples[("hami_gpu_core_allocated_ratio", "GPU-gpu-node-1-00")].value == 30
    assert samples[("hami_gpu_shared_count", "GPU-gpu-node-1-00")].value == 1
    assert samples[("hami_gpu_memory_limit_bytes", "GPU-gpu-node-2-00")].value == 81920 * 2**20
    assert samples[("hami_vgpu_memory_allocated_bytes", "GPU-gpu-node-1-00")].labels["pod"] == "p"
    quota = next(s for (name, _), s in samples.items() if name == "hami_resource_quota_used")
    assert (quota.labels["quota_name"], quota.value) == ("nvidia.com/gpumem", 10000)
    names = {m.name for m in world.metrics.registry.collect()}
    assert "hami_build_info" in names
    assert not any(n.startswith(("GPUDevice", "hami_scheduler_")) for n in names)
    lab = names - {n for n in names if n.startswith("hami_")}
    assert lab == {"gpulab_extender_request_duration_seconds", "gpulab_extender_requests"}
    legacy = ExtenderMetrics(world.scheduler, legacy=True)
    legacy_samples = {
        (s.name, s.labels.get("deviceuuid")): s
        for m in legacy.registry.collect()
        for s in m.samples
    }
    # every pre-2.9 family v2.10.0's --legacy-metrics still emits (no MIG pod here)
    assert {name for name, _ in legacy_samples} - names == {
        "GPUDeviceMemoryLimit", "GPUDeviceCoreLimit", "GPUDeviceMemoryAllocated",
        "GPUDeviceSharedNum", "GPUDeviceCoreAllocated", "nodeGPUOverview",
        "nodeGPUMemoryPercentage", "QuotaUsed", "vGPUMemoryAllocated", "vGPUCoreAllocated",
    }  # fmt: skip
    overview = legacy_samples[("nodeGPUOverview", "GPU-gpu-node-1-00")]
    assert overview.labels["devicememorylimit"] == "40960" and overview.value == 10000 * 2**20
    pct = legacy_samples[("nodeGPUMemoryPercentage", "GPU-gpu-node-1-00")]
    assert set(pct.labels) == {"nodeid", "deviceuuid", "deviceidx", "zone"}
    assert pct.value == pytest.approx(10000 / 40960)


def test_webhook_fixtures(serve: Any) -> None:
    world = World()
    http = serve(world.app)
    gpu = http.post("/webhook", json=fixture("admission_review_gpu.json")).json()
    assert gpu["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert gpu["response"]["allowed"] is True and gpu["response"]["patchType"] == "JSONPatch"
    cpu = http.post("/webhook", json=fixture("admission_review_cpu.json")).json()
    assert cpu["response"]["allowed"] is True and "patch" not in cpu["response"]
    junk = http.post("/webhook", content=b"[]")
    assert junk.status_code == 200 and junk.json()["response"]["status"]["code"] == 400


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
    result = filter_mod.filter(world.scheduler, args)
    assert result["NodeNames"] == ["gpu-a100"]
    (ctr, _tail) = ann.decode_pod_devices(
        world.annotations("vgpu-capture", "hami-capture")[ann.DEVICES_TO_ALLOCATE]
    )
    assert (ctr[0].usedmem, ctr[0].usedcores) == (10000, 30)
    assert bind_mod.bind(world.scheduler, fixture("captured_bind_args.json")) == {"Error": ""}
    assert world.cluster.bindings == [("hami-capture", "vgpu-capture", "gpu-a100")]


def test_replay_of_what_a_real_api_server_sent_to_the_webhook(serve: Any) -> None:
    """captured_admission_review_*.json: kube-apiserver v1.36.3 calling /webhook."""
    world = World()
    http = serve(world.app)
    answers = {
        name: http.post("/webhook", json=fixture(f"captured_admission_review_{name}.json")).json()[
            "response"
        ]
        for name in ("gpu", "cpu", "priv", "memonly")
    }
    patch = {
        op["path"]: op.get("value") for op in json.loads(base64.b64decode(answers["gpu"]["patch"]))
    }
    assert patch["/spec/schedulerName"] == "hami-scheduler"
    # a card-only request gets the whole card's cores (defaultExclusiveCoreIfNeeded)
    assert patch["/spec/containers/0/resources/limits/nvidia.com~1gpucores"] == "100"
    assert answers["cpu"]["allowed"] is True and "patch" not in answers["cpu"]
    assert answers["priv"]["status"]["message"] == "container main is privileged"
    # gpumem without nvidia.com/gpu: defaultGPUNum (1) is added, as v2.10 does
    memonly = {
        op["path"]: op.get("value")
        for op in json.loads(base64.b64decode(answers["memonly"]["patch"]))
    }
    assert memonly["/spec/containers/0/resources/limits/nvidia.com~1gpu"] == "1"


def test_async_filter_patch_experiment_binds_only_after_the_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(SchedulerConfig(async_filter_patch=True))
    pod = world.add_vgpu_pod("p")
    real = world.cluster.patch_pod_annotations
    gate = threading.Event()

    def slow(ns: str, name: str, annos: dict[str, str | None]) -> None:
        if ann.ASSIGNED_NODE in annos:
            gate.wait(10)
        real(ns, name, annos)

    monkeypatch.setattr(world.cluster, "patch_pod_annotations", slow)
    assert filter_mod.filter(world.scheduler, filter_args(pod))["NodeNames"] == ["gpu-node-1"]
    assert ann.ASSIGNED_NODE not in world.annotations("p")  # answered before the write
    threading.Timer(0.3, gate.set).start()
    assert bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1")) == {"Error": ""}
    assert world.annotations("p")[ann.DEVICES_TO_ALLOCATE].startswith("GPU-gpu-node-1-00,")

    def refuse(ns: str, name: str, annos: dict[str, str | None]) -> None:
        if ann.ASSIGNED_NODE in annos:
            raise ClusterError("pod q: HTTP 500")
        real(ns, name, annos)

    monkeypatch.setattr(world.cluster, "patch_pod_annotations", refuse)
    other = world.add_vgpu_pod("q")
    filter_mod.filter(world.scheduler, filter_args(other, ["gpu-node-2"]))
    assert bind_mod.bind(world.scheduler, bind_args(other, "gpu-node-2")) == {
        "Error": "pod q: HTTP 500"
    }
    assert all(c.usedmem == 0 for c in world.scheduler.usage()["gpu-node-2"])  # given back


def test_async_filter_patch_write_that_never_lands_fails_the_bind_with_a_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # concurrent.futures.TimeoutError() has an empty str: {"Error": ""} would be a success
    world = World(SchedulerConfig(async_filter_patch=True))
    pod = world.add_vgpu_pod("p")
    real = world.cluster.patch_pod_annotations
    gate = threading.Event()

    def stuck(ns: str, name: str, annos: dict[str, str | None]) -> None:
        if ann.ASSIGNED_NODE in annos:
            gate.wait(10)
        real(ns, name, annos)

    monkeypatch.setattr(world.cluster, "patch_pod_annotations", stuck)
    monkeypatch.setattr(bind_mod, "FILTER_WRITE_WAIT", 0.2)
    filter_mod.filter(world.scheduler, filter_args(pod, ["gpu-node-1"]))
    try:
        answer = bind_mod.bind(world.scheduler, bind_args(pod, "gpu-node-1"))
    finally:
        gate.set()
    assert answer == {"Error": "Filter's annotations not written within 0.2s"}
    assert world.cluster.bindings == []
    assert all(c.usedmem == 0 for c in world.scheduler.usage()["gpu-node-1"])


def test_mig_mode_filter_reserves_a_profile_and_placement_and_the_books_follow() -> None:
    """On a MIG-mode registration (v2.10.0 dynamic MIG) Filter writes the reservation in
    hami.io/vgpu-mig-allocations beside the devices; the next pod sees the placement taken;
    once the device plugin adds the runtime identity the instance shows in the metrics;
    a finished pod gives the placement back."""
    world = World()
    profiles = [
        {"name": "1g.5gb", "memoryMB": 4864, "core": 15, "sliceCount": 1,
         "placements": [{"start": s, "size": 1} for s in range(7)]},
        {"name": "3g.20gb", "memoryMB": 19968, "core": 43, "sliceCount": 3,
         "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}]},
    ]  # fmt: skip
    uuid = "GPU-mig-node-00"
    world.cluster.add_node(
        {
            "metadata": {
                "name": "mig-node",
                "annotations": {
                    ann.NODE_REGISTER: json.dumps(
                        [
                            {
                                "id": uuid,
                                "count": 7,
                                "devmem": 40960,
                                "devcore": 100,
                                "type": "NVIDIA A100-SXM4-40GB",
                                "mode": "mig",
                                "migProfiles": profiles,
                                "health": True,
                            }
                        ]
                    )
                },
            },
            "status": {"allocatable": {"nvidia.com/gpu": "70"}},
        }
    )
    world.scheduler.register()
    mig = {"nvidia.com/vgpu-mode": "mig"}
    reservations = []
    for name, mem in (("small", 3000), ("large", 15000)):
        pod = world.add_vgpu_pod(name, mem=mem, cores=0, annotations=mig)
        assert filter_mod.filter(world.scheduler, filter_args(pod, ["mig-node"]))["NodeNames"]
        annos = world.annotations(name)
        (reserved,) = json.loads(annos[ann.MIG_ALLOCATIONS])
        reservations.append(reserved)
    assert [(r["profile"], r["placement"]) for r in reservations] == [
        ("1g.5gb", {"start": 6, "size": 1}),
        ("3g.20gb", {"start": 0, "size": 4}),
    ]
    assert world.annotations("large")[ann.DEVICES_ALLOCATED] == f"{uuid},NVIDIA,19968,43:;"
    # no 3g.20gb placement is left on the GPU
    third = world.add_vgpu_pod("third", mem=15000, cores=0, annotations=mig)
    refused = filter_mod.filter(world.scheduler, filter_args(third, ["mig-node"]))
    assert refused["FailedNodes"] == {"mig-node": "1/1 CardMigTopologyInfeasible"}
    # the device plugin records the instance it created: the metrics show it
    runtime = {**reservations[1], "migUUID": "MIG-x", "gpuInstanceID": 2, "computeInstanceID": 0}
    world.cluster.patch_pod_annotations(
        "default", "large", {ann.MIG_ALLOCATIONS: json.dumps([runtime])}
    )
    (sample,) = [
        s
        for m in world.metrics.registry.collect()
        for s in m.samples
        if s.name == "hami_node_gpu_mig_instance_info"
    ]
    assert sample.labels["mig_uuid"] == "MIG-x" and sample.labels["placement_start"] == "0"
    # "large" finished: its placement is free for "third"
    done = world.pod("large")
    done["status"] = {"phase": "Succeeded"}
    world.cluster.update_pod(done)
    assert filter_mod.filter(world.scheduler, filter_args(third, ["mig-node"]))["NodeNames"]
