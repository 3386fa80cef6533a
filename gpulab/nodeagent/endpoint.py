"""The kubelet side of one registered device plugin: a gRPC client and its ListAndWatch stream.

Mirrors kubelet ``pkg/kubelet/cm/devicemanager/endpoint.go`` (``newEndpointImpl`` dials
``<socket-dir>/<endpoint>``; ``run`` consumes ListAndWatch and calls back with every device
list; ``allocate``, ``getPreferredAllocation``, ``preStartContainer``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc

_log = logging.getLogger(__name__)

_CALL_TIMEOUT = 10.0

DeviceCallback = Callable[[str, dict[str, bool]], None]
"""(resource, device ID -> healthy)."""


class Endpoint:
    def __init__(
        self,
        resource: str,
        socket: Path,
        options: api_pb2.DevicePluginOptions,
        on_devices: DeviceCallback,
        on_stop: Callable[[Endpoint], None],
    ) -> None:
        self.resource = resource
        self.socket = socket
        self.options = options
        self._on_devices = on_devices
        self._on_stop = on_stop
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.DevicePluginStub(self._channel)
        self._stream: grpc.Future | None = None
        self._thread = threading.Thread(target=self.run, name=f"endpoint-{resource}", daemon=True)
        self._stopped = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def run(self) -> None:
        """Consume ListAndWatch until the plugin goes away or we are stopped."""
        try:
            self._stream = self._stub.ListAndWatch(api_pb2.Empty())
            for response in self._stream:
                health = {d.ID: d.health == "Healthy" for d in response.devices}
                self._on_devices(self.resource, health)
        except grpc.RpcError as exc:
            if not self._stopped.is_set():
                _log.warning("ListAndWatch for %s ended: %s", self.resource, exc.code())
        finally:
            if not self._stopped.is_set():
                self._on_stop(self)

    def stop(self) -> None:
        self._stopped.set()
        if self._stream is not None:
            self._stream.cancel()
        self._channel.close()

    def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        response = self._stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=list(available),
                        must_include_deviceIDs=list(must_include),
                        allocation_size=size,
                    )
                ]
            ),
            timeout=_CALL_TIMEOUT,
        )
        return list(response.container_responses[0].deviceIDs)

    def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        response = self._stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
            ),
            timeout=_CALL_TIMEOUT,
        )
        return response.container_responses[0]

    def pre_start_container(self, device_ids: Sequence[str]) -> None:
        self._stub.PreStartContainer(
            api_pb2.PreStartContainerRequest(devices_ids=list(device_ids)), timeout=_CALL_TIMEOUT
        )
