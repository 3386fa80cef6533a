"""HAMi mode of the device plugin: node registration, Allocate from the pod's annotations,
and releasing the node lock once the pod is allocated.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/``:
- ``register.go``: ``getAPIDevices`` (one ``DeviceInfo`` per GPU, mode ``hami-core``),
  ``RegisterInAnnotation`` (patches ``hami.io/node-nvidia-register`` only when the encoded
  list changed, plus ``hami.io/node-nvidia-score`` when ``ENABLE_TOPOLOGY_SCORE=true``) and
  ``WatchAndRegister`` (every 30 s, 5 s after an error). v2.10 writes no handshake: the
  scheduler judges health from ``nvidia.com/gpu`` allocatable;
- ``server.go`` ``Allocate`` / ``GetPreferredAllocation`` and ``util.go``
  (``GetPendingPod`` via ``GetAllocatePodByNode`` — the pod named by the node lock first —,
  ``popNextContainerDevices``, ``patchErasedAnnotation``, ``PodAllocationTrySuccess``,
  ``PodAllocationFailed``): the devices a container gets are the next non-empty slot of
  ``hami.io/vgpu-devices-to-allocate`` (init containers first); when no slot is left the pod
  is marked ``hami.io/bind-phase: success`` and ``hami.io/mutex.lock`` is released
  (``nodelock.ReleaseNodeLock``, shared with the extender); a failure marks it ``failed``
  and releases the lock too.

Differences, named: a health change re-registers at once (upstream waits for its next 30 s
pass); the pair scores come from the NUMA node and NVLink peers the plugin already read
through NVML (what ``GetTopologyCommonAncestor`` / NVLink remote PCI info give on the shim)
instead of querying NVML again; the fallback pod search also accepts a pod kwok already
marked Running (kubelet would still hold it Pending); the hami-core library mounts and cache
envs are not set (there is no hami-core in the lab).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client

from gpulab.deviceplugin.allocate import (
    CONTROL_DEVICES,
    VISIBLE_DEVICES_ENV,
    AllocationError,
    ContainerAllocation,
    DeviceSpec,
)
from gpulab.deviceplugin.rm import Device, GPUInfo
from gpulab.hami import annotations as ha
from gpulab.hami import nodelock
from gpulab.hami.cluster import Cluster, ClusterError, KubeCluster
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

REGISTER_INTERVAL = 30.0
ERROR_INTERVAL = 5.0
TOPOLOGY_ENV = "ENABLE_TOPOLOGY_SCORE"
# links.go / calculate_score.go: NVML_TOPOLOGY_NODE (same CPU) 20, SYSTEM (cross CPU) 10,
# one NVLink 100.
SAME_CPU, CROSS_CPU, NVLINK = 20, 10, 100

Obj = dict[str, Any]


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


def pair_scores(gpus: Sequence[GPUInfo]) -> dict[str, dict[str, int]]:
    """``calculateGPUScore``: per GPU pair, the PCIe path (same / other NUMA node) plus
    100 per NVLink between them."""
    scores: dict[str, dict[str, int]] = {}
    for a in gpus:
        row = {}
        for b in gpus:
            if a.index == b.index:
                continue
            path = SAME_CPU if a.numa_node == b.numa_node else CROSS_CPU
            row[b.uuid] = path + NVLINK * a.nvlinks.get(b.index, 0)
        scores[a.uuid] = row
    return scores


def _annos(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def waiting_pod(pods: Sequence[Mapping[str, Any]], node: str) -> Mapping[str, Any] | None:
    """``GetPendingPod``'s fallback: a pod on ``node`` with a bind time and phase
    allocating or success (a multi-container pod part-way through)."""
    for pod in pods:
        if (pod.get("status") or {}).get("phase", "Pending") in ("Succeeded", "Failed"):
            continue
        annos = _annos(pod)
        if ha.BIND_TIME not in annos:
            continue
        if annos.get(ha.BIND_PHASE) not in (ha.BIND_ALLOCATING, ha.BIND_SUCCESS):
            continue
        if annos.get(ha.ASSIGNED_NODE) == node:
            return pod
    return None


def pop_next(
    pod_devices: list[list[ha.ContainerDevice]], n_init: int, n_app: int
) -> tuple[int, list[ha.ContainerDevice]]:
    """``popNextContainerDevices``: erase and return the first non-empty slot (its index:
    init containers first, then app containers)."""
    for i, devs in enumerate(pod_devices):
        if devs:
            pod_devices[i] = []
            if i >= n_init + n_app:
                raise AllocationError(
                    f"container index {i} out of range (init={n_init}, regular={n_app})"
                )
            return i, devs
    raise AllocationError("no pending device allocation found")


def align_replicas(
    ctr: Sequence[ha.ContainerDevice], available: Sequence[str], devices: Mapping[str, Device]
) -> list[str] | None:
    """``selectPreferredDeviceIDsFromAnnotatedDevices``: one available replica ID per GPU
    HAMi assigned, so kubelet's accounting matches HAMi's; None when they cannot cover it."""
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
    """``WatchAndRegister``: the registration annotation every 30 s when it changed."""

    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        gpus: Sequence[GPUInfo],
        healthy: Callable[[str], bool],
        split_count: int,
        tracer: Tracer,
        cluster: Cluster | None = None,
    ) -> None:
        super().__init__(name="hami-register", daemon=True)
        self._cluster = cluster or KubeCluster(api)
        self._node = node
        self._gpus = gpus
        self._healthy = healthy
        self._split = split_count
        self._tracer = tracer
        self._poke = threading.Event()
        self._stop_event = threading.Event()
        self._cache = ""  # plugin.deviceCache
        self._topology = os.environ.get(TOPOLOGY_ENV) == "true"

    def poke(self) -> None:
        """A device's health changed: register now (lab; upstream waits for its pass)."""
        self._poke.set()

    def stop(self) -> None:
        self._stop_event.set()
        self._poke.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            ok = self.RegisterInAnnotation() is not None
            self._poke.wait(REGISTER_INTERVAL if ok else ERROR_INTERVAL)
            self._poke.clear()

    def RegisterInAnnotation(self) -> bool | None:
        """True: patched; False: unchanged, nothing written; None: the patch failed."""
        encoded = ha.encode_node_devices(node_devices(self._gpus, self._healthy, self._split))
        if encoded == self._cache:
            return False
        annos: dict[str, str | None] = {ha.NODE_REGISTER: encoded}
        if self._topology:
            annos[ha.NODE_PAIR_SCORE] = ha.encode_pair_scores(pair_scores(self._gpus))
        try:
            self._cluster.patch_node_annotations(self._node, annos)
        except ClusterError as exc:
            _log.warning("HAMi registration on node %s failed: %s", self._node, exc)
            return None
        self._cache = encoded
        self._tracer.step(
            "RegisterInAnnotation",
            ObjectRef(kind="Node", name=self._node),
            f"{ha.NODE_REGISTER}: {len(self._gpus)} GPU(s)",
            annotation=encoded,
        )
        return True


class HamiAllocator:
    """Allocate from the pod annotations HAMi's scheduler wrote (the requested IDs are
    opaque replicas); releases the node lock when the pod is done."""

    def __init__(
        self, core: client.CoreV1Api, node: str, tracer: Tracer, cluster: Cluster | None = None
    ) -> None:
        self._cluster = cluster or KubeCluster(core.api_client)
        self._node = node
        self._tracer = tracer
        # kubelet may call Allocate concurrently; the pending-pod protocol is node-global
        self._apply = threading.Lock()

    def pending_pod(self) -> Obj:
        """``GetPendingPod``: the pod the node lock names, else a waiting pod on the node.

        AllocationError when there is none; a lock that does not parse is an error too."""
        node = self._cluster.get_node(self._node)
        value = _annos(node).get(ha.NODE_LOCK)
        if value is not None:
            try:
                _, ns, name = ha.parse_node_lock(value)
            except ha.AnnotationError as exc:
                raise AllocationError(str(exc)) from exc
            if ns and name:
                return self._cluster.get_pod(ns, name)
        pod = waiting_pod(self._cluster.list_pods_on_node(self._node), self._node)
        if pod is None:
            raise AllocationError(f"no binding pod found on node {self._node}")
        return dict(pod)

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str] | None:
        """``GetPreferredAllocation``: the replicas of the GPUs HAMi assigned to the next
        container; None to let the plugin prefer by topology."""
        if must_include:
            return None
        try:
            pod = self.pending_pod()
            slots = ha.decode_pod_devices(_annos(pod).get(ha.DEVICES_TO_ALLOCATE, ""))
        except (AllocationError, ClusterError, ha.AnnotationError):
            return None
        pending = [c for c in slots if c]
        if not pending or len(pending[0]) < size:
            return None
        return align_replicas(pending[0][:size], [i for i in available if i in devices], devices)

    def allocate(
        self, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]:
        with self._apply:
            try:
                pod = self.pending_pod()
            except ClusterError as exc:
                raise AllocationError(str(exc)) from exc
            return self._allocate(pod, requests, devices)

    def _allocate(
        self, pod: Obj, requests: Sequence[Sequence[str]], devices: Mapping[str, Device]
    ) -> list[ContainerAllocation]:
        meta = pod["metadata"]
        ref = ObjectRef("Pod", meta["name"], meta["namespace"], meta.get("uid"))
        annos = _annos(pod)
        spec = pod.get("spec") or {}
        n_init, n_app = len(spec.get("initContainers") or []), len(spec.get("containers") or [])
        paths: dict[str, tuple[str, ...]] = {d.uuid: d.paths for d in devices.values()}
        result = []
        try:
            if ha.DEVICES_TO_ALLOCATE not in annos:
                raise AllocationError("device request not found")
            slots = ha.decode_pod_devices(annos[ha.DEVICES_TO_ALLOCATE])
            for ids in requests:
                _, ctr = pop_next(slots, n_init, n_app)
                if len(ctr) != len(ids):
                    raise AllocationError("device number not matched")
                result.append(hami_allocation(ctr, paths))
            self._cluster.patch_pod_annotations(
                meta["namespace"],
                meta["name"],
                {ha.DEVICES_TO_ALLOCATE: ha.encode_pod_devices(slots)},
            )
        except (AllocationError, ha.AnnotationError, ClusterError) as exc:
            self._finish(ref, ha.BIND_FAILED)
            raise AllocationError(f"pod {meta['namespace']}/{meta['name']}: {exc}") from exc
        self._tracer.step(
            "Allocate",
            ref,
            f"HAMi devices {', '.join(a.envs[VISIBLE_DEVICES_ENV] for a in result)}",
            envs=[a.envs for a in result],
        )
        self._try_success(ref)
        return result

    def _try_success(self, ref: ObjectRef) -> None:
        """``PodAllocationTrySuccess``: every container allocated → success + release."""
        assert ref.namespace
        try:
            pod = self._cluster.get_pod(ref.namespace, ref.name)
        except ClusterError as exc:
            _log.warning("Error getting pod %s: %s", ref, exc)
            return
        if ha.DEVICE_TYPE in _annos(pod).get(ha.DEVICES_TO_ALLOCATE, ""):
            return  # containers left: the lock stays until the last one
        self._finish(ref, ha.BIND_SUCCESS)

    def _finish(self, ref: ObjectRef, phase: str) -> None:
        """``updatePodAnnotationsAndReleaseLock``: the bind phase, then ReleaseNodeLock."""
        assert ref.namespace
        try:
            self._cluster.patch_pod_annotations(ref.namespace, ref.name, {ha.BIND_PHASE: phase})
        except ClusterError as exc:
            _log.warning("could not set %s on %s: %s", ha.BIND_PHASE, ref, exc)
        try:
            released = nodelock.release_node_lock(
                self._cluster, self._node, ref.namespace, ref.name
            )
        except ClusterError as exc:
            _log.warning("could not release %s on %s: %s", ha.NODE_LOCK, self._node, exc)
            return
        if released:
            self._tracer.step(
                "ReleaseNodeLock",
                ref,
                f"{ha.NODE_LOCK} on {self._node} released after Allocate ({ha.BIND_PHASE}={phase})",
                warning=phase == ha.BIND_FAILED,
                node=self._node,
            )
