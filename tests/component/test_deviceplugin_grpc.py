"""The device plugin as a real process, over real gRPC, with the test playing kubelet.

Each test starts ``gpulab device-plugin`` against the fake-gpu NVML shim on a temp socket
dir, serves kubelet's Registration service on ``kubelet.sock`` itself, and talks to the
plugin's socket like kubelet's device manager does. Faults go in through the real
``gpulab fake-gpu inject`` CLI. The shim is built first; a missing shim fails the tests.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.fakegpu.nvml import shim_env
from gpulab.fakegpu.paths import SHIM_DIR, SHIM_LIB
from gpulab.fakegpu.profiles import gpu_uuid, load, mig_uuid
from gpulab.wait import wait_for

NODE = "gpu-node-1"


@pytest.fixture(scope="module", autouse=True)
def shim() -> Path:
    subprocess.run(["make", "-s", "-C", str(SHIM_DIR)], check=True)
    assert SHIM_LIB.is_file(), "the NVML shim did not build"
    return SHIM_LIB


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """Kubelet's Registration service on <dir>/kubelet.sock, recording every request."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket = socket_dir / "kubelet.sock"
        self.requests: queue.Queue[api_pb2.RegisterRequest] = queue.Queue()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()

    def Register(self, request, context):
        self.requests.put(request)
        return api_pb2.Empty()

    def next_request(self, timeout: float = 15.0) -> api_pb2.RegisterRequest:
        return self.requests.get(timeout=timeout)

    def stop(self) -> None:
        self._server.stop(grace=0).wait()
        self.socket.unlink(missing_ok=True)


class Plugin:
    """A running ``gpulab device-plugin`` process and a client for its sockets."""

    def __init__(self, proc: subprocess.Popen[str], socket_dir: Path, log: Path) -> None:
        self.proc = proc
        self.socket_dir = socket_dir
        self.log = log

    def stub(self, socket: str = "nvidia-gpu.sock") -> api_pb2_grpc.DevicePluginStub:
        channel = grpc.insecure_channel(f"unix://{self.socket_dir / socket}")
        grpc.channel_ready_future(channel).result(timeout=15)
        return api_pb2_grpc.DevicePluginStub(channel)

    def watch(self, socket: str = "nvidia-gpu.sock") -> Watcher:
        return Watcher(self.stub(socket))


class Watcher:
    """Reads a ListAndWatch stream in the background."""

    def __init__(self, stub: api_pb2_grpc.DevicePluginStub) -> None:
        self.updates: queue.Queue[dict[str, str]] = queue.Queue()
        self.topology: dict[str, list[int]] = {}
        self._stream = stub.ListAndWatch(api_pb2.Empty())
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._stream:
                self.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in response.devices}
                self.updates.put({d.ID: d.health for d in response.devices})
        except grpc.RpcError:
            pass

    def next(self, timeout: float = 10.0) -> dict[str, str]:
        return self.updates.get(timeout=timeout)

    def none_within(self, seconds: float) -> bool:
        """True if no update arrives for ``seconds`` (a bounded wait on the update that
        must not come)."""
        try:
            self.updates.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self._stream.cancel()


@pytest.fixture
def run_plugin(
    state_dir: Path, socket_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., Plugin]]:
    procs: list[subprocess.Popen[str]] = []

    def start(
        profile: str = "a100-sxm4-40gb-x8", *args: str, env: dict | None = None, config: str = ""
    ) -> Plugin:
        full_env = {**os.environ, **shim_env(NODE, profile, state_dir)}
        full_env.pop("KUBERNETES_SERVICE_HOST", None)
        full_env.update(env or {})
        log = tmp_path / f"plugin-{len(procs)}.log"
        if config:
            path = tmp_path / f"config-{len(procs)}.yaml"
            path.write_text(config)
            args = ("--config-file", str(path), *args)
        cmd = [sys.executable, "-m", "gpulab", "device-plugin", "--node-name", NODE,
               "--socket-dir", str(socket_dir), *args]  # fmt: skip
        proc = subprocess.Popen(
            cmd, env=full_env, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True
        )
        procs.append(proc)
        return Plugin(proc, socket_dir, log)

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(socket_dir)
    yield k
    k.stop()


def fake_gpu(state_dir: Path, *args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "gpulab",
        "fake-gpu",
        *args,
        "--node",
        NODE,
        "--state-dir",
        str(state_dir),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def uuids(n: int) -> list[str]:
    return [gpu_uuid(NODE, i) for i in range(n)]


# ---------------------------------------------------------------- registration


def test_register_sends_the_fields_kubelet_checks(kubelet: FakeKubelet, run_plugin) -> None:
    run_plugin()
    req = kubelet.next_request()
    assert req.version == "v1beta1"
    assert req.endpoint == "nvidia-gpu.sock"
    assert req.resource_name == "nvidia.com/gpu"
    assert req.options.get_preferred_allocation_available is True
    assert req.options.pre_start_required is False


def test_registration_starts_when_kubelet_appears(socket_dir: Path, run_plugin) -> None:
    plugin = run_plugin()
    # No kubelet.sock: the plugin keeps running (upstream: retry in 30 s) ...
    wait_for(lambda: "Failed to start plugin" in plugin.log.read_text(), 15, "a failed start")
    assert plugin.proc.poll() is None
    assert "kubelet socket" in plugin.log.read_text()
    # ... and restarts as soon as kubelet.sock is created (main.go's fsnotify watch)
    late = FakeKubelet(socket_dir)
    try:
        assert late.next_request(timeout=10).resource_name == "nvidia.com/gpu"
    finally:
        late.stop()


def test_reregisters_when_kubelet_socket_is_recreated(
    socket_dir: Path, kubelet: FakeKubelet, run_plugin
) -> None:
    plugin = run_plugin()
    kubelet.next_request()
    kubelet.stop()  # kubelet restarts: its socket goes away ...
    wait_for(lambda: not kubelet.socket.exists(), 5, "kubelet.sock gone")
    again = FakeKubelet(socket_dir)  # ... and comes back
    try:
        req = again.next_request(timeout=10)
        assert req.endpoint == "nvidia-gpu.sock"
        # the plugin serves again on a fresh socket
        watcher = plugin.watch()
        assert set(watcher.next()) == set(uuids(8))
        watcher.close()
    finally:
        again.stop()


# ---------------------------------------------------------------- ListAndWatch and health


def watching(log: Path) -> None:
    """Wait until the plugin's health check watches NVML events: an Xid from before is
    never delivered (NVML does not replay past events), as on a real node."""
    wait_for(lambda: "for Xid critical errors" in log.read_text(), 30, "the health check")


def test_list_and_watch_sends_every_gpu_with_its_numa_node(
    kubelet: FakeKubelet, run_plugin
) -> None:
    plugin = run_plugin()
    kubelet.next_request()
    watcher = plugin.watch()
    first = watcher.next()
    assert first == dict.fromkeys(uuids(8), "Healthy")
    numa = load("a100-sxm4-40gb-x8").gpus
    assert watcher.topology == {gpu_uuid(NODE, g.index): [g.numa_node] for g in numa}
    options = plugin.stub().GetDevicePluginOptions(api_pb2.Empty())
    assert options.get_preferred_allocation_available and not options.pre_start_required
    watcher.close()


def test_an_xid_makes_the_gpu_unhealthy_for_as_long_as_the_plugin_runs(
    kubelet: FakeKubelet, run_plugin, state_dir: Path, socket_dir: Path
) -> None:
    plugin = run_plugin()
    kubelet.next_request()
    watcher = plugin.watch()
    watcher.next()
    watching(plugin.log)
    fake_gpu(state_dir, "inject", "--gpu", "3", "--xid", "79")
    update = watcher.next(timeout=10)
    assert [u for u, h in update.items() if h == "Unhealthy"] == [gpu_uuid(NODE, 3)]
    # Allocate does not second-guess kubelet: an unhealthy device is still allocatable
    response = plugin.stub().Allocate(
        api_pb2.AllocateRequest(container_requests=[{"devices_ids": [gpu_uuid(NODE, 3)]}])
    )
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(NODE, 3)
    # clear changes the fake driver only: no update comes (bounded wait) ...
    fake_gpu(state_dir, "clear", "--gpu", "3")
    assert watcher.none_within(3.0)
    # ... while the watch is alive: a new fault is reported (the positive control)
    fake_gpu(state_dir, "inject", "--gpu", "5", "--xid", "79")
    later = watcher.next(timeout=5)
    assert later[gpu_uuid(NODE, 3)] == "Unhealthy" and later[gpu_uuid(NODE, 5)] == "Unhealthy"
    watcher.close()
    # a restarted plugin gets a fresh NVML event set: NVML does not replay the Xids
    plugin.proc.terminate()
    plugin.proc.wait(timeout=10)
    restarted = run_plugin()
    kubelet.next_request()
    fresh = restarted.watch()
    assert fresh.next() == dict.fromkeys(uuids(8), "Healthy")  # every first list is
    watching(restarted.log)
    assert fresh.none_within(3.0)  # GPU 5's fault, still active in the driver: not replayed
    fake_gpu(state_dir, "inject", "--gpu", "6", "--xid", "79")  # positive control
    after = fresh.next(timeout=10)
    assert [u for u, h in after.items() if h == "Unhealthy"] == [gpu_uuid(NODE, 6)]
    fresh.close()


def test_application_xids_and_the_ecc_event_itself_are_not_failures(
    kubelet: FakeKubelet, run_plugin, state_dir: Path
) -> None:
    """health.go skips Xids 13, 31, 43, 45, 68, 109 and every non-Xid event; a double-bit
    ECC error counts through the Xid 48 the driver raises with it."""
    plugin = run_plugin()
    kubelet.next_request()
    watcher = plugin.watch()
    watcher.next()
    watching(plugin.log)
    fake_gpu(state_dir, "inject", "--gpu", "1", "--xid", "13")
    assert watcher.none_within(2.0)
    fake_gpu(state_dir, "inject", "--gpu", "2", "--ecc-dbe")  # DBE event + Xid 48
    update = watcher.next(timeout=5)
    assert update[gpu_uuid(NODE, 1)] == "Healthy"
    assert update[gpu_uuid(NODE, 2)] == "Unhealthy"
    assert "Skipping non-nvmlEventTypeXidCriticalError event: 0x2" in plugin.log.read_text()
    watcher.close()


@pytest.mark.parametrize(
    ("env", "xid", "fails"),
    [
        ({"DP_DISABLE_HEALTHCHECKS": "all"}, 79, False),
        ({"DP_ENABLE_HEALTHCHECKS": "all"}, 13, True),
    ],
)
def test_healthcheck_environment(kubelet, run_plugin, state_dir: Path, env, xid, fails) -> None:
    plugin = run_plugin(env=env)
    kubelet.next_request()
    watcher = plugin.watch()
    watcher.next()
    if fails:  # an Xid before the health check watches is never delivered (no replay)
        watching(plugin.log)
    fake_gpu(state_dir, "inject", "--gpu", "4", "--xid", str(xid))
    if fails:
        assert watcher.next(timeout=5)[gpu_uuid(NODE, 4)] == "Unhealthy"
    else:
        assert watcher.none_within(3.0)
        assert "health checks disabled" in plugin.log.read_text()
    watcher.close()


def test_a_fault_from_before_the_start_is_not_seen(
    kubelet: FakeKubelet, run_plugin, state_dir: Path
) -> None:
    shim_env(NODE, "a100-sxm4-40gb-x8", state_dir)  # the node dir must exist to inject
    fake_gpu(state_dir, "inject", "--gpu", "0", "--off-bus")
    plugin = run_plugin()
    kubelet.next_request()
    watcher = plugin.watch()
    assert watcher.next() == dict.fromkeys(uuids(8), "Healthy")
    watching(plugin.log)
    assert watcher.none_within(3.0)  # the earlier fault never arrives ...
    fake_gpu(state_dir, "inject", "--gpu", "1", "--xid", "79")  # ... a later one does
    later = watcher.next(timeout=10)
    assert [u for u, h in later.items() if h == "Unhealthy"] == [gpu_uuid(NODE, 1)]
    watcher.close()


# ---------------------------------------------------------------- allocation


def test_allocate_returns_uuids_and_device_nodes(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin()
    kubelet.next_request()
    ids = [gpu_uuid(NODE, 0), gpu_uuid(NODE, 5)]
    response = plugin.stub().Allocate(
        api_pb2.AllocateRequest(container_requests=[{"devices_ids": ids}, {"devices_ids": ids[:1]}])
    )
    first, second = response.container_responses
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids)
    assert list(first.devices) == []  # --pass-device-specs is off by default
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0]
    # the fake driver, as the container toolkit would inject it: the shim's config and its
    # directory, read-only (DriverFiles)
    for container in (first, second):
        assert container.envs["FAKE_GPU_CONFIG"].endswith(f"{NODE}/config")
        (mount,) = container.mounts
        assert mount.read_only and mount.host_path == mount.container_path
        assert mount.host_path == str(Path(container.envs["FAKE_GPU_CONFIG"]).parent)


def test_pass_device_specs_adds_the_device_nodes(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin("a100-sxm4-40gb-x8", "--pass-device-specs")
    kubelet.next_request()
    ids = [gpu_uuid(NODE, 0), gpu_uuid(NODE, 5)]
    response = plugin.stub().Allocate(
        api_pb2.AllocateRequest(container_requests=[{"devices_ids": ids}])
    )
    specs = response.container_responses[0].devices
    # the driver's own nodes (/dev/nvidiactl ...) only where they exist on this host
    gpus = [d.host_path for d in specs if not Path(d.host_path).exists()]
    assert gpus == ["/dev/nvidia0", "/dev/nvidia5"]
    assert all(d.permissions == "rw" and d.container_path == d.host_path for d in specs)


def test_allocate_rejects_unknown_ids_naming_them(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin()
    kubelet.next_request()
    with pytest.raises(grpc.RpcError) as err:
        plugin.stub().Allocate(
            api_pb2.AllocateRequest(
                container_requests=[{"devices_ids": [gpu_uuid(NODE, 0), "GPU-not-here"]}]
            )
        )
    # upstream returns a plain Go error: gRPC status Unknown
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert err.value.details() == (
        'invalid allocation request for "nvidia.com/gpu": invalid request: unknown device: '
        "GPU-not-here"
    )


def test_preferred_allocation_keeps_to_one_numa_node(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin()
    kubelet.next_request()
    all_ids = uuids(8)
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            # GPU 0 is taken: 4 GPUs on one NUMA node are only left on node 1 (GPUs 4-7).
            {"available_deviceIDs": all_ids[1:], "allocation_size": 4},
            {
                "available_deviceIDs": all_ids,
                "must_include_deviceIDs": [all_ids[6]],
                "allocation_size": 2,
            },
        ]
    )
    first, second = plugin.stub().GetPreferredAllocation(request).container_responses
    assert sorted(first.deviceIDs) == sorted(all_ids[4:8])
    assert all_ids[6] in second.deviceIDs and len(second.deviceIDs) == 2
    assert set(second.deviceIDs) <= set(all_ids[4:8])  # same NUMA node as the must-include GPU


def test_preferred_allocation_follows_nvlink_over_numa(kubelet: FakeKubelet, run_plugin) -> None:
    # mixed: A100 GPUs 0-1 on an NVLink bridge, T4s 2-3 on the other NUMA node
    plugin = run_plugin("mixed")
    kubelet.next_request()
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[{"available_deviceIDs": uuids(4), "allocation_size": 2}]
    )
    (got,) = plugin.stub().GetPreferredAllocation(request).container_responses
    assert sorted(got.deviceIDs) == sorted(uuids(2))


# ---------------------------------------------------------------- MIG and time-slicing


MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"


def test_mig_mixed_serves_one_resource_per_profile(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin("a100-80gb-mig-x8", config=MIXED)
    got = {}
    for _ in range(3):
        req = kubelet.next_request()
        got[req.resource_name] = req.endpoint
    assert got == {
        "nvidia.com/mig-1g.10gb": "nvidia-mig-1g.10gb.sock",
        "nvidia.com/mig-2g.20gb": "nvidia-mig-2g.20gb.sock",
        "nvidia.com/mig-3g.40gb": "nvidia-mig-3g.40gb.sock",
    }
    counts = {}
    for resource, socket in got.items():
        watcher = plugin.watch(socket)
        devices = watcher.next()
        watcher.close()
        assert all(d.startswith("MIG-") for d in devices)
        counts[resource] = len(devices)
    # GPUs 0-3: 3g.40gb + 2g.20gb + 2x 1g.10gb; GPUs 4-7: 7x 1g.10gb
    assert counts == {
        "nvidia.com/mig-1g.10gb": 4 * 2 + 4 * 7,
        "nvidia.com/mig-2g.20gb": 4,
        "nvidia.com/mig-3g.40gb": 4,
    }
    assert not (plugin.socket_dir / "nvidia-gpu.sock").exists()  # every GPU is MIG-enabled


def test_mig_allocation_carries_the_nvidia_caps_devices(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin("a100-80gb-mig-x8", "--pass-device-specs", config=MIXED)
    for _ in range(3):
        kubelet.next_request()
    mig = mig_uuid(NODE, 0, 0)  # GPU 0, GPU instance 1, compute instance 0
    response = plugin.stub("nvidia-mig-3g.40gb.sock").Allocate(
        api_pb2.AllocateRequest(container_requests=[{"devices_ids": [mig]}])
    )
    paths = [d.host_path for d in response.container_responses[0].devices]
    assert paths[-3:] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    ]


TIME_SLICED = """
version: v1
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def test_time_slicing_from_the_config_file(kubelet: FakeKubelet, run_plugin) -> None:
    plugin = run_plugin("a100-sxm4-40gb-x8", config=TIME_SLICED)
    kubelet.next_request()
    watcher = plugin.watch()
    devices = watcher.next()
    watcher.close()
    assert set(devices) == {f"{u}::{n}" for u in uuids(8) for n in range(4)}
    one = [f"{gpu_uuid(NODE, 2)}::3"]
    response = plugin.stub().Allocate(
        api_pb2.AllocateRequest(container_requests=[{"devices_ids": one}])
    )
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(NODE, 2)
    # failRequestsGreaterThanOne: one replica per container
    with pytest.raises(grpc.RpcError) as err:
        plugin.stub().Allocate(
            api_pb2.AllocateRequest(
                container_requests=[{"devices_ids": [*one, f"{gpu_uuid(NODE, 7)}::1"]}]
            )
        )
    assert "maximum request size for shared resources is 1; found 2" in err.value.details()
    # the distributed policy spreads replicas over GPUs
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[{"available_deviceIDs": list(devices), "allocation_size": 3}]
    )
    (got,) = plugin.stub().GetPreferredAllocation(request).container_responses
    assert len({i.split("::")[0] for i in got.deviceIDs}) == 3


def test_an_xid_on_a_time_sliced_gpu_takes_one_replica_out_as_v0_20_0(
    kubelet: FakeKubelet, run_plugin, state_dir: Path
) -> None:
    """health.go's parentToDeviceMap keeps one device per GPU: 1 of the GPU's 4 replicas
    goes Unhealthy (allocatable drops by one), the other 3 stay Healthy."""
    plugin = run_plugin("a100-sxm4-40gb-x8", config=TIME_SLICED)
    kubelet.next_request()
    watcher = plugin.watch()
    watcher.next()
    watching(plugin.log)
    fake_gpu(state_dir, "inject", "--gpu", "2", "--xid", "79")
    update = watcher.next(timeout=10)
    assert [i for i, h in update.items() if h == "Unhealthy"] == [f"{gpu_uuid(NODE, 2)}::3"]
    assert sum(1 for h in update.values() if h == "Healthy") == 8 * 4 - 1
    watcher.close()


def test_a_mig_strategy_flag_overrides_the_config_file(kubelet: FakeKubelet, run_plugin) -> None:
    run_plugin("a100-80gb-mig-x8", "--mig-strategy", "none", config=MIXED)
    assert kubelet.next_request().resource_name == "nvidia.com/gpu"


# ---------------------------------------------------------------- bad input


def _fails(plugin: Plugin) -> str:
    assert plugin.proc.wait(timeout=30) == 2
    return plugin.log.read_text()


def test_unknown_mig_strategy_is_a_one_line_error(run_plugin) -> None:
    out = _fails(run_plugin("a100-sxm4-40gb-x8", "--mig-strategy", "weird"))
    assert (
        out.strip()
        == "gpulab: error: unknown MIG strategy 'weird'; use one of: none, single, mixed"
    )


def test_single_strategy_rejects_mixed_mig_layouts(run_plugin) -> None:
    out = _fails(run_plugin("a100-80gb-mig-x8", "--mig-strategy", "single"))
    assert "more than one MIG device type present on node" in out
    assert "1g.10gb, 2g.20gb, 3g.40gb" in out


def test_nvml_init_failure_is_a_clear_error(run_plugin, tmp_path: Path) -> None:
    # The shim is loaded but its node config does not exist: NVML init fails.
    out = _fails(run_plugin(env={"FAKE_GPU_CONFIG": str(tmp_path / "missing")}))
    assert "gpulab: error: NVML init failed" in out
