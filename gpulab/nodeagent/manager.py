"""The kubelet device manager for one simulated node: Registration server, endpoints, admission.

Mirrors kubelet v1.36.3 ``pkg/kubelet/cm/devicemanager``:

- ``plugin/v1beta1/server.go`` + ``handler.go``: ``Start`` clears the socket dir and serves
  the Registration service on ``<socket-dir>/kubelet.sock``; ``Register`` checks the API
  version and ``IsExtendedResourceName``, dials the plugin and calls
  ``GetDevicePluginOptions`` (``PluginConnected``) before answering, then follows its
  ListAndWatch; a refused registration is a plain Go error, i.e. gRPC code ``Unknown``;
- ``manager.go``: ``genericDeviceUpdateCallback`` (healthy/unhealthy devices per resource),
  ``PluginDisconnected`` (all devices Unhealthy, the endpoint's stop time set),
  ``GetCapacity`` (a stopped resource stays at 0 allocatable for ``endpointStopGracePeriod``,
  then is dropped), ``Allocate`` → ``allocateContainerResources`` → ``devicesToAllocate``
  (GetPreferredAllocation, falling back to any free device) → the plugin's ``Allocate``;
- the rest of kubelet around it: the pod informer (``spec.nodeName`` field selector, via
  :mod:`gpulab.informer`), admission in a work queue (one pod at a time, as kubelet's
  ``HandlePodAdditions``), node status (the status subresource), a rejected pod's status
  (``Failed`` / ``UnexpectedAdmissionError``).

Decisions are pure functions in :mod:`gpulab.nodeagent.policy`; the API server sits behind
:class:`NodeAPI`. The Topology Manager (``single-numa-node`` when the node's kubelet
configuration asks for it) is :mod:`gpulab.nodeagent.topology`: it admits the pod on one
NUMA node and narrows :meth:`ManagerImpl._allocate_resource` to that node's devices;
without that configuration every free device is in kubelet's "no affinity" set.

Deliberate differences:

- endpoints are keyed by registration, not by resource name alone: the callbacks of an
  endpoint that a newer registration replaced are ignored. Kubelet v1.36.3 keys clients by
  resource name, so the late end of an old ListAndWatch can disconnect the newer plugin
  (kubernetes/kubernetes#121994, changed after 1.36 by #135437);
- node status is patched when it changes (and when a grace period ends), not every 10 s;
- Go set iteration (random) becomes sorted order, so fallbacks are repeatable;
- lab convenience: allocations are recorded in the pod annotation
  ``gpulab.io/allocate-<container>`` instead of kubelet's checkpoint file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import grpc

from gpulab.deviceplugin.api import api_pb2, api_pb2_grpc
from gpulab.grpcserver import new_server
from gpulab.informer import Handlers, Store, key_of
from gpulab.nodeagent import policy, topology
from gpulab.nodeagent.endpoint import DIAL_TIMEOUT, Endpoint, EndpointError
from gpulab.trace import ObjectRef, Tracer
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
STATUS_KEY = "node-status"  # the work-queue key of the node status sync


class NodeAPI(Protocol):
    """What the device manager writes to the API server."""

    def patch_node_resources(
        self, node: str, capacity: dict[str, str], allocatable: dict[str, str]
    ) -> None: ...

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> None: ...


class ManagerImpl(api_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        node: str,
        socket_dir: Path,
        api: NodeAPI,
        tracer: Tracer,
        grace_period: float = policy.ENDPOINT_STOP_GRACE_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        dial_timeout: float = DIAL_TIMEOUT,
    ) -> None:
        self.node = node
        self.socket_dir = socket_dir
        self.socket = socket_dir / KUBELET_SOCKET
        self.grace_period = grace_period
        self.dial_timeout = dial_timeout
        # The pod informer's cache and handlers (kubelet's pod manager): handlers only
        # enqueue, the admission worker reads the store.
        self.pods = Store()
        self.handlers = Handlers(
            on_add=self._pod_changed,
            on_update=lambda _old, new: self._pod_changed(new),
            on_delete=self._pod_changed,
        )
        self._api = api
        self._tracer = tracer
        self._clock = clock
        self._node_ref = ObjectRef(kind="Node", name=node)
        self._queue = WorkQueue()
        self._lock = threading.Lock()
        self._endpoints: dict[str, Endpoint] = {}  # resource -> the current registration
        self._resources: dict[str, policy.ResourceState] = {}
        self._reported: dict[str, tuple[int, int]] = {}
        # pod uid -> container -> what it got: authoritative in this process (a watch may
        # deliver a pod version older than our own annotation patch).
        self._records: dict[str, dict[str, policy.ContainerRecord]] = {}
        # pod uid -> (reason, message) of its admission failure, kubelet's own view of the
        # pod's status (its status manager): written again if another writer replaced it
        self._rejected: dict[str, tuple[str, str]] = {}
        # kubelet's Topology Manager; its config and the machine's NUMA nodes live in the
        # kubelet root dir, the device-plugins dir's parent (gpulab/nodeagent/topology.py)
        self._topology = topology.TopologyManager.load(socket_dir.parent)
        self._server: grpc.Server | None = None
        self._worker: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def Start(self) -> None:
        """Like kubelet: remove the sockets left in the directory (plugins notice
        kubelet.sock being created and register again), serve Registration."""
        for stale in self.socket_dir.glob("*.sock"):
            stale.unlink(missing_ok=True)
        server = new_server(max_workers=4)
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self._worker = threading.Thread(
            target=run_worker, args=(self._queue, self._reconcile, "node-agent"), daemon=True
        )
        self._worker.start()
        self._tracer.step("Start", self._node_ref, f"device manager listening on {self.socket}")

    def Stop(self) -> None:
        self._queue.shutdown()
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for ep in endpoints:
            ep.close()
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)
        if self._worker is not None:
            self._worker.join(timeout=2)

    # ---------------------------------------------------------------- Registration service

    def Register(self, request, context):
        why = policy.registration_error(request.version, request.resource_name)
        if why is not None:
            context.abort(grpc.StatusCode.UNKNOWN, why)
        endpoint = Endpoint(
            request.resource_name,
            self.socket_dir / request.endpoint,
            self._on_devices,
            self._on_stopped,
        )
        try:
            options = endpoint.connect(self.dial_timeout)
        except ConnectionError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
        with self._lock:
            old = self._endpoints.get(request.resource_name)
            self._endpoints[request.resource_name] = endpoint
            state = self._resources.get(request.resource_name, policy.ResourceState())
            self._resources[request.resource_name] = replace(state, stopped_at=None)
        if old is not None:
            old.close()  # replaced: nothing it reports from now on counts
        endpoint.start()
        self._tracer.step(
            "Register",
            self._node_ref,
            f"plugin for {request.resource_name} registered at {request.endpoint}",
            resource=request.resource_name,
            endpoint=request.endpoint,
            preferred_allocation=options.get_preferred_allocation_available,
        )
        return api_pb2.Empty()

    # ---------------------------------------------------------------- devices

    def _current(self, endpoint: Endpoint) -> bool:
        """Is this the endpoint of the latest registration of its resource? (lock held)"""
        return self._endpoints.get(endpoint.resource) is endpoint

    def _on_devices(self, endpoint: Endpoint, devices: list[api_pb2.Device]) -> None:
        """``genericDeviceUpdateCallback``."""
        healthy = frozenset(d.ID for d in devices if d.health == "Healthy")
        unhealthy = frozenset(d.ID for d in devices if d.health != "Healthy")
        with self._lock:
            if not self._current(endpoint):
                return
            self._resources[endpoint.resource] = policy.ResourceState(healthy, unhealthy)
        self._queue.add(STATUS_KEY)
        self._recheck_waiting_pods()

    def _on_stopped(self, endpoint: Endpoint) -> None:
        """``PluginDisconnected``: the resource stays, with every device Unhealthy."""
        with self._lock:
            if not self._current(endpoint):
                return
            state = self._resources.get(endpoint.resource, policy.ResourceState())
            self._resources[endpoint.resource] = policy.mark_unhealthy(state, self._clock())
        endpoint.close()
        self._tracer.step(
            "PluginDisconnected",
            self._node_ref,
            f"{endpoint.resource}: plugin gone; its devices are Unhealthy until it registers "
            f"again or {self.grace_period:g}s pass",
            warning=True,
            resource=endpoint.resource,
        )
        self._queue.add(STATUS_KEY)

    def capacity(self, resource: str) -> tuple[int, int]:
        """(capacity, allocatable) as the next node status would report them."""
        with self._lock:
            cap, alloc, _ = policy.get_capacity(self._resources, self._clock(), self.grace_period)
        return cap.get(resource, 0), alloc.get(resource, 0)

    def _sync_status(self) -> float | None:
        """kubelet's node status update: ``GetCapacity`` into the Node's status."""
        with self._lock:
            now = self._clock()
            cap, alloc, deleted = policy.get_capacity(self._resources, now, self.grace_period)
            for name in deleted:  # GetCapacity forgets them; node status keeps them at 0
                self._resources.pop(name, None)
                self._endpoints.pop(name, None)
            wanted = {r: (cap[r], alloc[r]) for r in cap}
            wanted.update({r: (0, 0) for r in deleted})
            changed = {r: v for r, v in wanted.items() if self._reported.get(r) != v}
            requeue = policy.next_expiry(self._resources, now, self.grace_period)
        if changed:
            self._api.patch_node_resources(
                self.node,
                {r: str(c) for r, (c, _) in changed.items()},
                {r: str(a) for r, (_, a) in changed.items()},
            )
            with self._lock:
                self._reported.update(changed)
            for resource, (c, a) in sorted(changed.items()):
                gone = " (plugin gone for good: removed)" if resource in deleted else ""
                self._tracer.step(
                    "GetCapacity",
                    self._node_ref,
                    f"{resource}: capacity {c}, allocatable {a}{gone}",
                    resource=resource,
                    capacity=c,
                    allocatable=a,
                )
        return requeue

    # ---------------------------------------------------------------- pods

    def _pod_changed(self, pod: dict[str, Any]) -> None:
        self._queue.add(key_of(pod))

    def _recheck_waiting_pods(self) -> None:
        """Devices arrived: pods still waiting for an allocation are admitted again."""
        for pod in self.pods.list():
            uid = policy.pod_key(pod)
            if uid not in self._records and uid not in self._rejected:
                self._queue.add(key_of(pod))

    def _reconcile(self, key: str) -> float | None:
        if key == STATUS_KEY:
            return self._sync_status()
        pod = self.pods.get(key)
        if pod is None or policy.is_terminal(pod):
            self._forget(pod)
            return None
        self.admit(pod)
        return None

    def _forget(self, pod: Mapping[str, Any] | None) -> None:
        """The pod finished or is gone: its devices are free again."""
        if pod is None:
            live = {policy.pod_key(p) for p in self.pods.list()}
            gone = [uid for uid in self._records if uid not in live]
        else:
            gone = [policy.pod_key(pod)]
        for uid in gone:
            self._rejected.pop(uid, None)
            self._topology.forget(uid)
            if self._records.pop(uid, None):
                _log.info("freed the devices of pod %s", uid)

    def admit(self, pod: dict[str, Any]) -> None:
        """Kubelet's admission of one pod: Allocate for each container that still needs it."""
        uid = policy.pod_key(pod)
        if uid in self._rejected:
            if pod.get("status", {}).get("phase") != "Failed":
                # a status writer that raced ours (kwok's pod-ready stage patching Running
                # from the Pending it saw) does not bring a rejected pod back: kubelet's
                # status manager writes its own status again
                self._write_failed(pod, *self._rejected[uid])
            return
        if uid not in self._records and policy.recorded(pod):
            self._records[uid] = policy.recorded(pod)  # an agent restart: adopt the record
        with self._lock:
            registered = set(self._resources)
        needs = policy.container_needs(pod, registered)
        done = self._records.get(uid, {})
        todo = [n for n in needs if n.name not in done]
        if not todo:
            return
        meta = pod["metadata"]
        ref = ObjectRef("Pod", meta["name"], meta.get("namespace"), meta.get("uid"))
        records = self._records.setdefault(uid, {})
        fresh: dict[str, policy.ContainerRecord] = {}
        try:
            # Topology Manager admission: a NUMA node per container, or TopologyAffinityError
            self._topology.adopt(self.pods.list())  # after a restart: the recorded choices
            self._topology.Admit(pod, todo, self._free_devices(todo))
            for need in todo:
                fresh[need.name] = records[need.name] = self._allocate_container(pod, need)
        except (policy.AdmissionError, EndpointError, grpc.RpcError) as exc:
            for name in fresh:
                records.pop(name, None)
            if not records:
                self._records.pop(uid, None)
            self._reject(pod, ref, exc)
            return
        annotations = {policy.annotation_key(c): r.to_json() for c, r in fresh.items()}
        annotations.update(self._topology.annotations(uid))  # the NUMA choice, for restarts
        try:
            self._api.annotate_pod(meta["namespace"], meta["name"], annotations)
        except Exception as exc:  # the devices stay held in memory either way
            _log.warning("could not record the allocation on %s: %s", ref, exc)
        for container, rec in fresh.items():
            self._tracer.step(
                "Allocate",
                ref,
                f"{container}: "
                + ", ".join(f"{r}={','.join(ids)}" for r, ids in rec.devices.items())
                + f" (recorded in {policy.annotation_key(container)}: the lab's checkpoint)",
                container=container,
                devices=rec.devices,
                envs=rec.envs,
            )

    def _allocate_container(
        self, pod: Mapping[str, Any], need: policy.ContainerNeed
    ) -> policy.ContainerRecord:
        """``allocateContainerResources``: each resource of the container, one Allocate each."""
        record = policy.ContainerRecord()
        for resource, n in sorted(need.resources.items()):
            ids, response = self._allocate_resource(pod, need.name, resource, n)
            record.devices[resource] = ids
            record.envs.update(response.envs)
            record.mounts += [
                {"containerPath": m.container_path, "hostPath": m.host_path,
                 "readOnly": m.read_only}
                for m in response.mounts
            ]  # fmt: skip
            record.device_specs += [
                {"containerPath": d.container_path, "hostPath": d.host_path,
                 "permissions": d.permissions}
                for d in response.devices
            ]  # fmt: skip
        return record

    def _allocate_resource(
        self, pod: Mapping[str, Any], container: str, resource: str, n: int
    ) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        """``devicesToAllocate`` for one resource, then the plugin's Allocate."""
        own = self._records.get(policy.pod_key(pod), {})
        init_names = {c.get("name") for c in pod.get("spec", {}).get("initContainers") or []}
        # devicesToReuse: what this pod's (finished) init containers held and no app
        # container has taken yet
        taken = {
            d for c, r in own.items() if c not in init_names for d in r.devices.get(resource, ())
        }
        reusable = [
            d for c, r in own.items() if c in init_names for d in r.devices.get(resource, ())
            if d not in taken
        ]  # fmt: skip
        with self._lock:
            endpoint = self._endpoints.get(resource)
            state = self._resources.get(resource)
            in_use = policy.in_use(self._records, resource)
        allocated, available, needed = policy.plan_allocation(resource, n, state, in_use, reusable)
        # single-numa-node: only the devices on the NUMA node admission chose
        available = self._topology.Aligned(
            policy.pod_key(pod), container, resource, available, needed
        )
        if endpoint is None:
            raise policy.AdmissionError(f"unknown Device Plugin {resource}")
        ids = allocated
        if needed:
            preferred: list[str] = []
            if endpoint.options.get_preferred_allocation_available:
                try:
                    preferred = endpoint.get_preferred_allocation(
                        [*available, *allocated], allocated, n
                    )
                except grpc.RpcError as exc:
                    raise policy.AdmissionError(
                        "device plugin GetPreferredAllocation rpc failed with err: "
                        + policy.rpc_error(exc.code().name, exc.details())
                    ) from exc
            ids = policy.finish_allocation(allocated, available, needed, preferred)
        response = endpoint.allocate(ids)
        if endpoint.options.pre_start_required:
            # kubelet calls it right before the container starts; here that is now.
            endpoint.pre_start_container(ids)
        return ids, response

    def _free_devices(self, needs: list[policy.ContainerNeed]) -> dict[str, list[str]]:
        """Per resource the pod asks for: healthy devices no pod holds."""
        with self._lock:
            states = {r: self._resources.get(r) for n in needs for r in n.resources}
        return {
            r: sorted(state.healthy - policy.in_use(self._records, r)) if state else []
            for r, state in states.items()
        }

    def _reject(self, pod: Mapping[str, Any], ref: ObjectRef, exc: Exception) -> None:
        """Kubelet's admission failure: the pod becomes Failed/UnexpectedAdmissionError."""
        detail = str(exc)
        if isinstance(exc, grpc.Call):
            detail = policy.rpc_error(exc.code().name, exc.details())
        message = f"Allocate failed due to {detail}, which is unexpected"
        reason = policy.ADMISSION_ERROR_REASON
        if isinstance(exc, topology.TopologyAffinityError):  # as kubelet's rejectPod words it
            message, reason = f"Pod was rejected: {detail}", exc.reason
        self._rejected[policy.pod_key(pod)] = (reason, message)
        self._tracer.step("Allocate", ref, message, warning=True, reason=reason)
        self._write_failed(pod, reason, message)

    def _write_failed(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        try:
            self._api.fail_pod(meta["namespace"], meta["name"], reason, message)
        except Exception as api_exc:
            _log.warning("could not fail pod %s/%s: %s", meta["namespace"], meta["name"], api_exc)
