"""The node agent's device manager against real device-plugin processes, over real gRPC.

The API server is replaced by an in-memory NodeAPI (the injectable interface of
``gpulab.nodeagent.manager``) that also plays the pod informer (the manager's Store and
handlers); the Kubernetes side (node status patch, pod informer, annotations, Failed
status) is covered by the e2e tests on the local backend. Where a test needs a plugin that
misbehaves on purpose, a small gRPC DevicePlugin server in this file plays it.
"""

from __future__ import annotations

import copy
import io
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.fakegpu.nvml import shim_env
from gpulab.fakegpu.paths import SHIM_DIR, SHIM_LIB
from gpulab.fakegpu.profiles import gpu_uuid, load
from gpulab.nodeagent.manager import ManagerImpl
from gpulab.trace import Tracer
from gpulab.wait import WaitTimeout, wait_for

NODE = "gpu-node-1"
GPU = "nvidia.com/gpu"
NUMA = {gpu_uuid(NODE, g.index): g.numa_node for g in load("t4-x4").gpus}


@pytest.fixture(scope="module", autouse=True)
def shim() -> Path:
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR)], check=True)
    assert SHIM_LIB.is_file(), "the NVML shim did not build"
    return SHIM_LIB


class MemoryNodeAPI:
    """An API server holding one node's status and its pods, feeding the manager's pod
    informer (Store + handlers) as a watch would."""

    def __init__(self) -> None:
        self.capacity: dict[str, str] = {}
        self.allocatable: dict[str, str] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.manager: ManagerImpl | None = None

    def _deliver(self, kind: str, pod: dict[str, Any]) -> None:
        assert self.manager is not None
        obj = copy.deepcopy(pod)
        old = self.manager.pods.apply(kind, obj)
        h = self.manager.handlers
        if kind == "ADDED":
            h.on_add(obj)
        elif kind == "MODIFIED":
            h.on_update(old or obj, obj)
        else:
            h.on_delete(obj)

    # NodeAPI
    def patch_node_resources(self, node, capacity, allocatable) -> None:
        with self.lock:
            self.capacity.update(capacity)
            self.allocatable.update(allocatable)

    def annotate_pod(self, namespace, name, annotations) -> None:
        with self.lock:
            pod = self.pods[name]
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        self._deliver("MODIFIED", pod)

    def fail_pod(self, namespace, name, reason, message) -> None:
        with self.lock:
            pod = self.pods[name]
            pod["status"] = {"phase": "Failed", "reason": reason, "message": message}
        self._deliver("MODIFIED", pod)

    # test side
    def add(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pods[pod["metadata"]["name"]] = pod
        self._deliver("ADDED", pod)

    def delete(self, name: str) -> None:
        with self.lock:
            pod = self.pods.pop(name)
        self._deliver("DELETED", pod)

    def record(self, name: str, container: str = "main") -> dict[str, Any] | None:
        with self.lock:
            annos = self.pods[name]["metadata"].get("annotations", {})
            value = annos.get(f"gpulab.io/allocate-{container}")
        return json.loads(value) if value else None

    def status(self, name: str) -> dict[str, Any]:
        with self.lock:
            return dict(self.pods[name]["status"])


def gpu_pod(name: str, gpus: int, annotations: dict[str, str] | None = None, **extra) -> dict:
    return {
        "metadata": {
            "uid": f"uid-{name}",
            "name": name,
            "namespace": "default",
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "resources": {"limits": {GPU: str(gpus)}}}],
            **extra,
        },
        "status": {"phase": "Pending"},
    }


def start_plugin(
    socket_dir: Path, state_dir: Path, log: Path, profile: str, *args: str
) -> subprocess.Popen[str]:
    env = {**os.environ, **shim_env(NODE, profile, state_dir)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    cmd = [sys.executable, "-m", "gpulab", "device-plugin", "--node-name", NODE,
           "--socket-dir", str(socket_dir), *args]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def plugin(socket_dir: Path, state_dir: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = start_plugin(socket_dir, state_dir, tmp_path / "plugin.log", "t4-x4")
    yield proc
    proc.terminate()
    proc.wait(timeout=10)


def start_agent(socket_dir: Path, api: MemoryNodeAPI, **kwargs: Any) -> ManagerImpl:
    tracer = Tracer("node-agent", None, stream=io.StringIO())
    manager = ManagerImpl(NODE, socket_dir, api, tracer, **kwargs)
    api.manager = manager
    manager.Start()
    return manager


@pytest.fixture
def agent(socket_dir: Path) -> Iterator[tuple[ManagerImpl, MemoryNodeAPI]]:
    api = MemoryNodeAPI()
    manager = start_agent(socket_dir, api)
    yield manager, api
    manager.Stop()


class FakePlugin(api_pb2_grpc.DevicePluginServicer):
    """A device plugin the test steers: ListAndWatch sends what ``send`` is given."""

    def __init__(self, socket: Path, devices: list[str], prefer: list[str] | None = None) -> None:
        self.socket = socket
        self.calls: list[str] = []
        self.prefer = prefer
        self.allocate_error: str | None = None
        self._updates: queue.Queue[list[str] | None] = queue.Queue()
        self._updates.put(devices)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{socket}")
        self._server.start()

    def send(self, devices: list[str]) -> None:
        self._updates.put(devices)

    def stop(self) -> None:
        self._updates.put(None)
        self._server.stop(grace=0).wait()

    def register(self, kubelet: Path, resource: str = GPU, version: str = "v1beta1") -> None:
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=version,
                    endpoint=self.socket.name,
                    resource_name=resource,
                    options=api_pb2.DevicePluginOptions(
                        get_preferred_allocation_available=self.prefer is not None
                    ),
                ),
                timeout=30,
            )
        self.calls.append("Register returned")

    def GetDevicePluginOptions(self, request, context):
        self.calls.append("GetDevicePluginOptions")
        return api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=self.prefer is not None
        )

    def ListAndWatch(self, request, context):
        while context.is_active():
            try:
                devices = self._updates.get(timeout=0.2)
            except queue.Empty:
                continue
            if devices is None:
                return
            yield api_pb2.ListAndWatchResponse(
                devices=[api_pb2.Device(ID=d, health="Healthy") for d in devices]
            )

    def GetPreferredAllocation(self, request, context):
        response = api_pb2.PreferredAllocationResponse()
        response.container_responses.add(deviceIDs=self.prefer or [])
        return response

    def Allocate(self, request, context):
        if self.allocate_error:
            context.abort(grpc.StatusCode.UNKNOWN, self.allocate_error)
        response = api_pb2.AllocateResponse()
        for req in request.container_requests:
            response.container_responses.add(
                envs={"NVIDIA_VISIBLE_DEVICES": ",".join(req.devices_ids)}
            )
        return response


@pytest.fixture
def fakes() -> Iterator[list[FakePlugin]]:
    made: list[FakePlugin] = []
    yield made
    for f in made:
        f.stop()


def fake(fakes: list[FakePlugin], socket_dir: Path, name: str, devices, **kw) -> FakePlugin:
    plugin = FakePlugin(socket_dir / name, devices, **kw)
    fakes.append(plugin)
    return plugin


# ---------------------------------------------------------------- capacity


def test_capacity_follows_list_and_watch_and_health(
    agent, plugin, state_dir: Path, tmp_path: Path
) -> None:
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "4", 15, "allocatable 4")
    assert api.capacity[GPU] == "4"
    # an Xid from before the health check watches is never delivered (NVML does not replay)
    log = tmp_path / "plugin.log"
    wait_for(lambda: "for Xid critical errors" in log.read_text(), 30, "the health check")
    cmd = [sys.executable, "-m", "gpulab", "fake-gpu", "inject", "--node", NODE,
           "--state-dir", str(state_dir)]  # fmt: skip
    subprocess.run([*cmd, "--gpu", "2", "--xid", "79"], check=True, capture_output=True)
    wait_for(lambda: api.allocatable.get(GPU) == "3", 10, "allocatable 3 after an Xid")
    assert api.capacity[GPU] == "4"  # kubelet keeps unhealthy devices in capacity


def test_a_stopped_plugin_keeps_its_capacity_for_the_grace_period_then_goes(
    socket_dir: Path, plugin
) -> None:
    api = MemoryNodeAPI()
    manager = start_agent(socket_dir, api, grace_period=2.0)
    try:
        wait_for(lambda: api.allocatable.get(GPU) == "4", 15, "allocatable 4")
        plugin.terminate()
        wait_for(lambda: api.allocatable.get(GPU) == "0", 10, "allocatable 0")
        assert api.capacity[GPU] == "4"  # still known, nothing allocatable
        wait_for(lambda: api.capacity.get(GPU) == "0", 10, "the resource removed (capacity 0)")
        assert api.allocatable[GPU] == "0"
    finally:
        manager.Stop()


def test_agent_started_after_the_plugin_gets_it_registered(
    socket_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "early.log"
    proc = start_plugin(socket_dir, state_dir, log, "t4-x4")
    try:
        # no kubelet yet: the plugin's start fails (upstream retries in 30 s) ...
        wait_for(lambda: "Failed to start plugin" in log.read_text(), 15, "a failed start")
        api = MemoryNodeAPI()
        manager = start_agent(socket_dir, api)
        try:  # ... and kubelet.sock appearing restarts it at once
            wait_for(lambda: api.allocatable.get(GPU) == "4", 10, "the registration")
        finally:
            manager.Stop()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---------------------------------------------------------------- registration


def test_options_are_fetched_before_register_answers(agent, socket_dir: Path, fakes) -> None:
    p = fake(fakes, socket_dir, "p.sock", ["D0", "D1"])
    p.register(socket_dir / "kubelet.sock")
    assert p.calls == ["GetDevicePluginOptions", "Register returned"]
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "2", 5, "allocatable 2")


def test_a_stale_endpoints_stop_does_not_touch_the_new_registration(
    agent, socket_dir: Path, fakes
) -> None:
    _, api = agent
    old = fake(fakes, socket_dir, "old.sock", ["D0", "D1", "D2"])
    old.register(socket_dir / "kubelet.sock")
    wait_for(lambda: api.allocatable.get(GPU) == "3", 5, "the old plugin's 3 devices")
    new = fake(fakes, socket_dir, "new.sock", ["D0", "D1", "D2", "D3"])
    new.register(socket_dir / "kubelet.sock")
    wait_for(lambda: api.allocatable.get(GPU) == "4", 5, "the new plugin's 4 devices")
    old.send(["D0"])  # a late update from the replaced endpoint ...
    old.stop()  # ... and its stream ending after the new registration
    with pytest.raises(WaitTimeout):
        wait_for(lambda: api.allocatable.get(GPU) != "4", 2, "a change that must not come")
    new.send(["D0", "D1", "D2", "D3", "D4"])  # the positive control: the new one counts
    wait_for(lambda: api.allocatable.get(GPU) == "5", 5, "the new plugin's update")


@pytest.mark.parametrize(
    ("version", "resource", "message"),
    [
        (
            "v1alpha",
            GPU,
            'requested API version "v1alpha" is not supported by kubelet. Supported version '
            'is ["v1beta1"]',
        ),
        ("v1beta1", "gpu", 'the ResourceName "gpu" is invalid'),
        ("v1beta1", "kubernetes.io/gpu", 'the ResourceName "kubernetes.io/gpu" is invalid'),
    ],
)
def test_refused_registrations_carry_kubelets_code_and_message(
    agent, socket_dir: Path, fakes, version: str, resource: str, message: str
) -> None:
    p = fake(fakes, socket_dir, "p.sock", ["D0"])
    with pytest.raises(grpc.RpcError) as err:
        p.register(socket_dir / "kubelet.sock", resource=resource, version=version)
    assert err.value.code() == grpc.StatusCode.UNKNOWN  # a plain Go error in kubelet
    assert err.value.details() == message
    assert p.calls == []  # refused before kubelet dialled back


def test_a_plugin_that_cannot_be_dialled_is_refused(socket_dir: Path) -> None:
    api = MemoryNodeAPI()
    manager = start_agent(socket_dir, api, dial_timeout=1.0)
    try:
        with (
            grpc.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel,
            pytest.raises(grpc.RpcError) as err,
        ):
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(version="v1beta1", endpoint="gone.sock", resource_name=GPU),
                timeout=10,
            )
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert err.value.details().startswith("failed to dial device plugin:")
        assert api.capacity == {}
    finally:
        manager.Stop()


# ---------------------------------------------------------------- allocation


def test_pods_get_disjoint_numa_aligned_devices_and_overflow_is_rejected(agent, plugin) -> None:
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "4", 15, "allocatable 4")
    api.add(gpu_pod("p1", 2))
    first = wait_for(lambda: api.record("p1"), 10, "p1 allocation")
    ids = first["devices"][GPU]
    # the two lowest IDs on this node sit on different NUMA nodes: only
    # GetPreferredAllocation keeps the pair on one
    assert len({NUMA[i] for i in sorted(NUMA)[:2]}) == 2
    assert len(ids) == 2 and len({NUMA[i] for i in ids}) == 1
    assert first["envs"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    assert first["deviceSpecs"] == []  # the plugin runs without --pass-device-specs
    api.add(gpu_pod("p2", 2))
    second = wait_for(lambda: api.record("p2"), 10, "p2 allocation")["devices"][GPU]
    assert not set(second) & set(ids)
    api.add(gpu_pod("p3", 2))
    status = wait_for(
        lambda: api.status("p3").get("phase") == "Failed" and api.status("p3"), 10, "p3 fail"
    )
    assert status["reason"] == "UnexpectedAdmissionError"
    assert status["message"] == (
        "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
        "Requested: 2, Available: 0, which is unexpected"
    )
    assert api.record("p3") is None
    # p1 finishes: its 2 GPUs make room again
    api.delete("p1")
    api.add(gpu_pod("p4", 2))
    fourth = wait_for(lambda: api.record("p4"), 10, "p4 allocation")["devices"][GPU]
    assert set(fourth) == set(ids)


def test_a_rejected_pod_another_writer_set_running_is_failed_again(agent, plugin) -> None:
    """kwok's pod-ready stage may patch Running (from the Pending it saw) over the agent's
    Failed: as kubelet's status manager, the agent writes its status again."""
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "4", 15, "allocatable 4")
    api.add(gpu_pod("holder", 4))
    wait_for(lambda: api.record("holder"), 10, "holder allocation")
    real = api.fail_pod
    calls: list[str] = []

    def overwritten_first(namespace, name, reason, message) -> None:
        calls.append(reason)
        if len(calls) > 1:
            return real(namespace, name, reason, message)
        with api.lock:  # the other writer's patch lands last: the watch never shows Failed
            api.pods[name]["status"] = {"phase": "Running"}
        api._deliver("MODIFIED", api.pods[name])

    api.fail_pod = overwritten_first
    api.add(gpu_pod("late", 2))
    status = wait_for(
        lambda: api.status("late").get("phase") == "Failed" and api.status("late"),
        10,
        "the rejected pod failed again",
    )
    assert status["reason"] == "UnexpectedAdmissionError"
    assert calls == ["UnexpectedAdmissionError"] * 2 and api.record("late") is None


def test_a_preferred_allocation_naming_unavailable_devices_falls_back(
    agent, socket_dir: Path, fakes
) -> None:
    _, api = agent
    p = fake(fakes, socket_dir, "p.sock", ["D0", "D1", "D2"], prefer=["D9", "D2"])
    p.register(socket_dir / "kubelet.sock")
    wait_for(lambda: api.allocatable.get(GPU) == "3", 5, "allocatable 3")
    api.add(gpu_pod("p", 2))
    got = wait_for(lambda: api.record("p"), 10, "an allocation")["devices"][GPU]
    assert got == ["D2", "D0"]  # D2 from the preference, then the first free device


def test_a_failing_allocate_fails_the_pod_with_kubelets_message(
    agent, socket_dir: Path, fakes
) -> None:
    _, api = agent
    p = fake(fakes, socket_dir, "p.sock", ["D0"])
    p.allocate_error = "invalid allocation request: boom"
    p.register(socket_dir / "kubelet.sock")
    wait_for(lambda: api.allocatable.get(GPU) == "1", 5, "allocatable 1")
    api.add(gpu_pod("p", 1))
    status = wait_for(
        lambda: api.status("p").get("phase") == "Failed" and api.status("p"), 10, "fail"
    )
    assert status["message"] == (
        "Allocate failed due to rpc error: code = Unknown desc = invalid allocation request: "
        "boom, which is unexpected"
    )


def test_init_container_devices_are_reused_by_the_app_container(agent, plugin) -> None:
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "4", 15, "allocatable 4")
    pod = gpu_pod(
        "init", 1, initContainers=[{"name": "warmup", "resources": {"limits": {GPU: "1"}}}]
    )
    api.add(pod)
    app = wait_for(lambda: api.record("init"), 10, "the app container's allocation")
    warmup = api.record("init", "warmup")
    assert warmup is not None and app["devices"][GPU] == warmup["devices"][GPU]


def test_restart_rebuilds_allocations_from_pod_annotations(socket_dir: Path, plugin) -> None:
    taken = [gpu_uuid(NODE, i) for i in range(3)]
    held = {"devices": {GPU: taken}, "envs": {}, "mounts": [], "deviceSpecs": []}
    api = MemoryNodeAPI()
    manager = start_agent(socket_dir, api)
    try:
        old = gpu_pod("old", 3, {"gpulab.io/allocate-main": json.dumps(held)})
        old["status"]["phase"] = "Running"
        api.add(old)
        wait_for(lambda: api.allocatable.get(GPU) == "4", 15, "allocatable 4")
        api.add(gpu_pod("new", 1))
        got = wait_for(lambda: api.record("new"), 10, "new allocation")["devices"][GPU]
        assert got == [gpu_uuid(NODE, 3)]
        assert api.record("old")["devices"][GPU] == taken  # not re-allocated
    finally:
        manager.Stop()


def test_mig_mixed_node_gets_one_extended_resource_per_profile(
    agent, socket_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    _, api = agent
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    proc = start_plugin(
        socket_dir, state_dir, tmp_path / "mig.log", "a100-80gb-mig-x8", "--config-file",
        str(config),
    )  # fmt: skip
    try:
        expected = {
            "nvidia.com/mig-1g.10gb": "36",
            "nvidia.com/mig-2g.20gb": "4",
            "nvidia.com/mig-3g.40gb": "4",
        }
        wait_for(lambda: api.allocatable == expected, 15, "three MIG resources")
        assert api.capacity == expected
        pod = gpu_pod("m1", 0)
        pod["spec"]["containers"] = [
            {"name": "main", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}
        ]
        api.add(pod)
        got = wait_for(lambda: api.record("m1"), 10, "MIG allocation")
        (mig,) = got["devices"]["nvidia.com/mig-3g.40gb"]
        assert mig.startswith("MIG-") and got["envs"]["NVIDIA_VISIBLE_DEVICES"] == mig
    finally:
        proc.terminate()
        proc.wait(timeout=10)
