"""HAMi mode of the device plugin: node registration annotations and annotation-driven Allocate.

Mirrors HAMi ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/register.go``
(``getAPIDevices``, ``RegisterInAnnotation``, ``WatchAndRegister``: every 30 s) and the
Allocate path of ``plugin/server.go`` + ``plugin/util.go`` (``GetPendingPod``,
``popNextContainerDevices``, ``patchErasedAnnotation``, ``PodAllocationTrySuccess``,
``PodAllocationFailed``). Encoding lives in the shared :mod:`gpulab.hami.annotations`.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.deviceplugin.allocate import (
    CONTROL_DEVICES,
    VISIBLE_DEVICES_ENV,
    AllocationError,
    ContainerAllocation,
    DeviceSpec,
)
from gpulab.deviceplugin.rm import Device, GPUInfo
from gpulab.hami import annotations as ha
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

REGISTER_INTERVAL = 30.0


# ---------------------------------------------------------------- pure


def node_devices(
    gpus: Sequence[GPUInfo], healthy: Callable[[str], bool], split_count: int
) -> list[ha.NodeDevice]:
    """What ``getAPIDevices`` registers for each GPU (memory and core scaling = 1)."""
    return [
        ha.NodeDevice(
            id=g.uuid,
            index=g.index,
            count=split_count,
            devmem=g.memory_mib,
            devcore=ha.DEFAULT_DEVCORE,
            type=ha.device_type(g.name),
            numa=g.numa_node if g.numa_node is not None else 0,
            health=healthy(g.uuid),
            mode=ha.MODE_HAMI_CORE,
        )
        for g in gpus
    ]


def pending_pod(pods: Sequence[Mapping[str, Any]], node: str) -> Mapping[str, Any] | None:
    """The pod HAMi bound here whose devices are still to be allocated (oldest first)."""

    def waiting(pod: Mapping[str, Any]) -> bool:
        annos = pod.get("metadata", {}).get("annotations") or {}
        # Not only Pending: on kwok nodes the pod-ready Stage marks a bound pod Running
        # before kubelet's device manager (the node agent) calls Allocate.
        if pod.get("status", {}).get("phase", "Pending") in ("Succeeded", "Failed"):
            return False
        if annos.get(ha.ASSIGNED_NODE) != node or ha.BIND_TIME not in annos:
            return False
        phase = annos.get(ha.BIND_PHASE)
        # "success" too: a multi-container pod whose first containers are done.
        left = any(ha.decode_pod_devices(annos.get(ha.DEVICES_TO_ALLOCATE, "")))
        return phase == ha.BIND_ALLOCATING or (phase == ha.BIND_SUCCESS and left)

    candidates = [p for p in pods if waiting(p)]
    candidates.sort(key=lambda p: int(p["metadata"]["annotations"][ha.BIND_TIME] or 0))
    return candidates[0] if candidates else None


def pop_next(pod_devices: list[list[ha.ContainerDevice]]) -> list[ha.ContainerDevice]:
    """Take (and erase) the first container's devices still to allocate."""
    for i, devs in enumerate(pod_devices):
        if devs:
            pod_devices[i] = []
            return devs
    raise AllocationError("no pending HAMi device allocation left on the pod")


def align_replicas(
    ctr: Sequence[ha.ContainerDevice], available: Sequence[str], devices: Mapping[str, Device]
) -> list[str] | None:
    """One available device ID per GPU HAMi assigned, so kubelet's accounting matches HAMi's.

    None when the available IDs cannot cover the assignment (kubelet then picks by topology).
    """
    chosen: list[str] = []
    for d in ctr:
        match = next((i for i in available if devices[i].uuid == d.uuid and i not in chosen), None)
        if match is None:
            return None
        chosen.append(match)
    return chosen


def hami_allocation(
    ctr: Sequence[ha.ContainerDevice], paths_by_uuid: Mapping[str, Sequence[str]]
) -> ContainerAllocation:
    """Envs HAMi's plugin sets for one container: visible UUIDs plus hami-core limits."""
    unknown = [d.uuid for d in ctr if d.uuid not in paths_by_uuid]
    if unknown:
        raise AllocationError(f"HAMi assigned device(s) not on this node: {', '.join(unknown)}")
    envs = {VISIBLE_DEVICES_ENV: ",".join(d.uuid for d in ctr)}
    for i, d in enumerate(ctr):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d.usedmem}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(ctr[0].usedcores)
    paths = list(dict.fromkeys(p for d in ctr for p in paths_by_uuid[d.uuid]))
    return ContainerAllocation(envs, tuple(DeviceSpec(p, p) for p in [*paths, *CONTROL_DEVICES]))


# ---------------------------------------------------------------- edges (API server)


class HamiRegistrar(threading.Thread):
    """Writes ``hami.io/node-nvidia-register`` + the handshake every 30 s and on health changes."""

    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        gpus: Sequence[GPUInfo],
        healthy: Callable[[str], bool],
        split_count: int,
        tracer: Tracer,
    ) -> None:
        super().__init__(name="hami-register", daemon=True)
        self._core = client.CoreV1Api(api)
        self._node = node
        self._gpus = gpus
        self._healthy = healthy
        self._split = split_count
        self._tracer = tracer
        self._poke = threading.Event()
        self._stop_event = threading.Event()
        self._last = ""

    def poke(self) -> None:
        self._poke.set()

    def stop(self) -> None:
        self._stop_event.set()
        self._poke.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            ok = self.RegisterInAnnotation()
            self._poke.wait(REGISTER_INTERVAL if ok else 5.0)
            self._poke.clear()

    def RegisterInAnnotation(self) -> bool:
        encoded = ha.encode_node_devices(node_devices(self._gpus, self._healthy, self._split))
        annos = {
            ha.NODE_REGISTER: encoded,
            ha.NODE_HANDSHAKE: ha.handshake_reported(dt.datetime.now(dt.UTC)),
        }
        try:
            self._core.patch_node(self._node, {"metadata": {"annotations": annos}})
        except ApiException as exc:
            _log.warning(
                "HAMi registration on node %s failed: %s %s", self._node, exc.status, exc.reason
            )
            return False
        if encoded != self._last:
            self._last = encoded
            self._tracer.step(
                "RegisterInAnnotation",
                ObjectRef(kind="Node", name=self._node),
                f"{ha.NODE_REGISTER}: {len(self._gpus)} GPU(s)",
                annotation=encoded,
            )
        return True


class HamiAllocator:
    """Allocate from the pod annotations HAMi's scheduler wrote (the requested IDs are opaque)."""

    def __init__(self, core: client.CoreV1Api, node: str, tracer: Tracer) -> None:
        self._core = core
        self._node = node
        self._tracer = tracer

    def _pending(self) -> Mapping[str, Any] | None:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self._node}")
        return pending_pod(
            [self._core.api_client.sanitize_for_serialization(p) for p in pods.items], self._node
        )

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str] | None:
        """HAMi's ``alignContainerDevicesWithAllocatedIDs``, done where kubelet asks first."""
        pod = None if must_include else self._pending()
        if pod is None:
            return None
        annos = pod["metadata"].get("annotations") or {}
        try:
            pending = [c for c in ha.decode_pod_devices(annos.get(ha.DEVICES_TO_ALLOCATE, "")) if c]
        except ha.AnnotationError:
            return None
        if not pending or len(pending[0]) != size:
            return None
        return align_replicas(pending[0], [i for i in available if i in devices], devices)

    def allocate(
        self, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]:
        pod = self._pending()
        if pod is None:
            raise AllocationError(
                f"no pod on {self._node} with {ha.BIND_PHASE}={ha.BIND_ALLOCATING}"
            )
        meta = pod["metadata"]
        annos = meta.get("annotations") or {}
        paths: dict[str, tuple[str, ...]] = {d.uuid: d.paths for d in devices.values()}
        try:
            pod_devices = ha.decode_pod_devices(annos.get(ha.DEVICES_TO_ALLOCATE, ""))
            result = []
            for ids in requests:
                ctr = pop_next(pod_devices)
                if len(ctr) != len(ids):
                    raise AllocationError(
                        f"device number not matched: kubelet asked for {len(ids)}, "
                        f"HAMi assigned {len(ctr)}"
                    )
                result.append(hami_allocation(ctr, paths))
        except (AllocationError, ha.AnnotationError) as exc:
            self._finish(meta, {ha.BIND_PHASE: ha.BIND_FAILED})
            raise AllocationError(f"pod {meta['namespace']}/{meta['name']}: {exc}") from exc
        patch = {ha.DEVICES_TO_ALLOCATE: ha.encode_pod_devices(pod_devices)}
        if ha.DEVICES_ALLOCATED not in annos:
            # HAMi's scheduler writes it at bind; record the whole assignment before the
            # first container's entry is erased if it did not.
            patch[ha.DEVICES_ALLOCATED] = annos.get(ha.DEVICES_TO_ALLOCATE, "")
        if not any(pod_devices):
            patch[ha.BIND_PHASE] = ha.BIND_SUCCESS
        self._finish(meta, patch)
        self._tracer.step(
            "Allocate",
            ObjectRef("Pod", meta["name"], meta["namespace"], meta.get("uid")),
            f"HAMi devices {', '.join(a.envs[VISIBLE_DEVICES_ENV] for a in result)}",
            envs=[a.envs for a in result],
        )
        return result

    def _finish(self, meta: Mapping[str, Any], annos: dict[str, str]) -> None:
        self._core.patch_namespaced_pod(
            meta["name"], meta["namespace"], {"metadata": {"annotations": annos}}
        )
        if ha.BIND_PHASE in annos:
            self._release_node_lock(meta)

    def _release_node_lock(self, meta: Mapping[str, Any]) -> None:
        """HAMi's ``ReleaseNodeLock``: drop ``hami.io/mutex.lock`` if this pod holds it."""
        node = self._core.read_node(self._node)
        value = (node.metadata.annotations or {}).get(ha.NODE_LOCK)
        if value is None:
            return
        try:
            _, ns, name = ha.parse_node_lock(value)
        except ha.AnnotationError:
            return
        if (ns, name) != (meta["namespace"], meta["name"]):
            return
        patch = {
            "metadata": {
                "annotations": {ha.NODE_LOCK: None},
                "resourceVersion": node.metadata.resource_version,
            }
        }
        try:
            self._core.patch_node(self._node, patch)
        except ApiException as exc:
            _log.warning("could not release %s on %s: %s", ha.NODE_LOCK, self._node, exc.reason)
