"""Every gRPC service the lab serves, fuzzed by the harness of tests/component/fuzzing.py.

The device plugin's DevicePlugin service runs as ``gpulab device-plugin`` (a real process
on the NVML shim, whole GPUs and time-sliced replicas) and as HAMi's plugin (the same
server class with :class:`HamiAllocator`, in-process over a FakeCluster that holds the
pod its Allocate looks for). Kubelet's Registration service is the node agent's
:class:`ManagerImpl`, serving ``kubelet.sock`` as ``gpulab node-agent`` does; the device
plugin processes register with it. Every call goes over the real unix socket through a
generic ``channel.unary_unary`` / ``unary_stream`` with an identity serializer, so raw
bytes reach the server as they would from a broken client.

Each method gets ``fuzzing.ROUNDS`` requests and must answer every one within the
deadline, with an answer or a refusal that says why (upstream's text where upstream has
one), never grpcio's "Exception calling application" (an exception in the servicer).
Afterwards ListAndWatch still streams, the plugin process is alive, and the valid example
still answers correctly. ``test_every_served_grpc_method_is_fuzzed`` keeps the table
complete: it reads the services the lab's servers register and their methods from the
proto.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fuzzing as fz
import grpc
import pytest
from google.protobuf.message import Message
from test_nodeagent_devicemanager import MemoryNodeAPI

from gpulab.deviceplugin.allocate import VISIBLE_DEVICES_ENV
from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.deviceplugin.config import Config
from gpulab.deviceplugin.hami import (
    HamiAllocator,
    NodeConfig,
    plugin_resource,
)
from gpulab.deviceplugin.health import xid_filter
from gpulab.deviceplugin.rm import GPUInfo, base_id, has_annotations
from gpulab.deviceplugin.server import NvidiaDevicePlugin
from gpulab.fakegpu.nvml import shim_env
from gpulab.fakegpu.paths import SHIM_DIR, SHIM_LIB
from gpulab.fakegpu.profiles import gpu_uuid
from gpulab.hami import annotations as ha
from gpulab.hami.fake import FakeCluster
from gpulab.nodeagent.manager import ManagerImpl
from gpulab.trace import Tracer
from gpulab.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
GPU = "nvidia.com/gpu"
DP = "v1beta1.DevicePlugin"
REG = "v1beta1.Registration"
TIME_SLICED = """
version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""


@pytest.fixture(scope="module", autouse=True)
def shim() -> Path:
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR)], check=True)
    assert SHIM_LIB.is_file(), "the NVML shim did not build"
    return SHIM_LIB


def short_dir(name: str) -> Path:
    """A socket dir directly under $TMPDIR (unix socket paths hold ~107 bytes)."""
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    return d


@dataclass
class Node:
    """One node: the node agent's Registration server and a device plugin registered."""

    socket_dir: Path
    manager: ManagerImpl
    ids: list[str]  # the plugin's device IDs
    proc: subprocess.Popen[str] | None = None

    def channel(self, socket: str = "nvidia-gpu.sock") -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{self.socket_dir / socket}")
        grpc.channel_ready_future(channel).result(timeout=15)
        return channel


def plugin_node(
    tmp: pytest.TempPathFactory, profile: str, gpus: int, config: str = "", replicas: int = 0
) -> Iterator[Node]:
    """``gpulab device-plugin`` registered with a node agent's ManagerImpl."""
    socket_dir = short_dir("dp-fuzz")
    work = tmp.mktemp(profile)
    manager = ManagerImpl(
        NODE, socket_dir, MemoryNodeAPI(), Tracer("node-agent", stream=io.StringIO())
    )
    manager.Start()
    env = {**os.environ, **shim_env(NODE, profile, work / "fake-gpu")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    cmd = [sys.executable, "-m", "gpulab", "device-plugin", "--node-name", NODE,
           "--socket-dir", str(socket_dir)]  # fmt: skip
    if config:
        (work / "config.yaml").write_text(config)
        cmd += ["--config-file", str(work / "config.yaml")]
    log = work / "plugin.log"
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)
    uuids = [gpu_uuid(NODE, i) for i in range(gpus)]
    ids = [f"{u}::{n}" for u in uuids for n in range(replicas)] if replicas else uuids
    try:
        wait_for(lambda: manager.capacity(GPU) == (len(ids), len(ids)), 30, "the plugin registered")
        yield Node(socket_dir, manager, ids, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        manager.Stop()
        for f in socket_dir.iterdir():
            f.unlink()
        socket_dir.rmdir()


@pytest.fixture(scope="module")
def nvidia(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    yield from plugin_node(tmp_path_factory, "t4-x4", 4)


@pytest.fixture(scope="module")
def nvidia_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    yield from plugin_node(tmp_path_factory, "t4-x4", 4, TIME_SLICED, replicas=2)


# -- HAMi's plugin: the same server class with HamiAllocator ---------------------------------

HAMI_GPUS = [
    GPUInfo(i, f"GPU-0000000{i}-1111-2222-3333-444444444444", "Tesla T4", 15360, (7, 5), i, 0)
    for i in range(2)
]


class HamiNode:
    """HAMi's plugin serving ``nvidia.com/gpu`` over a FakeCluster; ``arm`` puts back the
    pod HAMi's scheduler bound (node lock + devices-to-allocate) that Allocate consumes."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.cluster = FakeCluster()
        self.cluster.add_node({"metadata": {"name": NODE}})
        config = NodeConfig()
        self.plugin = NvidiaDevicePlugin(
            plugin_resource(HAMI_GPUS, config),
            HAMI_GPUS,
            Config(),
            socket_dir,
            Tracer("device-plugin", stream=io.StringIO()),
            NODE,
            xid_filter({}),
            HamiAllocator(
                None,
                NODE,
                Tracer("device-plugin", stream=io.StringIO()),
                config,  # type: ignore[arg-type]
                cluster=self.cluster,
            ),
            health_by_gpu=True,
        )
        self.ids = [d.id for d in self.plugin.resource.devices]
        self.uuid = HAMI_GPUS[0].uuid

    def arm(self) -> None:
        """The pod p: one container, 1000 MiB and 10% cores of GPU 0."""
        assigned = f"{self.uuid},NVIDIA,1000,10:;"
        self.cluster.nodes[NODE]["metadata"]["annotations"] = {
            ha.NODE_LOCK: "2026-01-01T00:00:00Z,ns,p"
        }
        self.cluster.pods.pop(("ns", "p"), None)
        self.cluster.add_pod(
            {
                "metadata": {
                    "name": "p",
                    "namespace": "ns",
                    "annotations": {
                        ha.ASSIGNED_NODE: NODE,
                        ha.BIND_TIME: "1700000000",
                        ha.BIND_PHASE: ha.BIND_ALLOCATING,
                        ha.DEVICES_TO_ALLOCATE: assigned,
                        ha.DEVICES_ALLOCATED: assigned,
                    },
                },
                "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
                "status": {"phase": "Pending"},
            }
        )

    def channel(self) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{self.plugin.socket}")
        grpc.channel_ready_future(channel).result(timeout=15)
        return channel


@pytest.fixture(scope="module")
def hami() -> Iterator[HamiNode]:
    socket_dir = short_dir("hami-fuzz")
    node = HamiNode(socket_dir)
    node.plugin.Serve()  # what Start does before Register: kubelet is not in this test
    try:
        yield node
    finally:
        node.plugin.Stop()
        socket_dir.rmdir()


# -- what each method gets and what its answers must be --------------------------------------

UNKNOWN_IDS = ["GPU-not-here", "", "\x00", "GPU-\x00", "x" * 5000, "💥", "MIG-nope", "::1"]
SIZES = [-1, 0, 1, 2, 3, 4, 8, 2**31 - 1, -(2**31)]


def device_vocabulary(ids: list[str]) -> fz.Vocabulary:
    """Valid IDs (duplicates come by choosing one twice) beside hostile ones."""
    pool = [*ids, *ids, *UNKNOWN_IDS, f"{ids[0]}::9", base_id(ids[-1]) + "-0"]
    return {
        "devices_ids": pool,
        "available_deviceIDs": pool,
        "must_include_deviceIDs": pool,
        "allocation_size": SIZES,
    }


def allocate_judge(gpus: Callable[[list[str]], set[str]]) -> Callable[[Message, Message], None]:
    """One container response per container request, visible GPUs ``gpus`` of its IDs."""

    def judge(request: Message, response: Message) -> None:
        if len(response.container_responses) != len(request.container_requests):
            raise fz.OutOfProtocol(
                f"{len(response.container_responses)} responses for "
                f"{len(request.container_requests)} container requests"
            )
        pairs = zip(request.container_requests, response.container_responses, strict=True)
        for req, resp in pairs:
            got = set(filter(None, resp.envs.get(VISIBLE_DEVICES_ENV, "").split(",")))
            if got != gpus(list(req.devices_ids)):
                raise fz.OutOfProtocol(f"{VISIBLE_DEVICES_ENV}={sorted(got)} for {req.devices_ids}")

    return judge


def preferred_judge(one_each: bool) -> Callable[[Message, Message], None]:
    """Preferred IDs come from the request's own available and must-include IDs; NVIDIA's
    plugin answers every container request (HAMi's only the ones it has a slot for)."""

    def judge(request: Message, response: Message) -> None:
        if one_each and len(response.container_responses) != len(request.container_requests):
            raise fz.OutOfProtocol("not one response per container request")
        for req, resp in zip(
            request.container_requests, response.container_responses, strict=False
        ):
            offered = {*req.available_deviceIDs, *req.must_include_deviceIDs}
            if not set(resp.deviceIDs) <= offered:
                raise fz.OutOfProtocol(f"preferred {list(resp.deviceIDs)[:4]} not offered")

    return judge


def list_judge(ids: list[str]) -> Callable[[Message, Message], None]:
    def judge(_request: Message, response: Message) -> None:
        if sorted(d.ID for d in response.devices) != sorted(ids):
            raise fz.OutOfProtocol(f"ListAndWatch listed {len(response.devices)} devices")

    return judge


def allocate_expect(ids: list[str], shared: bool) -> Callable[[Message], str | None]:
    """upstream rm.go ValidateRequest, wrapped by server.go Allocate, per container in turn."""

    def expect(request: Message) -> str | None:
        for req in request.container_requests:
            unknown = [i for i in req.devices_ids if i not in ids]
            if unknown:
                return (
                    f'invalid allocation request for "{GPU}": invalid request: '
                    f"unknown device: {unknown[0]}"
                )
            if shared and len(req.devices_ids) > 1:
                return (
                    f"maximum request size for shared resources is 1; found {len(req.devices_ids)}"
                )
        return None

    return expect


def preferred_expect(ids: list[str]) -> Callable[[Message], str | None]:
    """nvml_manager.go alignedAlloc's texts for IDs gpuallocator does not know (whole GPUs,
    no replica IDs); greedyAlloc's when too few known devices are left."""

    def expect(request: Message) -> str | None:
        prefix = "error getting list of preferred allocation devices: "
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            # nvml_manager.go: whole GPUs without replica IDs go to alignedAlloc
            if not any(has_annotations(i) for i in available):
                for what, listed in (("available", available), ("required", must)):
                    unknown = [i for i in listed if i not in ids]
                    if unknown:
                        return (
                            f"{prefix}unable to retrieve list of {what} devices: "
                            f"no device with uuid: {unknown[0]}"
                        )
                continue
            candidates = {i for i in available if i in ids} - {i for i in must if i in ids}
            if len(candidates) < req.allocation_size - len(must):
                return f"{prefix}not enough available devices to satisfy allocation"
        return None

    return expect


def device_plugin_methods(
    ids: list[str], shared: bool = False, hami: HamiNode | None = None
) -> list[fz.GrpcMethod]:
    vocabulary = device_vocabulary(ids)
    before = hami.arm if hami is not None else (lambda: None)
    allocate = api_pb2.AllocateRequest()
    allocate.container_requests.add(devices_ids=ids[:1])
    pre_start = api_pb2.PreStartContainerRequest(devices_ids=ids[:1])
    preferred = api_pb2.PreferredAllocationRequest()
    preferred.container_requests.add(
        available_deviceIDs=ids, must_include_deviceIDs=ids[1:2], allocation_size=2
    )
    if not shared and hami is None:
        allocate.container_requests.add(devices_ids=ids[1:3])  # two containers, two GPUs
    return [
        fz.GrpcMethod(DP, "GetDevicePluginOptions", api_pb2.Empty(), vocabulary),
        fz.GrpcMethod(DP, "ListAndWatch", api_pb2.Empty(), vocabulary, list_judge(ids)),
        fz.GrpcMethod(
            DP,
            "GetPreferredAllocation",
            preferred,
            vocabulary,
            preferred_judge(one_each=hami is None),
            preferred_expect(ids) if hami is None else lambda _r: None,
            before,
        ),
        fz.GrpcMethod(
            DP,
            "Allocate",
            allocate,
            vocabulary,
            # HAMi's plugin hands out the GPU its scheduler assigned, whatever the IDs say
            allocate_judge(lambda req: {base_id(i) for i in req} if hami is None else {hami.uuid}),
            allocate_expect(ids, shared) if hami is None else lambda _r: None,
            before,
        ),
        fz.GrpcMethod(DP, "PreStartContainer", pre_start, vocabulary),
    ]


VALID_RESOURCES = [GPU, "example.com/fuzz"]
REGISTER_VOCABULARY: fz.Vocabulary = {
    "version": ["v1beta1", "v1alpha", "v1", "", "V1BETA1", "v1beta1\x00", "x" * 5000],
    "endpoint": [
        "nvidia-gpu.sock",
        "kubelet.sock",  # a socket that serves Registration, not DevicePlugin
        "missing.sock",
        "",
        ".",
        "../../etc/passwd",
        "/",
        "x" * 5000,
        "a\x00b",
        "nvidia-gpu.sock/..",
    ],
    "resource_name": [
        *VALID_RESOURCES,
        "",
        "gpu",
        "kubernetes.io/gpu",
        "requests.nvidia.com/gpu",
        "nvidia.com/" + "x" * 64,
        "nvidia.com/gpu\n",
        "💥/x",
        "\x00",
        "x" * 5000,
        "a/b/c",
    ],
}


def register_expect(request: Message) -> str | None:
    """kubelet's server.go texts, checked in its order: version, resource name, dial."""
    if request.version != "v1beta1":
        return f'requested API version "{request.version}" is not supported by kubelet'
    if request.resource_name not in VALID_RESOURCES:
        if request.resource_name not in REGISTER_VOCABULARY["resource_name"]:
            return None  # a name raw bytes made: valid or not, kubelet's check decides
        return f'the ResourceName "{request.resource_name}" is invalid'
    if request.endpoint == "kubelet.sock":
        return "failed to get device plugin options"
    if request.endpoint != "nvidia-gpu.sock":
        return "failed to dial device plugin"
    return None


REGISTER = fz.GrpcMethod(
    REG,
    "Register",
    api_pb2.RegisterRequest(
        version="v1beta1",
        endpoint="nvidia-gpu.sock",
        resource_name=GPU,
        options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
    ),
    REGISTER_VOCABULARY,
    expect=register_expect,
)


# server fixture -> its methods; every gRPC method the lab serves is here
def table(ids: dict[str, list[str]] | None = None) -> dict[str, list[fz.GrpcMethod]]:
    ids = ids or {}
    t4 = [gpu_uuid(NODE, i) for i in range(4)]
    return {
        "nvidia": device_plugin_methods(ids.get("nvidia", t4)),
        "nvidia_shared": device_plugin_methods(
            ids.get("nvidia_shared", [f"{u}::{n}" for u in t4 for n in range(2)]), shared=True
        ),
        "hami": device_plugin_methods(ids.get("hami", ["hami"])),
        "kubelet": [REGISTER],
    }


CASES = [(server, i, m) for server, ms in table().items() for i, m in enumerate(ms)]


@pytest.mark.parametrize(
    ("server", "index"), [(s, i) for s, i, _ in CASES], ids=[f"{s}:{m.path}" for s, _, m in CASES]
)
def test_grpc_method_survives_hostile_requests(
    server: str, index: int, request: pytest.FixtureRequest
) -> None:
    if server == "hami":
        node: HamiNode | Node = request.getfixturevalue("hami")
        method = device_plugin_methods(node.ids, hami=node)[index]  # type: ignore[arg-type]
    elif server == "kubelet":
        node = request.getfixturevalue("nvidia")
        method = REGISTER
    else:
        node = request.getfixturevalue(server)
        method = table({server: node.ids})[server][index]
    channel = node.channel("kubelet.sock") if server == "kubelet" else node.channel()
    with channel:
        report = fz.run_grpc(channel, method)
        # options, ListAndWatch and PreStartContainer take any request: nothing to refuse
        report.check(both_paths=method.name in ("Allocate", "GetPreferredAllocation", "Register"))
        assert report.counts["huge"] == fz.ROUNDS // 200 + (fz.ROUNDS % 200 > 7)
        still_streams(channel if server != "kubelet" else node.channel(), node.ids)
    if isinstance(node, Node):
        assert node.proc is not None and node.proc.poll() is None, "the plugin process died"
        assert node.manager.capacity(GPU) == (len(node.ids), len(node.ids))


def still_streams(channel: grpc.Channel, ids: list[str]) -> None:
    """ListAndWatch opens and lists every device."""
    stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty(), timeout=5)
    try:
        first = next(stream)
    finally:
        stream.cancel()
    assert sorted(d.ID for d in first.devices) == sorted(ids)


# -- inventory: every served gRPC method is in the table -----------------------------------


def registered_services() -> set[str]:
    """The services the lab's servers register (``add_<Service>Servicer_to_server`` in
    gpulab/), by their full proto names."""
    found: set[str] = set()
    for path in (ROOT / "gpulab").rglob("*.py"):
        if path.name.endswith("_pb2_grpc.py"):
            continue
        for name in re.findall(r"add_(\w+)Servicer_to_server\(", path.read_text()):
            found.add(f"{api_pb2.DESCRIPTOR.package}.{name}")
    return found


def served_methods() -> set[str]:
    """Every method of every registered service, from the proto."""
    services = api_pb2.DESCRIPTOR.services_by_name
    return {
        f"/{full}/{m.name}"
        for full in registered_services()
        for m in services[full.rsplit(".", 1)[-1]].methods
    }


def test_every_served_grpc_method_is_fuzzed() -> None:
    assert registered_services() == {DP, REG}
    fuzzed = {m.path for ms in table().values() for m in ms}
    missing = sorted(served_methods() - fuzzed)
    assert not missing, f"served but not in the gRPC fuzz table of {__file__}: {missing}"
    # the device plugin's table is complete for each of its servers
    for server, ms in table().items():
        if server != "kubelet":
            assert {m.path for m in ms} == {p for p in served_methods() if p.startswith(f"/{DP}/")}


def test_the_grpc_inventory_names_a_method_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    full = table()
    monkeypatch.setattr(sys.modules[__name__], "table", lambda *_: {**full, "kubelet": []})
    with pytest.raises(AssertionError, match=r"/v1beta1\.Registration/Register"):
        test_every_served_grpc_method_is_fuzzed()


# -- what the fuzz found, each with its failing input ----------------------------------------


@pytest.mark.parametrize(
    ("socket", "method", "type_name"),
    [
        ("nvidia-gpu.sock", f"/{DP}/Allocate", "AllocateRequest"),
        ("nvidia-gpu.sock", f"/{DP}/ListAndWatch", "Empty"),
        ("kubelet.sock", f"/{REG}/Register", "RegisterRequest"),
    ],
)
def test_an_undecodable_request_is_refused_as_grpc_go_refuses_it(
    nvidia: Node, socket: str, method: str, type_name: str
) -> None:
    """grpcio answered "Exception deserializing request!" (and logged a traceback)."""
    with nvidia.channel(socket) as channel:
        call = (channel.unary_stream if "ListAndWatch" in method else channel.unary_unary)(method)
        with pytest.raises(grpc.RpcError) as err:
            response = call(b"\xdf", timeout=fz.DEADLINE)
            if "ListAndWatch" in method:
                next(response)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert err.value.details() == (
        "grpc: error unmarshalling request: Error parsing message with type "
        f"'v1beta1.{type_name}': Wire format was corrupt"
    )


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("missing.sock", "no such file or directory"),
        ("nvidia-gpu.sock/..", "not a directory"),
        ("", "connection refused"),  # the socket dir itself
        ("x" * 5000, "AF_UNIX path too long"),
    ],
)
def test_register_naming_no_socket_is_refused_at_once(
    nvidia: Node, endpoint: str, reason: str
) -> None:
    """It waited for the 10 s dial timeout (kubelet's WithBlock dial) before refusing."""
    request = api_pb2.RegisterRequest(version="v1beta1", endpoint=endpoint, resource_name=GPU)
    start = time.monotonic()
    with nvidia.channel("kubelet.sock") as channel, pytest.raises(grpc.RpcError) as err:
        api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=10)
    assert time.monotonic() - start < fz.DEADLINE
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    path = nvidia.socket_dir / endpoint
    assert (
        err.value.details() == f"failed to dial device plugin: dial unix {path}: connect: {reason}"
    )
    assert nvidia.manager.capacity(GPU) == (len(nvidia.ids), len(nvidia.ids))  # untouched


def test_cancelled_list_and_watch_streams_free_their_threads(nvidia: Node) -> None:
    """A cancelled stream held one of the plugin's 16 workers until its 0.5 s wait ended:
    100 reconnects took 2 s, and Allocate waited behind them."""
    with nvidia.channel() as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        start = time.monotonic()
        for _ in range(100):
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=5)
            next(stream)
            stream.cancel()
        took = time.monotonic() - start
        request = api_pb2.AllocateRequest(container_requests=[{"devices_ids": nvidia.ids[:1]}])
        assert stub.Allocate(request, timeout=fz.DEADLINE).container_responses
    assert took < 1.0, f"100 ListAndWatch reconnects took {took:.1f}s"
