"""HAMi mode of the device plugin: its devices, node registration, Allocate from the pod's
annotations, and releasing the node lock once the pod is allocated.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/device-plugin/nvidiadevice/nvinternal/``:
- ``plugin/server.go`` ``readFromConfigFile`` (this node's entry of ``config.json``:
  ``operatingmode``, ``devicesplitcount``, ``enablenumatopology``,
  ``enablegetpreferredallocation``, over the device config's node defaults) and
  ``rm/devices.go`` ``GetPluginDevices``: each GPU advertised to kubelet as
  ``deviceSplitCount`` IDs ``<uuid>-<n>`` (not NVIDIA's time-slicing replicas
  ``<uuid>::<n>``), with the GPU's NUMA node only when ``enableNumaTopology`` is on; an Xid
  marks the GPU, so all its IDs go Unhealthy together. HAMi's plugin writes no GFD labels;
- ``plugin/register.go``: ``getAPIDevices`` (one ``DeviceInfo`` per GPU, mode ``hami-core``,
  or ``mig`` with its ``migProfiles``),
  ``RegisterInAnnotation`` (patches ``hami.io/node-nvidia-register`` only when the encoded
  list changed, plus ``hami.io/node-nvidia-score`` when ``ENABLE_TOPOLOGY_SCORE=true``) and
  ``WatchAndRegister`` (every 30 s, 5 s after an error). v2.10 writes no handshake: the
  scheduler judges health from ``nvidia.com/gpu`` allocatable;
- ``plugin/server.go`` ``Allocate`` / ``GetPreferredAllocation``
  (``selectPreferredDeviceIDsFromAnnotatedDevices``: must-include IDs count against the GPUs
  HAMi assigned, one free ID of each other GPU; no answer for a container it cannot serve),
  ``alignContainerDevicesWithAllocatedIDs`` (only with ``enablegetpreferredallocation``)
  and ``plugin/util.go`` (``GetPendingPod`` via ``GetAllocatePodByNode`` — the pod named
  by the node lock first —, ``popNextContainerDevices``, ``patchErasedAnnotation``,
  ``PodAllocationTrySuccess``, ``PodAllocationFailed``): the devices a container gets are
  the next non-empty slot of ``hami.io/vgpu-devices-to-allocate`` (init containers first);
  when no slot is left the pod is marked ``hami.io/bind-phase: success`` and
  ``hami.io/mutex.lock`` is released (``nodelock.ReleaseNodeLock``, shared with the
  extender); a failure marks it ``failed`` and releases the lock too.

Differences, named: a health change re-registers at once (upstream waits for its next 30 s
pass); the pair scores come from the NUMA node and NVLink peers the plugin already read
through NVML (what ``GetTopologyCommonAncestor`` / NVLink remote PCI info give on the shim)
instead of querying NVML again; the fallback pod search also accepts a pod kwok already
marked Running (kubelet would still hold it Pending); the HAMi-core library mounts and cache
envs are not set (the lab has no libvgpu.so: the NVML shim applies HAMi-core's NVML hook to
a process with HAMi's envs); a ``config.json`` that does not parse, or an operating mode
other than ``hami-core``/``mig``, stops start-up (upstream logs it and runs with an empty
mode).

MIG mode (``operatingmode: mig``) is in :mod:`gpulab.deviceplugin.hamimig` (the NVML part)
and here (``MigContext``, ``MigReconciler``, ``HamiAllocator._mig_devices``: Allocate
creates the instance Filter reserved in ``hami.io/vgpu-mig-allocations`` and answers with
its MIG UUID; ``server.go`` ``annotateMigRuntimeInfo``, ``primeMigManagerFromAnnotations``,
``runMigAnnotationReconciler``; ``util.go`` ``GetContainerDeviceStrArray``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client

from gpulab.deviceplugin.allocate import (
    CONTROL_DEVICES,
    VISIBLE_DEVICES_ENV,
    AllocationError,
    ContainerAllocation,
    DeviceSpec,
)
from gpulab.deviceplugin.hamimig import (
    RECONCILE_SECONDS,
    MigInstanceManager,
    active_keys,
    key_of,
)
from gpulab.deviceplugin.rm import GPU_RESOURCE, Device, GPUInfo, ResourceSpec, base_id
from gpulab.hami import annotations as ha
from gpulab.hami import nodelock
from gpulab.hami.cluster import Cluster, ClusterError, KubeCluster
from gpulab.hami.config import ConfigError, MigAllowlist, NvidiaConfig
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

REGISTER_INTERVAL = 30.0
ERROR_INTERVAL = 5.0
NODE_CONFIG_FILE = "/config/config.json"  # upstream's ConfigFilePath (the lab takes a flag)
TOPOLOGY_ENV = "ENABLE_TOPOLOGY_SCORE"
# links.go / calculate_score.go: NVML_TOPOLOGY_NODE (same CPU) 20, SYSTEM (cross CPU) 10,
# one NVLink 100.
SAME_CPU, CROSS_CPU, NVLINK = 20, 10, 100

Obj = dict[str, Any]


# ---------------------------------------------------------------- pure


@dataclass(frozen=True)
class NodeConfig:
    """What HAMi's plugin runs with on this node (``readFromConfigFile``): the device
    config's node defaults, overridden by this node's entry of ``config.json``."""

    operating_mode: str = ha.MODE_HAMI_CORE
    device_split_count: int = ha.DEFAULT_SPLIT_COUNT
    enable_numa_topology: bool = False
    enable_get_preferred_allocation: bool = False
    mig_profile_allowlist: tuple[MigAllowlist, ...] = ()


_NODE_KEYS = {  # config.json key → NodeConfig field (mergo.WithOverride: a key given wins)
    "operatingmode": "operating_mode",
    "devicesplitcount": "device_split_count",
    "enablenumatopology": "enable_numa_topology",
    "enablegetpreferredallocation": "enable_get_preferred_allocation",
}


def node_config(device: NvidiaConfig, text: str, node: str, source: str) -> NodeConfig:
    """``LoadNvidiaDevicePluginConfig``: the device config, then ``node``'s entry of the
    device plugin's ``config.json`` (``{"nodeconfig": [{"name": ..., ...}]}``)."""
    config = NodeConfig(
        device_split_count=device.device_split_count,
        enable_numa_topology=device.enable_numa_topology,
        mig_profile_allowlist=device.mig_profile_allowlist,
    )
    try:
        entries = json.loads(text).get("nodeconfig") or []
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ConfigError(f"{source}: not a JSON object with a nodeconfig list ({exc})") from exc
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("name") != node:
            continue
        given = {f: entry[k] for k, f in _NODE_KEYS.items() if entry.get(k) not in (None, "")}
        config = replace(config, **given)
    if config.operating_mode not in (ha.MODE_HAMI_CORE, ha.MODE_MIG):
        raise ConfigError(
            f"{source}: node {node}: operatingmode {config.operating_mode!r} is not simulated "
            f"(use {ha.MODE_HAMI_CORE} or {ha.MODE_MIG}; mps needs an MPS daemon)"
        )
    if config.device_split_count < 1:
        raise ConfigError(f"{source}: node {node}: devicesplitcount must be at least 1")
    return config


def plugin_devices(
    gpus: Sequence[GPUInfo], split_count: int, numa_topology: bool
) -> tuple[Device, ...]:
    """``GetPluginDevices``: ``split_count`` IDs ``<uuid>-<n>`` per GPU, kubelet's units of
    the GPU; the NUMA node only with ``enableNumaTopology`` (default off)."""
    return tuple(
        Device(
            f"{g.uuid}-{n}",
            g.uuid,
            g.index,
            (f"/dev/nvidia{g.minor}",),
            g.numa_node if numa_topology else None,
            replica=n,
            index=str(g.index),
        )
        for g in gpus
        for n in range(split_count)
    )


def plugin_resource(gpus: Sequence[GPUInfo], config: NodeConfig) -> ResourceSpec:
    """The one resource HAMi's plugin serves: ``nvidia.com/gpu`` of every GPU's IDs."""
    devices = plugin_devices(gpus, config.device_split_count, config.enable_numa_topology)
    return ResourceSpec(GPU_RESOURCE, devices)


def physical_device_id(device_id: str) -> str:
    """``physicalDeviceID``: the GPU behind ``<uuid>::<n>`` or ``<uuid>-<n>`` (a GPU UUID
    has 5 dashes, a HAMi ID one more, ending in a number)."""
    if "::" in device_id:
        return base_id(device_id)
    head, dash, tail = device_id.rpartition("-")
    if device_id.count("-") == 6 and dash and tail.isdigit():
        return head
    return device_id


def node_devices(
    gpus: Sequence[GPUInfo],
    healthy: Callable[[str], bool],
    split_count: int,
    mig_profiles: Mapping[str, tuple[ha.MigProfile, ...]] | None = None,
) -> list[ha.NodeDevice]:
    """What ``getAPIDevices`` registers for each GPU (memory and core scaling = 1). With
    ``mig_profiles`` (MIG mode: each GPU's discovered profiles) the GPUs are mode ``mig``,
    count the most instances any profile allows, and a GPU without profiles is left out."""
    out = []
    for g in gpus:
        profiles = (mig_profiles or {}).get(g.uuid, ())
        if mig_profiles is not None and not profiles:
            _log.info("skip MIG device with no discovered profile capacity: %s", g.uuid)
            continue
        out.append(
            ha.NodeDevice(
                id=g.uuid,
                index=g.index,
                count=max(p.instance_count for p in profiles) if profiles else split_count,
                devmem=g.memory_mib,
                devcore=ha.DEFAULT_DEVCORE,
                type=ha.device_type(g.name),
                numa=g.numa_node if g.numa_node is not None else 0,
                health=healthy(g.uuid),
                mode=ha.MODE_HAMI_CORE if mig_profiles is None else ha.MODE_MIG,
                mig_profiles=profiles,
            )
        )
    return out


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


def select_preferred(
    available: Sequence[str],
    required: Sequence[str],
    desired: Sequence[ha.ContainerDevice],
    size: int,
) -> list[str]:
    """``selectPreferredDeviceIDsFromAnnotatedDevices``: the must-include IDs, then one
    available ID of each GPU HAMi assigned that they do not already stand for, so kubelet's
    accounting matches HAMi's. AllocationError when they cannot cover it."""
    if len(desired) < size:
        raise AllocationError(
            f"annotated devices {len(desired)} smaller than requested allocation size {size}"
        )
    selected = list(required)
    required_by_gpu = Counter(physical_device_id(i) for i in required)
    free: dict[str, list[str]] = {}
    for device_id in available:
        if device_id not in required:
            free.setdefault(physical_device_id(device_id), []).append(device_id)
    for dev in desired[:size]:
        gpu = physical_device_id(dev.uuid)
        if required_by_gpu[gpu] > 0:
            required_by_gpu[gpu] -= 1
            continue
        if not free.get(gpu):
            raise AllocationError(f"no available slice device found for annotated GPU {gpu}")
        selected.append(free[gpu].pop(0))
    if len(selected) != size:
        raise AllocationError(f"preferred allocation selected {len(selected)} devices, want {size}")
    return selected


def align_devices(
    ctr: Sequence[ha.ContainerDevice], ids: Sequence[str]
) -> list[ha.ContainerDevice]:
    """``alignContainerDevicesWithAllocatedIDs``: the GPUs behind the IDs kubelet chose
    replace the annotation's, share by share."""
    if len(ctr) != len(ids):
        raise AllocationError("device number not matched")
    return [replace(d, uuid=physical_device_id(i)) for d, i in zip(ctr, ids, strict=True)]


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


def mig_allocation(
    uuids: Sequence[str],
    ctr: Sequence[ha.ContainerDevice],
    paths_by_uuid: Mapping[str, Sequence[str]],
) -> ContainerAllocation:
    """A MIG-mode container's response (``getAllocateResponse`` over the MIG UUIDs): its
    MIG devices visible, and no hami-core limits (HAMi mounts no libvgpu.so in MIG mode)."""
    paths = list(dict.fromkeys(p for d in ctr for p in paths_by_uuid.get(d.uuid, ())))
    specs = tuple(DeviceSpec(p, p) for p in [*paths, *CONTROL_DEVICES])
    return ContainerAllocation({VISIBLE_DEVICES_ENV: ",".join(uuids)}, specs)


@dataclass(frozen=True)
class MigContext:
    """What MIG mode's Allocate needs besides the annotations: the node's MIG instance
    manager and each GPU's NVML index (``gpuUUIDToIndex``)."""

    manager: MigInstanceManager
    gpu_index: Mapping[str, int]

    def reconcile(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """``reconcileActiveMigAllocations``: destroy what no live pod on the node holds."""
        self.manager.reconcile(active_keys(pods, self.gpu_index))

    def start(self, pods: Sequence[Mapping[str, Any]] | None, supported: bool) -> list[int]:
        """The MIG part of the plugin's ``Start``: on MIG-capable nodes (``supported``),
        reset the GPUs no live pod holds (all are held when the pods could not be listed:
        ``pods`` None), then adopt the instances the live pods' annotations name. The GPUs
        reset, in order."""
        if not supported:
            return []
        try:
            held = {k[0] for k in active_keys(pods, self.gpu_index)} if pods is not None else None
        except AllocationError as exc:
            _log.info("mig init: allocation detection failed; preserving all GPUs: %s", exc)
            held = None
        reset = self.manager.reset_idle_gpus(
            len(self.gpu_index), set(self.gpu_index.values()) if held is None else held
        )
        for pod in pods or []:
            self._adopt(pod)
        return reset

    def _adopt(self, pod: Mapping[str, Any]) -> None:
        """``primeMigManagerFromAnnotations`` for one pod (failures only logged)."""
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        try:
            for a in ha.decode_mig_allocations(_annos(pod).get(ha.MIG_ALLOCATIONS, "")):
                if not a.runtime_ready:
                    raise AllocationError("MIG allocation lacks runtime identity")
                self.manager.adopt(self.gpu_index[a.gpu_uuid], a)
        except (AllocationError, ha.AnnotationError, KeyError) as exc:
            name = f"{meta.get('namespace')}/{meta.get('name')}"
            _log.info("mig init: failed to adopt active MIG allocations of %s: %s", name, exc)


class MigReconciler(threading.Thread):
    """``runMigAnnotationReconciler``: every 5 s, the instances of pods that finished or
    went away are destroyed (an API or annotation error leaves them all in place)."""

    def __init__(self, context: MigContext, cluster: Cluster, node: str) -> None:
        super().__init__(name="hami-mig-reconcile", daemon=True)
        self._context, self._cluster, self._node = context, cluster, node
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(RECONCILE_SECONDS):
            try:
                self._context.reconcile(self._cluster.list_pods_on_node(self._node))
            except (AllocationError, ClusterError) as exc:
                _log.info("periodic MIG reconciliation skipped: %s", exc)


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
        mig_profiles: Mapping[str, tuple[ha.MigProfile, ...]] | None = None,
    ) -> None:
        super().__init__(name="hami-register", daemon=True)
        self._cluster = cluster or KubeCluster(api)
        self._node = node
        self._gpus = gpus
        self._healthy = healthy
        self._split = split_count
        self._mig_profiles = mig_profiles
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
        devices = node_devices(self._gpus, self._healthy, self._split, self._mig_profiles)
        encoded = ha.encode_node_devices(devices)
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
            f"{ha.NODE_REGISTER}: {len(devices)} GPU(s)"
            + (
                f", MIG mode ({len(self._mig_profiles)} with profiles)"
                if self._mig_profiles
                else ""
            ),
            annotation=encoded,
        )
        return True


class HamiAllocator:
    """Allocate from the pod annotations HAMi's scheduler wrote (the requested IDs are
    kubelet's units of the GPUs); releases the node lock when the pod is done."""

    traces_allocate = True  # its Allocate step names the pod and the envs it got

    def __init__(
        self,
        core: client.CoreV1Api,
        node: str,
        tracer: Tracer,
        config: NodeConfig | None = None,
        cluster: Cluster | None = None,
        mig: MigContext | None = None,
    ) -> None:
        self._cluster = cluster or KubeCluster(core.api_client)
        self._node = node
        self._tracer = tracer
        self._config = config or NodeConfig()
        self._mig = mig  # operating mode mig
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
        index: int,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        devices: Mapping[str, Device],
    ) -> list[str] | None:
        """``GetPreferredAllocation`` for container request ``index``: the IDs of the GPUs
        HAMi assigned to the pending pod's ``index``-th waiting container; None (no answer
        for it) when there is no such pod or slot, or they cannot be covered."""
        try:
            pod = self.pending_pod()
            slots = ha.decode_pod_devices(_annos(pod).get(ha.DEVICES_TO_ALLOCATE, ""))
        except (AllocationError, ClusterError, ha.AnnotationError):
            return None
        pending = [c for c in slots if c]
        if index >= len(pending):
            return None
        try:
            return select_preferred(available, must_include, pending[index], size)
        except AllocationError as exc:
            _log.warning("err: %s", exc)
            return None

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
                index, ctr = pop_next(slots, n_init, n_app)
                if len(ctr) != len(ids):
                    raise AllocationError("device number not matched")
                if self._mig is not None:
                    uuids = self._mig_devices(self._mig, pod, index, ctr)
                    self._annotate_mig_runtime(self._mig, pod)
                    result.append(mig_allocation(uuids, ctr, paths))
                    continue
                if self._config.enable_get_preferred_allocation:
                    ctr = align_devices(ctr, ids)
                result.append(hami_allocation(ctr, paths))
            self._cluster.patch_pod_annotations(
                meta["namespace"],
                meta["name"],
                {ha.DEVICES_TO_ALLOCATE: ha.encode_pod_devices(slots)},
            )
        except (AllocationError, ha.AnnotationError, ClusterError) as exc:
            self._finish(ref, ha.BIND_FAILED)
            raise AllocationError(f"pod {meta['namespace']}/{meta['name']}: {exc}") from exc
        # per container: what HAMi-core reads (the device, its memory and SM limits)
        shown = "; ".join(
            ", ".join(
                f"{k}={v}"
                for k, v in sorted(a.envs.items())
                if k == VISIBLE_DEVICES_ENV or k.startswith("CUDA_")
            )
            for a in result
        )
        self._tracer.step("Allocate", ref, f"HAMi devices: {shown}", envs=[a.envs for a in result])
        self._try_success(ref)
        return result

    def _mig_devices(
        self, mig: MigContext, pod: Obj, index: int, ctr: Sequence[ha.ContainerDevice]
    ) -> list[str]:
        """``GetContainerDeviceStrArray`` in MIG mode: container ``index``'s reservations
        (by device index), the node reconciled first, each created where it was reserved;
        the ones this call created are destroyed again if a later one fails."""
        reserved = ha.decode_mig_allocations(_annos(pod).get(ha.MIG_ALLOCATIONS, ""))
        mine = sorted((a for a in reserved if a.container_index == index),
                      key=lambda a: a.device_index)  # fmt: skip
        if len(mine) != len(ctr):
            raise AllocationError(
                f"container {index} has {len(mine)} MIG reservations, requested {len(ctr)} devices"
            )
        try:
            mig.reconcile(self._cluster.list_pods_on_node(self._node))
        except (AllocationError, ClusterError) as exc:
            raise AllocationError(f"reconcile MIG allocations before allocation: {exc}") from exc
        created: list[str] = []
        try:
            uuids = []
            for reservation, share in zip(mine, ctr, strict=True):
                if reservation.gpu_uuid != share.uuid:
                    raise AllocationError(
                        f"MIG reservation GPU {reservation.gpu_uuid} does not match "
                        f"allocated GPU {share.uuid}"
                    )
                if share.uuid not in mig.gpu_index:
                    raise AllocationError(f"resolve parent GPU {share.uuid}")
                uuid, made = mig.manager.ensure_allocation(
                    key_of(mig.gpu_index[share.uuid], reservation)
                )
                if made:
                    created.append(uuid)
                uuids.append(uuid)
        except AllocationError:
            for uuid in reversed(created):
                mig.manager.release(uuid)
            raise
        return uuids

    def _annotate_mig_runtime(self, mig: MigContext, pod: Obj) -> None:
        """``annotateMigRuntimeInfo``: each realised reservation gets its MIG UUID and GPU
        and compute instance IDs in ``hami.io/vgpu-mig-allocations``."""
        meta = pod["metadata"]
        reserved = ha.decode_mig_allocations(_annos(pod).get(ha.MIG_ALLOCATIONS, ""))
        updated, done = [], False
        for a in reserved:
            live = mig.manager.runtime_info(key_of(mig.gpu_index.get(a.gpu_uuid, -1), a))
            if live is not None:
                a = replace(a, mig_uuid=live.mig_uuid, gpu_instance_id=live.gi_id,
                            compute_instance_id=live.ci_id)  # fmt: skip
                done = True
            updated.append(a)
        if not done:
            raise AllocationError("no realised MIG allocation found for pod")
        value = ha.dump_mig_allocations(updated)
        self._cluster.patch_pod_annotations(
            meta["namespace"], meta["name"], {ha.MIG_ALLOCATIONS: value}
        )
        meta.setdefault("annotations", {})[ha.MIG_ALLOCATIONS] = value

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
