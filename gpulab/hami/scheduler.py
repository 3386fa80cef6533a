"""The Scheduler: caches fed by informers, and node registration from annotations.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/scheduler/scheduler.go``: ``NewScheduler``,
``Start`` (informer handlers ``onAddPod`` / ``onUpdatePod`` / ``onDelPod``, node add →
``doNodeNotify``, ``onDelNode``, ResourceQuota handlers), ``RegisterFromNodeAnnotations``
(on node add/delete and a 15 s ticker — not on every node update) and ``register``, plus
the NVIDIA ``CheckHealth`` of ``pkg/device/nvidia/device.go`` with ``device.CheckHealth``.
Filter lives in ``filter.py`` and Bind in ``bind.py``, each top-down in one module; they
use the state kept here.

Health, as v2.10: the device plugin no longer answers the handshake. A node is healthy while
its ``nvidia.com/gpu`` allocatable (kept by kubelet from the plugin's ListAndWatch) is above
zero; when it drops to zero the node's cards are cleaned up (``NodeCleanUp`` removes the
handshake annotation). The scheduler still stamps ``hami.io/node-handshake:
Requesting_<time>`` and, with no allocatable, treats a stamp older than 60 s as dead.
A node re-registers when its allocatable count or its register annotation changed.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpulab.hami import annotations as ann
from gpulab.hami.cluster import Cluster, ClusterError, Listers
from gpulab.hami.config import SCHEDULER_NAME, NvidiaConfig
from gpulab.hami.device import as_int64, container_lists
from gpulab.hami.events import SchedulerEvents
from gpulab.hami.nodelock import DEFAULT_RETRY_TIMEOUT, DEFAULT_TIMEOUT, MUTEXES
from gpulab.hami.nodes import NodeManager
from gpulab.hami.pods import PodInfo, PodManager, app_only_usage, collapse_init_usage
from gpulab.hami.quota import QuotaManager
from gpulab.hami.score import BINPACK, SPREAD, CardUsage, NodeExtras
from gpulab.informer import Handlers
from gpulab.trace import ObjectRef

_log = logging.getLogger(__name__)

REGISTER_PERIOD = 15.0
WRITERS = 16  # --gpulab-async-filter-patch: annotation writes in flight at once
HANDSHAKE_TIMEOUT = dt.timedelta(seconds=60)


@dataclass(frozen=True)
class SchedulerConfig:
    """The flags of ``cmd/scheduler/main.go`` that the scheduler reads."""

    scheduler_name: str = SCHEDULER_NAME
    nvidia: NvidiaConfig = field(default_factory=NvidiaConfig)
    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    node_lock_timeout: dt.timedelta = DEFAULT_TIMEOUT
    node_lock_retry_timeout: dt.timedelta = DEFAULT_RETRY_TIMEOUT
    node_label_selector: tuple[tuple[str, str], ...] = ()
    # Lab experiments (bench), off by default (the release's behaviour):
    # --gpulab-lock-retry-all: every pod waits for a contended node lock, not only PodGroup
    # members; --gpulab-async-filter-patch: Filter answers before the pod's annotations are
    # written, and Bind waits for that write.
    lock_retry_all: bool = False
    async_filter_patch: bool = False


# -- pure helpers ---------------------------------------------------------------------------


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    a = meta(obj).get("annotations")
    return dict(a) if isinstance(a, Mapping) else {}


def pod_ref(pod: Mapping[str, Any]) -> ObjectRef:
    m = meta(pod)
    return ObjectRef(
        "Pod", str(m.get("name", "")), str(m.get("namespace") or "default"), m.get("uid")
    )


def terminated(pod: Mapping[str, Any]) -> bool:
    """``IsPodInTerminatedState``."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def terminating(pod: Mapping[str, Any]) -> bool:
    """``IsPodTerminating``."""
    return bool(meta(pod).get("deletionTimestamp"))


def all_init_succeeded(pod: Mapping[str, Any]) -> bool:
    """``AllInitContainersSucceeded``."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    if not statuses:
        return False
    for s in statuses:
        term = (s.get("state") or {}).get("terminated")
        if not term or term.get("exitCode") != 0:
            return False
    return True


def allocatable(node: Mapping[str, Any], resource: str) -> int:
    """``node.Status.Allocatable[resource].Value()`` (0 when absent or unreadable)."""
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if raw is None:
        return 0
    try:
        return as_int64(raw) or 0
    except ValueError:
        return 0


@dataclass(frozen=True)
class Reported:
    """``ReportedGPUNum`` / ``ReportedRegisterAnnos`` of one node."""

    gpus: int = 0
    register: str = ""


def handshake_health(
    handshake: str, gpus: int, now_local: dt.datetime
) -> tuple[bool, bool, str | None]:
    """``device.CheckHealth``: (healthy, needs update, handshake value to write or None)."""
    requesting, since = ann.requesting_since(handshake)
    if requesting:
        if since is None or now_local < since + HANDSHAKE_TIMEOUT:
            return True, False, None
        return gpus > 0, False, None
    return True, True, ann.handshake_requesting(now_local)


def check_health(
    node: Mapping[str, Any], reported: Reported, resource: str, now_local: dt.datetime
) -> tuple[bool, bool, Reported, str | None]:
    """NVIDIA ``CheckHealth``: (healthy, needs update, new Reported, handshake to write)."""
    annos = annotations_of(node)
    current = allocatable(node, resource)
    healthy, changed, stamp = handshake_health(
        annos.get(ann.NODE_HANDSHAKE, ""), current, now_local
    )
    register = annos.get(ann.NODE_REGISTER, "")
    if current == 0:
        if reported.gpus == 0:
            return healthy, changed, reported, stamp
        return False, changed, Reported(0, register), stamp
    if reported.gpus != current:
        return True, True, Reported(current, register), stamp
    if reported.register != register:
        return healthy, True, Reported(current, register), stamp
    return healthy, changed, reported, stamp


def node_devices(node: Mapping[str, Any]) -> tuple[list[ann.NodeDevice], NodeExtras]:
    """``GetNodeDevices``: the registered cards plus cordon and pair scores.

    AnnotationError when the node has no (or an unreadable, or an empty) registration."""
    annos = annotations_of(node)
    encoded = annos.get(ann.NODE_REGISTER)
    if encoded is None:
        raise ann.AnnotationError(f"annos not found {ann.NODE_REGISTER}")
    devices = ann.decode_node_devices(encoded)
    if not devices:
        raise ann.AnnotationError("no gpu found on node")
    pairs = (
        ann.decode_pair_scores(annos[ann.NODE_PAIR_SCORE]) if ann.NODE_PAIR_SCORE in annos else {}
    )
    cordon = annos.get(ann.DEVICE_CORDON, "")
    cordoned = frozenset(u.strip() for u in cordon.split(",") if u.strip())
    return devices, NodeExtras(cordoned=cordoned, pair_scores=pairs)


def selected(node: Mapping[str, Any], selector: tuple[tuple[str, str], ...]) -> bool:
    labels = meta(node).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector)


# -- the scheduler --------------------------------------------------------------------------


class Scheduler:
    def __init__(
        self,
        cluster: Cluster,
        cfg: SchedulerConfig,
        events: SchedulerEvents | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.cluster = cluster
        self.cfg = cfg
        self.events = events or SchedulerEvents(None)
        self.clock = clock
        # One lock over pods, nodes and quotas: Filter reads usage and reserves under it,
        # so two Filters never hand out the same memory.
        self.lock = threading.RLock()
        self.pods = PodManager()
        self.nodes = NodeManager()
        self.quotas = QuotaManager(cfg.nvidia)
        self.listers: Listers | None = None
        self.reported: dict[str, Reported] = {}
        self.synced = threading.Event()  # s.synced: set after a register pass
        self.node_notify = threading.Event()
        self.stop = threading.Event()
        # --gpulab-async-filter-patch: the annotation writes Filter left running, by pod UID
        self.pending: dict[str, Future[None]] = {}
        self._writer: ThreadPoolExecutor | None = None
        self.pod_handlers = Handlers(self.on_add_pod, self.on_update_pod, self.on_delete_pod)
        self.node_handlers = Handlers(on_add=self.on_add_node, on_delete=self.on_delete_node)
        self.quota_handlers = Handlers(
            on_add=self._locked(self.quotas.add_quota),
            on_update=self._locked(self.quotas.update_quota),
            on_delete=self._locked(self.quotas.del_quota),
        )

    def _locked(self, fn: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            with self.lock:
                fn(*args)

        return call

    def attach(self, listers: Listers) -> None:
        """The informers have synced (``atomic.StoreUint32(&s.started, 1)``)."""
        self.listers = listers
        self.node_notify.set()

    # -- pod cache (onAddPod / onUpdatePod / onDelPod) ---------------------------------

    def _give(self, info: PodInfo, sign: int) -> None:
        """Charge (+1) or credit (-1) a pod's shares to its node and namespace quota."""
        self.nodes.charge(info.node, info.shares, sign, info.mig)
        self.quotas.add_usage(info.namespace, info.shares, sign)

    def take_pod(self, uid: str) -> PodInfo | None:
        """``TakeAndDeletePod`` + ``RmUsage``; caller holds the lock."""
        info = self.pods.take(uid)
        if info is not None:
            self._give(info, -1)
        return info

    def add_pod(self, info: PodInfo) -> None:
        """``AddPod`` + ``AddUsage``; caller holds the lock."""
        old = self.pods.add(info)
        if old is not None:
            self._give(old, -1)
        self._give(info, +1)

    def on_add_pod(self, pod: dict[str, Any]) -> None:
        annos = annotations_of(pod)
        node = annos.get(ann.ASSIGNED_NODE)
        if node is None:
            return
        uid = str(meta(pod).get("uid", ""))
        if terminated(pod):
            with self.lock:
                self.take_pod(uid)
            return
        if terminating(pod):
            with self.lock:
                info = self.pods.get(uid)
                if info is not None:
                    info.pod = pod
            return
        try:
            devices = ann.decode_pod_devices(annos.get(ann.DEVICES_ALLOCATED, ""))
            n_init = len(container_lists(pod)[0])
            mig = ann.decode_mig_allocations(annos.get(ann.MIG_ALLOCATIONS, ""))
        except ValueError as exc:
            _log.warning("failed to decode pod devices of %s: %s", pod_ref(pod), exc)
            return
        m = meta(pod)
        info = PodInfo(
            uid,
            str(m.get("namespace", "default")),
            str(m.get("name", "")),
            node,
            collapse_init_usage(devices, n_init),
            pod=pod,
            mig=mig,
        )
        with self.lock:
            self.add_pod(info)

    def on_update_pod(self, _old: dict[str, Any], pod: dict[str, Any]) -> None:
        annos = annotations_of(pod)
        if ann.ASSIGNED_NODE not in annos:
            return
        uid = str(meta(pod).get("uid", ""))
        if terminated(pod):
            with self.lock:
                self.take_pod(uid)
            return
        with self.lock:
            info = self.pods.get(uid)
            if info is None:
                if not terminating(pod):
                    self.on_add_pod(pod)
                return
            info.pod = pod
            if terminating(pod) or info.init_released or not all_init_succeeded(pod):
                return
            try:
                devices = ann.decode_pod_devices(annos.get(ann.DEVICES_ALLOCATED, ""))
                n_init = len(container_lists(pod)[0])
            except ValueError as exc:
                _log.warning("failed to decode pod devices of %s: %s", pod_ref(pod), exc)
                return
            # init containers done: the pod shrinks to its app containers' use
            self._give(info, -1)
            info.shares, info.init_released = app_only_usage(devices, n_init), True
            self._give(info, +1)

    def on_delete_pod(self, pod: dict[str, Any]) -> None:
        if ann.ASSIGNED_NODE not in annotations_of(pod):
            return
        with self.lock:
            self.take_pod(str(meta(pod).get("uid", "")))

    # -- nodes -------------------------------------------------------------------------

    def on_add_node(self, _node: dict[str, Any]) -> None:
        self.node_notify.set()

    def on_delete_node(self, node: dict[str, Any]) -> None:
        """``onDelNode``: forget its lock mutex, its cards and its health bookkeeping."""
        name = str(meta(node).get("name", ""))
        MUTEXES.forget(name)
        with self.lock:
            self.nodes.remove(name)
            self.reported.pop(name, None)
        self.node_notify.set()

    def run_register_loop(self, stop: threading.Event, period: float = REGISTER_PERIOD) -> None:
        """``RegisterFromNodeAnnotations``: a pass on each node notification and every
        ``period`` seconds (a ticker, not reset by notifications) until ``stop``."""
        tick = time.monotonic() + period
        while not stop.is_set():
            self.node_notify.wait(timeout=max(0.0, tick - time.monotonic()))
            if stop.is_set():
                return
            if time.monotonic() >= tick:
                tick += period
            self.node_notify.clear()
            if self.listers is None:
                continue  # "Scheduler not started yet"
            try:
                self.register()
            except Exception:  # the loop must outlive one bad pass
                _log.exception("node registration pass failed")

    def register(self, now_local: dt.datetime | None = None) -> None:
        """``register``: check every node's health and (re)register the changed ones."""
        assert self.listers is not None
        now = now_local or dt.datetime.now()
        resource = self.cfg.nvidia.resource_count_name
        for node in self.listers.nodes():
            if not selected(node, self.cfg.node_label_selector):
                continue
            name = str(meta(node).get("name", ""))
            try:
                devices, extras = node_devices(node)
                error = None
            except ann.AnnotationError as exc:
                devices, extras, error = [], NodeExtras(), exc
            with self.lock:
                before = self.reported.get(name, Reported())
            healthy, update, after, stamp = check_health(node, before, resource, now)
            with self.lock:
                self.reported[name] = after
            if stamp is not None:
                self._patch_node(name, {ann.NODE_HANDSHAKE: stamp})
            if not healthy:
                self._clean_up(name)
                continue
            if error is not None:
                _log.debug("node %s: %s", name, error)
                continue
            if not update:
                continue
            with self.lock:
                changed = self.nodes.add(name, devices, extras, list(self.pods.on_node(name)))
            if changed:
                self.events.step(
                    "RegisterFromNodeAnnotations",
                    ObjectRef("Node", name),
                    f"{len(devices)} GPUs registered on {name}: "
                    + ", ".join(f"{d.id} {d.devmem}MiB x{d.count}" for d in devices[:4])
                    + (" ..." if len(devices) > 4 else ""),
                )
        self.synced.set()

    def _clean_up(self, name: str) -> None:
        """``NodeCleanUp`` + ``rmNodeDevices`` for a node whose GPUs are gone."""
        with self.lock:
            if self.nodes.get(name) is None:
                return
            self.nodes.remove(name)
            self.reported.pop(name, None)
        self._patch_node(name, {ann.NODE_HANDSHAKE: None})
        self.events.step(
            "NodeCleanUp",
            ObjectRef("Node", name),
            f"{name} reports no {self.cfg.nvidia.resource_count_name}: its GPUs are no longer "
            "scheduled",
            warning=True,
        )

    def _patch_node(self, name: str, annos: dict[str, str | None]) -> None:
        try:
            self.cluster.patch_node_annotations(name, annos)
        except ClusterError as exc:
            _log.warning("could not patch node %s: %s", name, exc)

    def write_later(self, uid: str, write: Callable[[], None]) -> Future[None]:
        """Run ``write`` on the writer pool after this pod's previous write (experiment)."""
        with self.lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(
                    max_workers=WRITERS, thread_name_prefix="filter-patch"
                )
            before = self.pending.get(uid)

            def ordered() -> None:
                if before is not None:
                    before.exception()  # this pod's writes land in order
                write()

            future = self._writer.submit(ordered)
            self.pending[uid] = future
            return future

    # -- views -------------------------------------------------------------------------

    def usage(self) -> dict[str, list[CardUsage]]:
        """Every registered node's cards with their current usage (copies)."""
        with self.lock:
            return {e.name: [c.copy() for c in e.cards] for e in self.nodes.entries()}

    def pod_infos(self) -> list[PodInfo]:
        with self.lock:
            return self.pods.all()
