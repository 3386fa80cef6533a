"""The kubelet device manager for one simulated node: Registration server, endpoints, admission.

Mirrors kubelet ``pkg/kubelet/cm/devicemanager/manager.go`` (``ManagerImpl``: ``Start``
serves the Registration service on ``<socket-dir>/kubelet.sock`` after clearing the socket
dir; ``Register`` validates the request and dials the plugin's endpoint; the endpoint's
ListAndWatch updates ``healthyDevices``/``allDevices`` and the node's capacity and
allocatable; ``Allocate`` at pod admission picks devices - GetPreferredAllocation when the
plugin offers it - and calls the plugin's Allocate). The API server sits behind
:class:`NodeAPI` so the gRPC side can run without one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any, Protocol

import grpc

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.nodeagent import policy, topology
from gpulab.nodeagent.endpoint import Endpoint
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class NodeAPI(Protocol):
    """What the device manager needs from the API server."""

    def patch_node_resources(
        self, node: str, capacity: dict[str, str], allocatable: dict[str, str]
    ) -> None: ...

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        """Pods bound to ``node`` and the list's resourceVersion."""
        ...

    def watch_pods(
        self, node: str, resource_version: str, stop: threading.Event
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(ADDED | MODIFIED | DELETED, pod) until the watch times out or ``stop`` is set."""
        ...

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> None: ...


class ManagerImpl(api_pb2_grpc.RegistrationServicer):
    def __init__(self, node: str, socket_dir: Path, api: NodeAPI, tracer: Tracer) -> None:
        self.node = node
        self.socket_dir = socket_dir
        self.socket = socket_dir / KUBELET_SOCKET
        self._api = api
        self._tracer = tracer
        self._node_ref = ObjectRef(kind="Node", name=node)
        self._lock = threading.Lock()
        self._endpoints: dict[str, Endpoint] = {}
        self._health: dict[str, dict[str, bool]] = {}  # resource -> device ID -> healthy
        self._reported: dict[str, tuple[int, int]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # pod key -> pod
        # Authoritative in this process: the watch may deliver a pod version older than our
        # own annotation patch, and that must not make its devices look free.
        self._records: dict[str, dict[str, policy.ContainerRecord]] = {}
        self._rejected: set[str] = set()
        # kubelet's Topology Manager; its config and the machine's NUMA nodes live in the
        # kubelet root dir, the device-plugins dir's parent (gpulab/nodeagent/topology.py)
        self._topology = topology.TopologyManager.load(socket_dir.parent)
        self._work: queue.Queue[tuple[str, dict[str, Any] | None]] = queue.Queue()
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---------------------------------------------------------------- lifecycle

    def Start(self) -> None:
        # Like kubelet: a fresh Registration socket, stale plugin sockets removed (plugins
        # notice and re-register).
        for stale in self.socket_dir.glob("*.sock"):
            stale.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self._tracer.step("Start", self._node_ref, f"device manager listening on {self.socket}")

    def run_pods(self) -> None:
        """Start the pod watch and the admission worker (needs the API)."""
        for target, name in ((self._watch_loop, "pod-watch"), (self._admit_loop, "admission")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def Stop(self) -> None:
        self._stop.set()
        self._work.put(("stop", None))
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for ep in endpoints:
            ep.stop()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)
        # The pod watch blocks in a read until its server-side timeout; it is a daemon
        # thread, so give the others a moment to finish their item and do not wait for it.
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    # ---------------------------------------------------------------- Registration service

    def Register(self, request, context):
        if request.version != API_VERSION:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"version {request.version!r} is not supported; this kubelet speaks {API_VERSION}",
            )
        if "/" not in request.resource_name or not request.endpoint:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"invalid resource name {request.resource_name!r} or endpoint {request.endpoint!r}",
            )
        endpoint = Endpoint(
            request.resource_name,
            self.socket_dir / request.endpoint,
            request.options,
            self._on_devices,
            self._on_endpoint_stop,
        )
        with self._lock:
            old = self._endpoints.pop(request.resource_name, None)
            self._endpoints[request.resource_name] = endpoint
        if old is not None:
            old.stop()
        endpoint.start()
        self._tracer.step(
            "Register",
            self._node_ref,
            f"plugin for {request.resource_name} registered at {request.endpoint}",
            resource=request.resource_name,
            endpoint=request.endpoint,
            preferred_allocation=request.options.get_preferred_allocation_available,
        )
        return api_pb2.Empty()

    # ---------------------------------------------------------------- devices

    def _on_devices(self, resource: str, health: dict[str, bool]) -> None:
        with self._lock:
            self._health[resource] = dict(health)
        self._update_capacity(resource)
        self._work.put(("recheck", None))

    def _on_endpoint_stop(self, endpoint: Endpoint) -> None:
        # Like kubelet: the resource's devices become unhealthy until the plugin is back.
        with self._lock:
            if self._endpoints.get(endpoint.resource) is not endpoint:
                return
            del self._endpoints[endpoint.resource]
            devices = self._health.get(endpoint.resource, {})
            self._health[endpoint.resource] = dict.fromkeys(devices, False)
        self._update_capacity(endpoint.resource)

    def _update_capacity(self, resource: str) -> None:
        with self._lock:
            cap, alloc = policy.capacity(self._health.get(resource, {}))
            if self._reported.get(resource) == (cap, alloc):
                return
            self._reported[resource] = (cap, alloc)
        try:
            self._api.patch_node_resources(self.node, {resource: str(cap)}, {resource: str(alloc)})
        except Exception as exc:  # the API may be down; the next update retries
            _log.warning("could not update %s capacity on %s: %s", resource, self.node, exc)
            with self._lock:
                self._reported.pop(resource, None)
            return
        self._tracer.step(
            "GetCapacity",
            self._node_ref,
            f"{resource}: capacity {cap}, allocatable {alloc}",
            resource=resource,
            capacity=cap,
            allocatable=alloc,
        )

    def capacity(self, resource: str) -> tuple[int, int]:
        with self._lock:
            return policy.capacity(self._health.get(resource, {}))

    # ---------------------------------------------------------------- pods

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            try:
                pods, rv = self._api.list_pods(self.node)
                self._work.put(("resync", {"items": pods}))
                for kind, pod in self._api.watch_pods(self.node, rv, self._stop):
                    self._work.put((kind, pod))
            except Exception as exc:  # a dropped watch or an API restart: list again
                if not self._stop.is_set():
                    _log.warning("pod watch on %s failed: %s; retrying", self.node, exc)
                    self._stop.wait(1.0)

    def _admit_loop(self) -> None:
        while True:
            kind, obj = self._work.get()
            if kind == "stop":
                return
            if kind == "resync" and obj is not None:
                self._pods = {policy.pod_key(p): p for p in obj["items"]}
                self._records = policy.records_of(obj["items"])
                self._topology.resync(obj["items"])
            elif kind == "DELETED" and obj is not None:
                self._forget(policy.pod_key(obj))
            elif kind in ("ADDED", "MODIFIED") and obj is not None:
                key = policy.pod_key(obj)
                self._pods[key] = obj
                if policy.is_terminal(obj):
                    self._forget(key)
            for key, pod in list(self._pods.items()):
                try:
                    self.admit(pod)
                except Exception:  # one bad pod must not stop admission for the node
                    _log.exception("admitting pod %s failed", key)

    def _forget(self, key: str) -> None:
        """The pod finished or is gone: its devices are free again."""
        self._pods.pop(key, None)
        self._rejected.discard(key)
        self._topology.forget(key)
        if self._records.pop(key, None):
            _log.info("freed the devices of pod %s", key)

    def admit(self, pod: dict[str, Any]) -> None:
        """Kubelet's admission of one pod: Allocate for each container that still needs it."""
        key = policy.pod_key(pod)
        if policy.is_terminal(pod) or key in self._rejected:
            return
        with self._lock:
            registered = {r for r in self._endpoints if r in self._health}
        needs = policy.container_needs(pod, registered)
        done = {**policy.recorded(pod), **self._records.get(key, {})}
        todo = [n for n in needs if n.name not in done]
        if not todo:
            return
        meta = pod["metadata"]
        ref = ObjectRef("Pod", meta["name"], meta.get("namespace"), meta.get("uid"))
        records: dict[str, policy.ContainerRecord] = {}
        try:
            # Topology Manager admission: a NUMA node per container, or TopologyAffinityError
            self._topology.Admit(pod, todo, self._free_devices(key, todo))
            for need in todo:
                records[need.name] = self._allocate_container(pod, need, done, records)
        except (policy.AdmissionError, grpc.RpcError) as exc:
            self._reject(pod, ref, exc)
            return
        self._records.setdefault(key, {}).update(records)
        annotations = {policy.annotation_key(c): r.to_json() for c, r in records.items()}
        annotations.update(self._topology.annotations(key))  # the NUMA choice, for restarts
        try:
            self._api.annotate_pod(meta["namespace"], meta["name"], annotations)
        except Exception as exc:  # the devices stay held in memory either way
            _log.warning("could not record the allocation on %s: %s", ref, exc)
        for container, rec in records.items():
            self._tracer.step(
                "Allocate",
                ref,
                f"{container}: "
                + ", ".join(f"{r}={','.join(ids)}" for r, ids in rec.devices.items()),
                container=container,
                devices=rec.devices,
                envs=rec.envs,
            )

    def _allocate_container(
        self,
        pod: dict[str, Any],
        need: policy.ContainerNeed,
        done: Mapping[str, policy.ContainerRecord],
        pending: Mapping[str, policy.ContainerRecord],
    ) -> policy.ContainerRecord:
        record = policy.ContainerRecord()
        key = policy.pod_key(pod)
        for resource, n in sorted(need.resources.items()):
            with self._lock:
                endpoint = self._endpoints.get(resource)
                healthy = [d for d, ok in self._health.get(resource, {}).items() if ok]
            if endpoint is None:  # the plugin went away since admission started
                raise policy.AdmissionError(f"no device plugin registered for {resource}")
            own = {**done, **pending}
            held = policy.in_use(self._records, resource, exclude=key)
            # This pod's app containers keep theirs; its init containers' devices are reusable.
            held |= {
                d
                for c, r in own.items()
                if not self._is_init(pod, c)
                for d in r.devices.get(resource, ())
            }
            reusable = [
                d
                for c, r in own.items()
                if self._is_init(pod, c)
                for d in r.devices.get(resource, ())
            ]
            available, must = policy.devices_to_allocate(resource, n, healthy, held, reusable)
            # single-numa-node: only the devices on the NUMA node admission chose
            available = self._topology.Aligned(key, need.name, resource, available, n)
            if endpoint.options.get_preferred_allocation_available:
                preferred = endpoint.get_preferred_allocation(available, must, n)
                ids = policy.check_preferred(preferred, available, n)
            else:
                ids = [*must, *[d for d in available if d not in must]][:n]
            response = endpoint.allocate(ids)
            if endpoint.options.pre_start_required:
                # kubelet calls it right before the container starts; here that is now.
                endpoint.pre_start_container(ids)
            record.devices[resource] = ids
            record.envs.update(response.envs)
            record.mounts += [
                {
                    "containerPath": m.container_path,
                    "hostPath": m.host_path,
                    "readOnly": m.read_only,
                }
                for m in response.mounts
            ]
            record.device_specs += [
                {
                    "containerPath": d.container_path,
                    "hostPath": d.host_path,
                    "permissions": d.permissions,
                }
                for d in response.devices
            ]
        return record

    def _free_devices(self, key: str, needs: list[policy.ContainerNeed]) -> dict[str, list[str]]:
        """Per resource the pod asks for: healthy devices no other pod holds."""
        with self._lock:
            health = {r: dict(self._health.get(r, {})) for n in needs for r in n.resources}
        return {
            r: policy.free_devices(
                [d for d, ok in h.items() if ok], policy.in_use(self._records, r, exclude=key)
            )
            for r, h in health.items()
        }

    @staticmethod
    def _is_init(pod: Mapping[str, Any], container: str) -> bool:
        return any(
            c.get("name") == container for c in pod.get("spec", {}).get("initContainers") or []
        )

    def _reject(self, pod: dict[str, Any], ref: ObjectRef, exc: Exception) -> None:
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        message = f"Allocate failed due to {detail}, which is unexpected"
        reason = policy.ADMISSION_ERROR_REASON
        if isinstance(exc, topology.TopologyAffinityError):  # as kubelet's rejectPod words it
            message, reason = f"Pod was rejected: {detail}", exc.reason
        meta = pod["metadata"]
        self._rejected.add(policy.pod_key(pod))
        self._tracer.step("Allocate", ref, message, warning=True, reason=reason)
        try:
            self._api.fail_pod(meta["namespace"], meta["name"], reason, message)
        except Exception as api_exc:
            _log.warning("could not fail pod %s: %s", ref, api_exc)
