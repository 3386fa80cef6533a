"""The device-plugin gRPC server for one resource, and its registration with kubelet.

Mirrors NVIDIA k8s-device-plugin v0.20.0 ``internal/plugin/server.go``
(``nvidiaDevicePlugin``: ``Start`` = ``Serve`` → ``Register`` → the ``CheckHealth``
goroutine; ``Stop``; ``GetDevicePluginOptions``, ``ListAndWatch``,
``GetPreferredAllocation``, ``Allocate``, ``PreStartContainer``). Errors reach kubelet as
upstream's plain Go errors do: gRPC status ``UNKNOWN`` with upstream's message.

Deliberate differences: upstream's health channel carries one device per ListAndWatch
response; here one Xid sends one response with every device it hit. Each container's
response also carries the fake driver (:class:`DriverFiles`), which on a real node the
NVIDIA Container Toolkit injects. The lab's trace
(``Serve``, ``Register``, ``ListAndWatch`` ... as Events) is the lab's narration.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from gpulab.deviceplugin.allocate import (
    VISIBLE_DEVICES_ENV,
    AllocationError,
    ContainerAllocation,
    container_allocation,
    preferred_allocation,
    validate_request,
)
from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.deviceplugin.config import Config
from gpulab.deviceplugin.health import CheckHealth, XidFilter
from gpulab.deviceplugin.rm import (
    HEALTHY,
    UNHEALTHY,
    Device,
    GPUInfo,
    ResourceError,
    ResourceSpec,
)
from gpulab.fakegpu.nvml import ENV_CONFIG
from gpulab.grpcserver import new_server
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
_DIAL_TIMEOUT = 5.0  # upstream dial(..., 5*time.Second)
MAX_SOCKET_PATH = 105  # what gRPC accepts of sockaddr_un.sun_path (108 bytes)


class Allocator(Protocol):
    """Turns one container's device IDs into what the container gets (HAMi plugs in here)."""

    # whether the allocator writes its own Allocate step (HAMi's, on the pod it found
    # through the node lock): then the server's Node-level line would say it twice
    traces_allocate: bool

    def prefer(
        self,
        index: int,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str] | None:
        """The preferred IDs for container request ``index``; None: no answer for it."""
        ...

    def allocate(
        self, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]: ...


class DefaultAllocator:
    """Upstream's GetPreferredAllocation (topology, or the replica policy) and Allocate
    (the requested devices, visible by UUID)."""

    traces_allocate = False

    def __init__(
        self, config: Config, gpus: Sequence[GPUInfo], present: Callable[[str], bool]
    ) -> None:
        self._config = config
        self._gpus = {g.index: g for g in gpus}
        self._present = present

    def prefer(
        self,
        index: int,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str]:
        return preferred_allocation(
            available, must_include, size, devices, self._gpus, self._config.allocation_policy
        )

    def allocate(
        self, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]:
        return [
            container_allocation(ids, devices, self._config.pass_device_specs, self._present)
            for ids in requests
        ]


@dataclass(frozen=True)
class DriverFiles:
    """The fake driver's files a GPU container needs (a lab addition to the response).

    On a real node the NVIDIA Container Toolkit sees ``NVIDIA_VISIBLE_DEVICES`` and mounts
    the driver's libraries and device nodes into the container; upstream's response carries
    only the variable. Here the "driver" is the node's NVML shim state (``FAKE_GPU_CONFIG``
    and its directory: profile, MIG state, fault log), so each container's response adds
    that variable and the directory, read-only; the shim in the container then enumerates
    only the GPUs ``NVIDIA_VISIBLE_DEVICES`` names, as NVML would."""

    config: str  # the path FAKE_GPU_CONFIG names, the same on the node and in the plugin

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DriverFiles | None:
        config = env.get(ENV_CONFIG)
        return cls(config) if config else None

    def add_to(self, container: api_pb2.ContainerAllocateResponse) -> None:
        container.envs[ENV_CONFIG] = self.config
        directory = str(Path(self.config).parent)
        container.mounts.add(container_path=directory, host_path=directory, read_only=True)


class NvidiaDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource on ``<socket_dir>/<resource socket>`` and registers it with kubelet."""

    def __init__(
        self,
        resource: ResourceSpec,
        gpus: Sequence[GPUInfo],
        config: Config,
        socket_dir: Path,
        tracer: Tracer,
        node_name: str,
        xids: XidFilter,
        allocator: Allocator,
        on_unhealthy: Callable[[], None] = lambda: None,
        driver: DriverFiles | None = None,
        health_by_gpu: bool = False,
    ) -> None:
        self.resource = resource
        self._driver = driver
        self._health_by_gpu = health_by_gpu
        self.socket_dir = socket_dir
        self.socket = socket_dir / resource.socket_name
        self._devices = {d.id: d for d in resource.devices}
        self._gpus = {g.index: g for g in gpus}
        self._config = config
        self._tracer = tracer
        self._node = ObjectRef(kind="Node", name=node_name)
        self._xids = xids
        self._allocator = allocator
        self._on_unhealthy = on_unhealthy
        self._cond = threading.Condition()
        self._health = dict.fromkeys(self._devices, HEALTHY)
        self._version = 0
        self._server: grpc.Server | None = None
        self._health_check: CheckHealth | None = None
        self._stopping = threading.Event()

    # ---------------------------------------------------------------- lifecycle

    def Start(self) -> None:
        """Serve, Register, then watch health; raises OSError/grpc.RpcError if kubelet
        does not take the registration (the caller stops and retries every plugin)."""
        self.Serve()
        try:
            self.Register()
        except (OSError, grpc.RpcError):
            self.Stop()
            raise
        self._health_check = CheckHealth(
            self.resource.devices,
            list(self._gpus.values()),
            self.mark_unhealthy,
            self._xids,
            name=f"CheckHealth-{self.resource.name}",
            on_watching=self._watching,
        )
        self._health_check.start()

    def _watching(self, gpus: int) -> None:
        self._tracer.step(
            "CheckHealth",
            self._node,
            f"{self.resource.name}: watching {gpus} GPU(s) for Xid critical errors",
            resource=self.resource.name,
        )

    def Serve(self) -> None:
        if len(str(self.socket).encode()) > MAX_SOCKET_PATH:
            raise ResourceError(
                f"socket path {self.socket} is {len(str(self.socket).encode())} bytes; a unix "
                f"socket path has at most {MAX_SOCKET_PATH}: use a shorter --socket-dir"
            )
        self._stopping.clear()
        self.socket.unlink(missing_ok=True)  # a stale socket from a previous run
        server = new_server(max_workers=16)
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self._tracer.step(
            "Serve",
            self._node,
            f"serving {self.resource.name} on {self.socket.name}",
            resource=self.resource.name,
            socket=str(self.socket),
            devices=len(self._devices),
        )

    def Register(self) -> None:
        """One Register call to kubelet; raises grpc.RpcError or OSError if it fails."""
        kubelet = self.socket_dir / KUBELET_SOCKET
        if not kubelet.exists():
            raise FileNotFoundError(f"kubelet socket {kubelet} does not exist")
        with grpc.insecure_channel(f"unix://{kubelet}") as channel:
            grpc.channel_ready_future(channel).result(timeout=_DIAL_TIMEOUT)
            # recorded as the call is made: kubelet calls GetDevicePluginOptions and starts
            # ListAndWatch before Register returns (a failure raises to the caller's log)
            self._tracer.step(
                "Register",
                self._node,
                f"registering {self.resource.name} with kubelet",
                resource=self.resource.name,
                endpoint=self.socket.name,
            )
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource.name,
                    options=self._options(),
                )
            )

    def Stop(self) -> None:
        self._stopping.set()
        if self._health_check is not None:
            self._health_check.stop()
            self._health_check = None
        with self._cond:
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    # ---------------------------------------------------------------- health

    def mark_unhealthy(self, devices: Sequence[Device], reason: str) -> None:
        """The health check's channel: these devices are Unhealthy for good (with
        ``health_by_gpu``, HAMi's plugin, every ID of their GPUs: it marks the GPU and
        advertises the GPU's health on each of its IDs)."""
        if self._health_by_gpu:
            gpus = {d.gpu_index for d in devices}
            devices = [d for d in self.resource.devices if d.gpu_index in gpus]
        with self._cond:
            changed = [d.id for d in devices if self._health.get(d.id) == HEALTHY]
            for device_id in changed:
                self._health[device_id] = UNHEALTHY
            if changed:
                self._version += 1
                self._cond.notify_all()
        if not changed:
            return
        self._tracer.step(
            "CheckHealth",
            self._node,
            f"{self.resource.name}: {', '.join(changed)} Unhealthy: {reason}",
            warning=True,
            resource=self.resource.name,
            devices=changed,
            reason=reason,
        )
        self._on_unhealthy()

    def healthy(self, uuid: str) -> bool:
        """Is every device of this resource on ``uuid`` (a GPU or MIG UUID) healthy?"""
        with self._cond:
            return all(
                self._health[d.id] == HEALTHY for d in self._devices.values() if d.uuid == uuid
            )

    # ---------------------------------------------------------------- DevicePlugin service

    def _options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def GetDevicePluginOptions(self, request, context):
        options = self._options()
        self._tracer.step(
            "GetDevicePluginOptions",
            self._node,
            f"{self.resource.name}: GetPreferredAllocationAvailable="
            f"{str(options.get_preferred_allocation_available).lower()}, "
            f"PreStartRequired={str(options.pre_start_required).lower()}",
            resource=self.resource.name,
        )
        return options

    def _device_list(self, health: Mapping[str, str]) -> list[api_pb2.Device]:
        out = []
        for d in self.resource.devices:
            dev = api_pb2.Device(ID=d.id, health=health[d.id])
            if d.numa_node is not None:
                dev.topology.nodes.append(api_pb2.NUMANode(ID=d.numa_node))
            out.append(dev)
        return out

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:
        """The full list now, then again each time devices go Unhealthy."""
        seen = -1
        # a cancelled stream wakes the loop at once: otherwise it holds a worker thread
        # until the next wait times out, and a kubelet that reconnects often starves the
        # pool Allocate is answered from
        context.add_callback(self._wake)
        while not self._stopping.is_set() and context.is_active():
            with self._cond:
                if self._version == seen:
                    self._cond.wait(timeout=0.5)
                if self._version == seen:
                    continue
                seen, health = self._version, dict(self._health)
            devices = self._device_list(health)
            healthy = sum(1 for d in devices if d.health == HEALTHY)
            self._tracer.step(
                "ListAndWatch",
                self._node,
                f"{self.resource.name}: {healthy}/{len(devices)} devices healthy",
                resource=self.resource.name,
                healthy=healthy,
                total=len(devices),
                unhealthy=[d.ID for d in devices if d.health != HEALTHY],
            )
            yield api_pb2.ListAndWatchResponse(devices=devices)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def GetPreferredAllocation(self, request, context):
        response = api_pb2.PreferredAllocationResponse()
        for index, req in enumerate(request.container_requests):
            available = list(req.available_deviceIDs)
            must = list(req.must_include_deviceIDs)
            try:
                ids = self._allocator.prefer(
                    index, available, must, req.allocation_size, self._devices
                )
            except AllocationError as exc:
                context.abort(
                    grpc.StatusCode.UNKNOWN,
                    f"error getting list of preferred allocation devices: {exc}",
                )
            if ids is None:
                preferred = "no answer"
            else:
                response.container_responses.add(deviceIDs=ids)
                preferred = ", ".join(ids) or "nothing"
            self._tracer.step(
                "GetPreferredAllocation",
                self._node,
                f"{self.resource.name}: prefer {preferred}",
                resource=self.resource.name,
                available=len(available),
                must_include=must,
                size=req.allocation_size,
                preferred=ids,
            )
        return response

    def Allocate(self, request, context):
        requests = [list(r.devices_ids) for r in request.container_requests]
        try:
            for ids in requests:
                validate_request(ids, self._devices, self._config)
        except AllocationError as exc:
            self._reject(requests, str(exc))
            context.abort(
                grpc.StatusCode.UNKNOWN,
                f'invalid allocation request for "{self.resource.name}": {exc}',
            )
        try:
            allocations = self._allocator.allocate(requests, self._devices)
        except AllocationError as exc:
            self._reject(requests, str(exc))
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to get allocate response: {exc}")
        response = api_pb2.AllocateResponse()
        for ids, alloc in zip(requests, allocations, strict=True):
            container = response.container_responses.add()
            container.envs.update(alloc.envs)
            if self._driver is not None:
                self._driver.add_to(container)
            for spec in alloc.devices:
                container.devices.add(
                    container_path=spec.container_path,
                    host_path=spec.host_path,
                    permissions=spec.permissions,
                )
            if self._allocator.traces_allocate:
                continue
            visible = alloc.envs.get(VISIBLE_DEVICES_ENV, "")
            # the response's three parts, as the container runtime gets them: without
            # passDeviceSpecs (upstream's default) Devices is empty and the NVIDIA Container
            # Toolkit adds /dev/nvidia* from the variable; the lab's one mount is its driver
            devices = ", ".join(s.container_path for s in alloc.devices) or "none"
            mounts = "none"
            if container.mounts:
                mounts = f"{len(container.mounts)} (lab: the fake driver)"
            self._tracer.step(
                "Allocate",
                self._node,
                f"{self.resource.name}: {len(ids)} ID(s) known (ValidateRequest) → "
                f"{VISIBLE_DEVICES_ENV}={visible}; Devices: {devices}; Mounts: {mounts}",
                resource=self.resource.name,
                envs=alloc.envs,
                device_specs=[s.host_path for s in alloc.devices],
            )
        return response

    def _reject(self, requests: list[list[str]], why: str) -> None:
        self._tracer.step(
            "Allocate",
            self._node,
            f"{self.resource.name}: rejected: {why}",
            warning=True,
            resource=self.resource.name,
            requested=requests,
        )

    def PreStartContainer(self, request, context):
        self._tracer.step(
            "PreStartContainer",
            self._node,
            f"{self.resource.name}: {len(request.devices_ids)} device(s)",
            resource=self.resource.name,
            devices=list(request.devices_ids),
        )
        return api_pb2.PreStartContainerResponse()
