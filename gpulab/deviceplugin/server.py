"""The device-plugin gRPC server for one resource, and its registration with kubelet.

Mirrors NVIDIA k8s-device-plugin ``internal/plugin/server.go`` (``NvidiaDevicePlugin``:
``Start`` → ``Serve`` → ``Register``; ``GetDevicePluginOptions``, ``ListAndWatch``,
``GetPreferredAllocation``, ``Allocate``, ``PreStartContainer``). Health lives in a
:class:`HealthBoard` shared by every resource of the node, fed by ``CheckHealth``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Protocol

import grpc

from gpulab.deviceplugin.allocate import (
    VISIBLE_DEVICES_ENV,
    AllocationError,
    ContainerAllocation,
    check_request,
    container_allocation,
    preferred_allocation,
)
from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.deviceplugin.rm import HEALTHY, UNHEALTHY, Device, ResourceSpec
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
_REGISTER_TIMEOUT = 5.0


class HealthBoard:
    """Health of every device UUID on the node, with a version that bumps on each change."""

    def __init__(self, uuids: Sequence[str]) -> None:
        self._healthy = dict.fromkeys(uuids, True)
        self._version = 0
        self._cond = threading.Condition()

    def set(self, uuids: Sequence[str], healthy: bool) -> list[str]:
        """Record a health change; returns the UUIDs whose health actually changed."""
        with self._cond:
            changed = [u for u in uuids if u in self._healthy and self._healthy[u] != healthy]
            for u in changed:
                self._healthy[u] = healthy
            if changed:
                self._version += 1
                self._cond.notify_all()
            return changed

    def healthy(self, uuid: str) -> bool:
        with self._cond:
            return self._healthy.get(uuid, False)

    def wait(self, seen: int, timeout: float) -> tuple[int, dict[str, bool]]:
        """Block until the version differs from ``seen`` (or timeout); (version, snapshot)."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen, timeout)
            return self._version, dict(self._healthy)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


class Allocator(Protocol):
    """Turns one container's device IDs into what the container gets (HAMi plugs in here)."""

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str] | None:
        """A preferred allocation of its own, or None to prefer by topology."""
        ...

    def allocate(
        self, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]: ...


class DefaultAllocator:
    """Upstream's Allocate: the requested devices, visible by UUID."""

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str] | None:
        return None

    def allocate(
        self, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]:
        return [container_allocation(ids, devices) for ids in requests]


class NvidiaDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource on ``<socket_dir>/<resource socket>`` and registers it with kubelet."""

    def __init__(
        self,
        resource: ResourceSpec,
        socket_dir: Path,
        board: HealthBoard,
        tracer: Tracer,
        node_name: str,
        nvlink_peers: Mapping[int, Sequence[int]],
        allocator: Allocator | None = None,
    ) -> None:
        self.resource = resource
        self.socket_dir = socket_dir
        self.socket = socket_dir / resource.socket_name
        self._devices = {d.id: d for d in resource.devices}
        self._board = board
        self._tracer = tracer
        self._node = ObjectRef(kind="Node", name=node_name)
        self._peers = nvlink_peers
        self._allocator = allocator or DefaultAllocator()
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()

    # ---------------------------------------------------------------- lifecycle

    def Start(self) -> None:
        """Serve; registration is retried by the caller until kubelet answers."""
        self.Serve()

    def Serve(self) -> None:
        self._stopping.clear()
        self.socket.unlink(missing_ok=True)  # a stale socket from a previous run
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
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
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource.name,
                    options=self._options(),
                ),
                timeout=_REGISTER_TIMEOUT,
            )
        self._tracer.step(
            "Register",
            self._node,
            f"registered {self.resource.name} with kubelet",
            resource=self.resource.name,
            endpoint=self.socket.name,
        )

    def Stop(self) -> None:
        self._stopping.set()
        self._board.wake()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    @property
    def serving(self) -> bool:
        return self._server is not None and self.socket.exists()

    # ---------------------------------------------------------------- DevicePlugin service

    def _options(self) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def GetDevicePluginOptions(self, request, context):
        return self._options()

    def _device_list(self, health: Mapping[str, bool]) -> list[api_pb2.Device]:
        out = []
        for d in self.resource.devices:
            dev = api_pb2.Device(ID=d.id, health=HEALTHY if health.get(d.uuid) else UNHEALTHY)
            if d.numa_node is not None:
                dev.topology.nodes.append(api_pb2.NUMANode(ID=d.numa_node))
            out.append(dev)
        return out

    def ListAndWatch(self, request, context) -> Iterator[api_pb2.ListAndWatchResponse]:
        seen = -1
        while not self._stopping.is_set() and context.is_active():
            version, health = self._board.wait(seen, timeout=0.5)
            if version == seen:
                continue
            seen = version
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

    def GetPreferredAllocation(self, request, context):
        response = api_pb2.PreferredAllocationResponse()
        for req in request.container_requests:
            available = list(req.available_deviceIDs)
            must = list(req.must_include_deviceIDs)
            try:
                ids = self._allocator.prefer(
                    available, must, req.allocation_size, self._devices
                ) or preferred_allocation(
                    available, must, req.allocation_size, self._devices, self._peers
                )
            except AllocationError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            response.container_responses.add(deviceIDs=ids)
            self._tracer.step(
                "GetPreferredAllocation",
                self._node,
                f"{self.resource.name}: prefer {', '.join(ids)}",
                resource=self.resource.name,
                available=len(req.available_deviceIDs),
                must_include=list(req.must_include_deviceIDs),
                size=req.allocation_size,
                preferred=ids,
            )
        return response

    def Allocate(self, request, context):
        requests = [list(r.devices_ids) for r in request.container_requests]
        try:
            for ids in requests:
                check_request(
                    ids,
                    self._devices,
                    {
                        i: self._board.healthy(self._devices[i].uuid)
                        for i in ids
                        if i in self._devices
                    },
                )
            allocations = self._allocator.allocate(requests, self._devices)
        except AllocationError as exc:
            self._tracer.step(
                "Allocate",
                self._node,
                f"{self.resource.name}: rejected: {exc}",
                warning=True,
                resource=self.resource.name,
                requested=requests,
            )
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.resource.name}: {exc}")
        response = api_pb2.AllocateResponse()
        for alloc in allocations:
            container = response.container_responses.add()
            container.envs.update(alloc.envs)
            for spec in alloc.devices:
                container.devices.add(
                    container_path=spec.container_path,
                    host_path=spec.host_path,
                    permissions=spec.permissions,
                )
            visible = alloc.envs.get(VISIBLE_DEVICES_ENV, "")
            self._tracer.step(
                "Allocate",
                self._node,
                f"{self.resource.name}: {VISIBLE_DEVICES_ENV}={visible}",
                resource=self.resource.name,
                envs=alloc.envs,
            )
        return response

    def PreStartContainer(self, request, context):
        self._tracer.step(
            "PreStartContainer",
            self._node,
            f"{self.resource.name}: {len(request.devices_ids)} device(s)",
            resource=self.resource.name,
            devices=list(request.devices_ids),
        )
        return api_pb2.PreStartContainerResponse()
