"""The kubelet side of one registered device plugin: a gRPC client and its ListAndWatch stream.

Mirrors kubelet v1.36.3 ``pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go``
(``Connect`` dials ``<socket-dir>/<endpoint>`` within 10 s and hands the client to the
manager, which calls ``GetDevicePluginOptions``; ``Run`` consumes ListAndWatch until it
breaks) and ``endpoint.go`` (``allocate``, ``getPreferredAllocation``,
``preStartContainer``; all refused once the endpoint is stopped).

Deliberate difference: ``Connect`` first tries connect(2) on the socket once and, when the
kernel refuses (no such file, not a socket, connection refused, a path too long), fails at
once with that reason. Kubelet's ``dial`` (``grpc.WithBlock``) keeps retrying until its 10 s
deadline and answers "failed to dial device plugin: context deadline exceeded"; the lab's
plugins serve before they register, so only a broken Register waited there, and it held
the caller for 10 s.

Each registration gets its own Endpoint, and its callbacks carry it, so the manager can
tell a stale endpoint's late stop from the current one's (see ``manager.py``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc

_log = logging.getLogger(__name__)

DIAL_TIMEOUT = 10.0  # client.go dial: context.WithTimeout(ctx, 10*time.Second)
PRE_START_TIMEOUT = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs


def _connect_error(path: Path, timeout: float) -> str | None:
    """What connect(2) says of the plugin's socket, as Go's dialer words it
    ("dial unix <path>: connect: no such file or directory"); None when it accepts."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        errno = getattr(exc, "errno", None)
        if not errno:
            return f"dial unix {path}: connect: {exc}"
        reason = os.strerror(errno)  # Go's syscall texts are lowercase
        return f"dial unix {path}: connect: {reason[:1].lower()}{reason[1:]}"
    finally:
        sock.close()
    return None


class EndpointError(RuntimeError):
    """The endpoint cannot serve the call (``errEndpointStopped``, an empty response)."""


class Endpoint:
    def __init__(
        self,
        resource: str,
        socket: Path,
        on_devices: Callable[[Endpoint, list[api_pb2.Device]], None],
        on_stopped: Callable[[Endpoint], None],
    ) -> None:
        self.resource = resource
        self.socket = socket
        self.options = api_pb2.DevicePluginOptions()
        self._on_devices = on_devices
        self._on_stopped = on_stopped
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._stub = api_pb2_grpc.DevicePluginStub(self._channel)
        self._stream: grpc.Future | None = None
        self._closed = threading.Event()

    def __str__(self) -> str:
        return f"{self.resource} at {self.socket.name}"

    def connect(self, timeout: float = DIAL_TIMEOUT) -> api_pb2.DevicePluginOptions:
        """Dial the plugin and ask for its options (``Connect`` + ``PluginConnected``).

        Raises ConnectionError with kubelet's message when either fails.
        """
        refused = _connect_error(self.socket, timeout)
        if refused is not None:
            self.close()
            raise ConnectionError(f"failed to dial device plugin: {refused}")
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self.close()
            raise ConnectionError(
                f"failed to dial device plugin: context deadline exceeded ({self.socket})"
            ) from None
        try:
            self.options = self._stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=timeout)
        except grpc.RpcError as exc:
            self.close()
            raise ConnectionError(f"failed to get device plugin options: {exc.details()}") from exc
        return self.options

    def start(self) -> None:
        threading.Thread(target=self.run, name=f"endpoint-{self.resource}", daemon=True).start()

    def run(self) -> None:
        """``Run``: every ListAndWatch response to the manager, until the stream breaks."""
        try:
            self._stream = self._stub.ListAndWatch(api_pb2.Empty())
            for response in self._stream:
                self._on_devices(self, list(response.devices))
        except grpc.RpcError as exc:
            if not self._closed.is_set():
                _log.warning("ListAndWatch ended unexpectedly for %s: %s", self, exc.code())
        finally:
            if not self._closed.is_set():
                self._on_stopped(self)

    def close(self) -> None:
        """Drop the connection (a replaced or stopped endpoint); no callback follows."""
        self._closed.set()
        if self._stream is not None:
            self._stream.cancel()
        self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _check(self) -> None:
        if self._closed.is_set():
            raise EndpointError(f"endpoint {self} has been stopped")

    def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        self._check()
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
        )
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    def allocate(self, device_ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        self._check()
        response = self._stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
            ),
        )
        if not response.container_responses:
            raise EndpointError(f"no containers return in allocation response {response}")
        return response.container_responses[0]

    def pre_start_container(self, device_ids: Sequence[str]) -> None:
        self._check()
        self._stub.PreStartContainer(
            api_pb2.PreStartContainerRequest(devices_ids=list(device_ids)),
            timeout=PRE_START_TIMEOUT,
        )
