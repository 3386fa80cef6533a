"""The node agent's device manager against a real device-plugin process, over real gRPC.

The API server is replaced by an in-memory NodeAPI (the injectable interface of
``gpulab.nodeagent.manager``); the Kubernetes side (KubeNodeAPI: node status patch, pod
watch, annotations, Failed status) is covered by the e2e tests on the local backend.
"""

from __future__ import annotations

import io
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.fakegpu.nvml import shim_env
from gpulab.fakegpu.paths import SHIM_LIB
from gpulab.fakegpu.profiles import gpu_uuid, load
from gpulab.nodeagent.manager import ManagerImpl
from gpulab.trace import Tracer
from gpulab.wait import wait_for

pytestmark = pytest.mark.skipif(
    not SHIM_LIB.exists(), reason="NVML shim not built (make -C fake-gpu)"
)

NODE = "gpu-node-1"
GPU = "nvidia.com/gpu"
NUMA = {gpu_uuid(NODE, g.index): g.numa_node for g in load("a100-sxm4-40gb-x8").gpus}


class MemoryNodeAPI:
    """An API server holding one node's status and its pods."""

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self.capacity: dict[str, str] = {}
        self.allocatable: dict[str, str] = {}
        self.pods = {p["metadata"]["uid"]: p for p in pods or []}
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.lock = threading.Lock()

    def patch_node_resources(self, node, capacity, allocatable) -> None:
        with self.lock:
            self.capacity.update(capacity)
            self.allocatable.update(allocatable)

    def list_pods(self, node):
        with self.lock:
            return [json.loads(json.dumps(p)) for p in self.pods.values()], "1"

    def watch_pods(self, node, resource_version, stop) -> Iterator[tuple[str, dict[str, Any]]]:
        while not stop.is_set():
            try:
                kind, pod = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            yield kind, json.loads(json.dumps(pod))

    def _find(self, namespace, name) -> dict[str, Any]:
        return next(p for p in self.pods.values() if p["metadata"]["name"] == name)

    def annotate_pod(self, namespace, name, annotations) -> None:
        with self.lock:
            pod = self._find(namespace, name)
            pod["metadata"].setdefault("annotations", {}).update(annotations)
        self.events.put(("MODIFIED", pod))

    def fail_pod(self, namespace, name, reason, message) -> None:
        with self.lock:
            pod = self._find(namespace, name)
            pod["status"] = {"phase": "Failed", "reason": reason, "message": message}
        self.events.put(("MODIFIED", pod))

    # test side
    def add(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pods[pod["metadata"]["uid"]] = pod
        self.events.put(("ADDED", pod))

    def delete(self, uid: str) -> None:
        with self.lock:
            pod = self.pods.pop(uid)
        self.events.put(("DELETED", pod))

    def record(self, uid: str, container: str = "main") -> dict[str, Any] | None:
        with self.lock:
            value = (
                self.pods[uid]["metadata"]
                .get("annotations", {})
                .get(f"gpulab.io/allocate-{container}")
            )
        return json.loads(value) if value else None

    def status(self, uid: str) -> dict[str, Any]:
        with self.lock:
            return dict(self.pods[uid]["status"])


def gpu_pod(uid: str, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": uid,
            "name": uid,
            "namespace": "default",
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "resources": {"limits": {GPU: str(gpus)}}}],
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
    proc = start_plugin(socket_dir, state_dir, tmp_path / "plugin.log", "a100-sxm4-40gb-x8")
    yield proc
    proc.terminate()
    proc.wait(timeout=10)


def start_agent(socket_dir: Path, api: MemoryNodeAPI) -> ManagerImpl:
    manager = ManagerImpl(NODE, socket_dir, api, Tracer("node-agent", None, stream=io.StringIO()))
    manager.Start()
    manager.run_pods()
    return manager


@pytest.fixture
def agent(socket_dir: Path) -> Iterator[tuple[ManagerImpl, MemoryNodeAPI]]:
    api = MemoryNodeAPI()
    manager = start_agent(socket_dir, api)
    yield manager, api
    manager.Stop()


def test_capacity_follows_list_and_watch_and_health(agent, plugin, state_dir: Path) -> None:
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "8", 15, "allocatable 8")
    assert api.capacity[GPU] == "8"
    cmd = [
        sys.executable,
        "-m",
        "gpulab",
        "fake-gpu",
        "inject",
        "--node",
        NODE,
        "--state-dir",
        str(state_dir),
    ]
    subprocess.run([*cmd, "--gpu", "5", "--xid", "79"], check=True, capture_output=True)
    wait_for(lambda: api.allocatable.get(GPU) == "7", 3, "allocatable 7 after an Xid")
    assert api.capacity[GPU] == "8"  # kubelet keeps unhealthy devices in capacity


def test_plugin_exit_makes_its_devices_unallocatable(agent, plugin) -> None:
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "8", 15, "allocatable 8")
    plugin.terminate()
    wait_for(lambda: api.allocatable.get(GPU) == "0", 10, "allocatable 0")
    assert api.capacity[GPU] == "8"


def test_agent_started_after_the_plugin_gets_it_registered(socket_dir: Path, plugin) -> None:
    wait_for(lambda: (socket_dir / "nvidia-gpu.sock").exists(), 15, "plugin socket")
    api = MemoryNodeAPI()
    manager = start_agent(socket_dir, api)  # wipes the plugin socket, like kubelet
    try:
        wait_for(lambda: api.allocatable.get(GPU) == "8", 15, "re-registration")
    finally:
        manager.Stop()


def test_pods_get_disjoint_numa_aligned_devices_and_overflow_is_rejected(agent, plugin) -> None:
    _, api = agent
    wait_for(lambda: api.allocatable.get(GPU) == "8", 15, "allocatable 8")
    api.add(gpu_pod("p1", 2))
    first = wait_for(lambda: api.record("p1"), 10, "p1 allocation")
    ids = first["devices"][GPU]
    assert len(ids) == 2 and len({NUMA[i] for i in ids}) == 1
    assert first["envs"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    assert {
        "containerPath": "/dev/nvidiactl",
        "hostPath": "/dev/nvidiactl",
        "permissions": "rw",
    } in first["deviceSpecs"]
    api.add(gpu_pod("p2", 4))
    second = wait_for(lambda: api.record("p2"), 10, "p2 allocation")["devices"][GPU]
    assert not set(second) & set(ids)
    assert len({NUMA[i] for i in second}) == 1  # the untouched NUMA node
    api.add(gpu_pod("p3", 4))
    status = wait_for(
        lambda: api.status("p3").get("phase") == "Failed" and api.status("p3"), 10, "p3 fail"
    )
    assert status["reason"] == "UnexpectedAdmissionError"
    assert "Requested: 4, Available: 2" in status["message"]
    assert api.record("p3") is None
    # p1 finishes: its 2 GPUs plus the 2 left make room for 4
    api.delete("p1")
    api.add(gpu_pod("p4", 4))
    fourth = wait_for(lambda: api.record("p4"), 10, "p4 allocation")["devices"][GPU]
    assert set(fourth) == set(NUMA) - set(second)


def test_restart_rebuilds_allocations_from_pod_annotations(socket_dir: Path, plugin) -> None:
    taken = [gpu_uuid(NODE, i) for i in range(6)]
    held = {"devices": {GPU: taken}, "envs": {}, "mounts": [], "deviceSpecs": []}
    api = MemoryNodeAPI([gpu_pod("old", 6, {"gpulab.io/allocate-main": json.dumps(held)})])
    api.pods["old"]["status"]["phase"] = "Running"
    manager = start_agent(socket_dir, api)
    try:
        wait_for(lambda: api.allocatable.get(GPU) == "8", 15, "allocatable 8")
        api.add(gpu_pod("new", 2))
        got = wait_for(lambda: api.record("new"), 10, "new allocation")["devices"][GPU]
        assert set(got) == {gpu_uuid(NODE, 6), gpu_uuid(NODE, 7)}
        assert api.record("old")["devices"][GPU] == taken  # not re-allocated
    finally:
        manager.Stop()


def test_registration_with_a_wrong_version_is_refused(agent, socket_dir: Path) -> None:
    with (
        grpc.insecure_channel(f"unix://{socket_dir / 'kubelet.sock'}") as channel,
        pytest.raises(grpc.RpcError) as err,
    ):
        api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(version="v1alpha", endpoint="x.sock", resource_name=GPU),
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "v1alpha" in err.value.details()


def test_mig_mixed_node_gets_one_extended_resource_per_profile(
    agent, socket_dir: Path, state_dir: Path, tmp_path: Path
) -> None:
    _, api = agent
    proc = start_plugin(
        socket_dir, state_dir, tmp_path / "mig.log", "a100-80gb-mig-x8", "--mig-strategy", "mixed"
    )
    try:
        expected = {
            "nvidia.com/mig-1g.10gb": "36",
            "nvidia.com/mig-2g.20gb": "4",
            "nvidia.com/mig-3g.40gb": "4",
        }
        wait_for(lambda: api.allocatable == expected, 15, "three MIG resources")
        assert api.capacity == expected
        api.add(
            {
                **gpu_pod("m1", 0),
                "spec": {
                    "nodeName": NODE,
                    "containers": [
                        {"name": "main", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}
                    ],
                },
            }
        )
        got = wait_for(lambda: api.record("m1"), 10, "MIG allocation")
        (mig,) = got["devices"]["nvidia.com/mig-3g.40gb"]
        assert mig.startswith("MIG-") and got["envs"]["NVIDIA_VISIBLE_DEVICES"] == mig
    finally:
        proc.terminate()
        proc.wait(timeout=10)
