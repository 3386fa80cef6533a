"""The Scheduler: node device registry, pod usage cache, Filter and Bind.

Mirrors HAMi ``pkg/scheduler/scheduler.go`` (``Scheduler``, ``onAddPod``/``onDelPod``,
``RegisterFromNodeAnnotations``, ``getNodesUsage``, ``Filter``, ``Bind``) and
``pkg/util.CheckHealth``. The decisions come from ``score.py``; the API calls go through a
``Cluster`` (real or in-memory) so everything here runs in tests without a cluster.

Informer callbacks (``on_*``) keep the caches; ``register_from_node_annotations`` turns node
annotations into the device registry (with the handshake); ``filter`` picks exactly one
node and reserves its cards at once, as HAMi does; ``bind`` takes the node lock, writes the
allocation annotations and creates the Binding.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulab.hami import annotations as ann
from gpulab.hami import device, nodelock, score
from gpulab.hami.annotations import ContainerDevice, NodeDevice
from gpulab.hami.cluster import Cluster, ClusterError
from gpulab.hami.device import Defaults, RequestError
from gpulab.hami.score import DeviceUsage, NodeResult
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger(__name__)

FILTER_RESULT = "gpulab.io/filter-result"
# Filter stamps its decision time here (HAMi util.AssignedTimeAnnotations).
ASSIGNED_TIME = "hami.io/vgpu-time"
HANDSHAKE_TIMEOUT = dt.timedelta(seconds=60)
REGISTER_PERIOD = 15.0
# Another pod's fresh node lock usually goes within a second (Bind is quick): wait a
# little rather than fail the bind at once, well inside kube-scheduler's 5 s timeout.
LOCK_WAIT = 2.0


class BadRequest(ValueError):
    """The request body does not have the shape of the extender protocol (HTTP 400)."""


@dataclass(frozen=True)
class SchedulerConfig:
    scheduler_name: str = "hami-scheduler"
    defaults: Defaults = field(default_factory=Defaults)
    node_policy: str = score.BINPACK
    gpu_policy: str = score.SPREAD
    node_lock_timeout: dt.timedelta = nodelock.DEFAULT_TIMEOUT
    # HAMi leaves the lock for the device plugin to release after Allocate; the lab
    # releases it at the end of Bind unless told to keep it.
    keep_node_lock: bool = False


@dataclass(frozen=True)
class PodInfo:
    """A pod holding cards: ``podManager``'s entry."""

    namespace: str
    name: str
    node: str
    devices: list[list[ContainerDevice]]


def check_health(handshake: str, now: dt.datetime) -> tuple[bool, bool]:
    """``CheckHealth``: (healthy, re-register). ``now`` is naive local time.

    The scheduler writes ``Requesting_<t>``; a device plugin that is alive overwrites it
    with ``Reported <t>``. Still ``Requesting`` after 60 s means the plugin stopped.
    """
    state, when = ann.parse_handshake(handshake)
    if state == "Requesting":
        return when is not None and now < when + HANDSHAKE_TIMEOUT, False
    if state == "Deleted":
        return True, False
    return True, True


def handshake_deleted(now: dt.datetime) -> str:
    """HAMi ``MarkAnnotationsToDelete``: the node's devices were dropped at ``now``."""
    return f"Deleted_{now.strftime('%Y-%m-%d %H:%M:%S')}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annos(obj: Mapping[str, Any]) -> dict[str, str]:
    annos = _meta(obj).get("annotations")
    return dict(annos) if isinstance(annos, Mapping) else {}


def _terminated(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed")


def _base_uuid(uuid: str) -> str:
    """MIG grants carry ``UUID[template-instance]``; usage is charged to the card."""
    return uuid.split("[", 1)[0]


def _keys(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Go's encoding/json matches field names case-insensitively; so do we."""
    return {k.lower(): v for k, v in obj.items() if isinstance(k, str)}


class Scheduler:
    def __init__(
        self,
        cluster: Cluster,
        cfg: SchedulerConfig,
        tracer: Tracer | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.cluster = cluster
        self.cfg = cfg
        self.tracer = tracer or Tracer("hami-scheduler")
        self.clock = clock
        # One lock over the node/pod caches: Filter reads usage and reserves under it, so
        # two Filters never hand out the same memory.
        self._lock = threading.RLock()
        self._nodes: dict[str, dict[str, Any]] = {}
        self._devices: dict[str, list[NodeDevice]] = {}
        self._pods: dict[str, PodInfo] = {}
        self._nodes_synced = False
        self._pods_synced = False
        self._registered = False
        self.node_notify = threading.Event()

    # -- informer callbacks ------------------------------------------------------------

    def on_nodes_listed(self, nodes: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self._nodes = {_meta(n).get("name", ""): n for n in nodes}
            self._nodes_synced = True
        self.node_notify.set()

    def on_node_event(self, kind: str, node: dict[str, Any]) -> None:
        name = _meta(node).get("name", "")
        with self._lock:
            if kind == "DELETED":
                self._nodes.pop(name, None)
                self._devices.pop(name, None)
            else:
                self._nodes[name] = node
        self.node_notify.set()

    def on_pods_listed(self, pods: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self._pods.clear()
            for p in pods:
                self._track_pod(p)
            self._pods_synced = True

    def on_pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(self._key(pod), None)
            else:
                self._track_pod(pod)

    def _key(self, pod: Mapping[str, Any]) -> str:
        meta = _meta(pod)
        return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"

    def _track_pod(self, pod: Mapping[str, Any]) -> None:
        """``onAddPod``: pods with an assigned node hold the cards their annotation names."""
        annos = _annos(pod)
        node = annos.get(ann.ASSIGNED_NODE)
        if not node:
            return
        spec = pod.get("spec")
        bound = isinstance(spec, Mapping) and bool(spec.get("nodeName"))
        if _terminated(pod) or (annos.get(ann.BIND_PHASE) == ann.BIND_FAILED and not bound):
            # Finished pods, and pods whose Bind failed (they go back to Filter), hold nothing.
            self._pods.pop(self._key(pod), None)
            return
        encoded = annos.get(ann.DEVICES_ALLOCATED) or annos.get(ann.DEVICES_TO_ALLOCATE) or ""
        try:
            devices = ann.decode_pod_devices(encoded)
        except ann.AnnotationError as exc:
            _log.warning("pod %s: unreadable device annotation: %s", self._key(pod), exc)
            return
        meta = _meta(pod)
        self._pods[self._key(pod)] = PodInfo(
            meta.get("namespace", "default"), meta.get("name", ""), node, devices
        )

    def ready(self) -> bool:
        with self._lock:
            return self._nodes_synced and self._pods_synced and self._registered

    # -- node registration -------------------------------------------------------------

    def register_from_node_annotations(self, now_local: dt.datetime | None = None) -> None:
        """One pass of ``RegisterFromNodeAnnotations`` over every known node."""
        now = now_local or dt.datetime.now()
        with self._lock:
            nodes = list(self._nodes.items())
        for name, node in nodes:
            annos = _annos(node)
            handshake = annos.get(ann.NODE_HANDSHAKE, "")
            healthy, update = check_health(handshake, now)
            if not healthy:
                self._drop_node(name)
                self._patch_node(name, {ann.NODE_HANDSHAKE: handshake_deleted(now)})
                self.tracer.step(
                    "NodeCleanUp",
                    ObjectRef("Node", name),
                    f"device plugin on {name} stopped answering the handshake: its GPUs are "
                    "no longer scheduled",
                    warning=True,
                )
                continue
            with self._lock:
                known = name in self._devices
            # A fresh extender (restart) registers nodes mid-handshake at once instead of
            # waiting for the device plugin's next report; "Deleted" nodes stay out.
            pending = ann.parse_handshake(handshake)[0] == "Requesting" and not known
            if not update and not pending:
                continue
            encoded = annos.get(ann.NODE_REGISTER)
            if encoded is None:
                self._drop_node(name)
                continue
            try:
                devices = ann.decode_node_devices(encoded)
            except ann.AnnotationError as exc:
                _log.warning("node %s: %s", name, exc)
                continue
            if update:
                self._patch_node(name, {ann.NODE_HANDSHAKE: ann.handshake_requesting(now)})
            with self._lock:
                changed = self._devices.get(name) != devices
                self._devices[name] = devices
            if changed:
                self.tracer.step(
                    "RegisterNode",
                    ObjectRef("Node", name),
                    f"{len(devices)} GPUs registered on {name}",
                    gpus=[
                        {
                            "id": d.id,
                            "type": d.type,
                            "devmem": d.devmem,
                            "count": d.count,
                            "health": d.health,
                        }
                        for d in devices
                    ],
                )
        with self._lock:
            if self._nodes_synced:
                self._registered = True

    def _drop_node(self, name: str) -> None:
        with self._lock:
            self._devices.pop(name, None)

    def _patch_node(self, name: str, annos: dict[str, str | None]) -> None:
        try:
            self.cluster.patch_node_annotations(name, annos)
        except ClusterError as exc:
            _log.warning("could not patch node %s: %s", name, exc)

    def run_register_loop(self, stop: threading.Event, period: float = REGISTER_PERIOD) -> None:
        """Re-register on node events and every ``period`` seconds until ``stop``."""
        deadline = time.monotonic() + period
        while not stop.is_set():
            self.node_notify.wait(timeout=max(0.0, deadline - time.monotonic()))
            if stop.is_set():
                return
            if time.monotonic() >= deadline:
                deadline = time.monotonic() + period
            self.node_notify.clear()
            try:
                self.register_from_node_annotations()
            except Exception:  # the loop must outlive one bad pass
                _log.exception("node registration pass failed")

    # -- usage -------------------------------------------------------------------------

    def usage(self) -> dict[str, list[DeviceUsage]]:
        """``getNodesUsage``: registered cards with what tracked pods hold on them."""
        with self._lock:
            view = {
                name: [
                    DeviceUsage(
                        id=d.id,
                        index=d.index,
                        type=d.type,
                        count=d.count,
                        totalmem=d.devmem,
                        totalcore=d.devcore,
                        numa=d.numa,
                        mode=d.mode,
                        health=d.health,
                    )
                    for d in devices
                ]
                for name, devices in self._devices.items()
            }
            for info in self._pods.values():
                cards = {d.id: d for d in view.get(info.node, [])}
                for ctr in info.devices:
                    for g in ctr:
                        card = cards.get(_base_uuid(g.uuid))
                        if card is not None:
                            card.used += 1
                            card.usedmem += g.usedmem
                            card.usedcores += g.usedcores
            return view

    def pods_on(self, node: str) -> list[PodInfo]:
        with self._lock:
            return [p for p in self._pods.values() if p.node == node]

    # -- Filter ------------------------------------------------------------------------

    def _evaluate(
        self, pod: Mapping[str, Any], names: Sequence[str], reqs: Sequence[device.ContainerRequest]
    ) -> tuple[list[NodeResult], NodeResult | None, str, str]:
        """Fit and score on every candidate node; caller holds the lock."""
        annos = device.annotations(pod)
        node_policy = score.resolve_policy(
            annos, score.NODE_POLICY_ANNOTATION, self.cfg.node_policy
        )
        gpu_policy = score.resolve_policy(annos, score.GPU_POLICY_ANNOTATION, self.cfg.gpu_policy)
        view = self.usage()
        results = [
            score.fit_pod(n, view[n], reqs, annos, gpu_policy)
            if n in view
            else NodeResult(n, fit=False, reason=score.NODE_UNREGISTERED)
            for n in names
        ]
        return results, score.pick_node(results, node_policy), node_policy, gpu_policy

    def filter(self, args: Any) -> dict[str, Any]:
        """``Scheduler.Filter``: exactly one node (the best) or the reasons none fits."""
        pod, names, nodes = parse_extender_args(args)
        meta = _meta(pod)
        ref = ObjectRef(
            "Pod", meta.get("name", ""), meta.get("namespace", "default"), meta.get("uid")
        )
        try:
            reqs = device.pod_requests(pod, self.cfg.defaults)
        except RequestError as exc:
            raise BadRequest(str(exc)) from exc
        if sum(r.nums for r in reqs) == 0:
            # Not a vGPU pod: pass the candidates through untouched.
            return _filter_result(nodes, names, {})
        key = self._key(pod)
        with self._lock:
            self._pods.pop(key, None)
            results, chosen, node_policy, gpu_policy = self._evaluate(pod, names, reqs)
            if chosen is not None:
                self._pods[key] = PodInfo(
                    meta.get("namespace", "default"),
                    meta.get("name", ""),
                    chosen.node,
                    chosen.devices,
                )
        failed = {r.node: r.reason for r in results if not r.fit}
        record = filter_record(results, chosen, node_policy, gpu_policy, self.clock())
        if chosen is None:
            # Drop a stale assignment from an earlier Filter so it holds no cards.
            self._record(
                pod,
                {
                    FILTER_RESULT: record,
                    ann.ASSIGNED_NODE: None,
                    ann.DEVICES_TO_ALLOCATE: None,
                    ann.DEVICES_ALLOCATED: None,
                },
            )
            self.tracer.step(
                "Filter",
                ref,
                f"no node fits: {_reasons_line(failed)}",
                warning=True,
                nodes=failed,
            )
            return _filter_result(nodes, [], failed)
        encoded = ann.encode_pod_devices(chosen.devices)
        try:
            self.cluster.patch_pod_annotations(
                meta.get("namespace", "default"),
                meta.get("name", ""),
                {
                    ann.ASSIGNED_NODE: chosen.node,
                    ASSIGNED_TIME: str(int(self.clock().timestamp())),
                    ann.DEVICES_TO_ALLOCATE: encoded,
                    ann.DEVICES_ALLOCATED: encoded,
                    FILTER_RESULT: record,
                },
            )
        except ClusterError as exc:
            with self._lock:
                self._pods.pop(key, None)
            self.tracer.step("Filter", ref, f"could not record the decision: {exc}", warning=True)
            return {**_filter_result(nodes, [], failed), "Error": str(exc)}
        fits = [r for r in results if r.fit]
        self.tracer.step(
            "Filter",
            ref,
            f"{chosen.node} chosen ({node_policy} nodes, {gpu_policy} GPUs): {len(fits)} of "
            f"{len(results)} nodes fit; GPUs {_grants_line(chosen.devices)}",
            node=chosen.node,
            scores={r.node: r.score for r in fits},
            failed=failed,
        )
        return _filter_result(nodes, [chosen.node], failed)

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """HostPriorityList 0..10 by the node policy (HAMi itself decides in Filter)."""
        pod, names, _ = parse_extender_args(args)
        try:
            reqs = device.pod_requests(pod, self.cfg.defaults)
        except RequestError as exc:
            raise BadRequest(str(exc)) from exc
        if sum(r.nums for r in reqs) == 0:
            return [{"Host": n, "Score": 0} for n in names]
        with self._lock:
            saved = self._pods.pop(self._key(pod), None)
            try:
                results, _, node_policy, _ = self._evaluate(pod, names, reqs)
            finally:
                if saved is not None:
                    self._pods[self._key(pod)] = saved
        return [{"Host": r.node, "Score": score.extender_score(r, node_policy)} for r in results]

    def _record(self, pod: Mapping[str, Any], annos: dict[str, str | None]) -> None:
        meta = _meta(pod)
        try:
            self.cluster.patch_pod_annotations(
                meta.get("namespace", "default"), meta.get("name", ""), annos
            )
        except ClusterError as exc:
            _log.warning("could not annotate pod %s: %s", self._key(pod), exc)

    # -- Bind --------------------------------------------------------------------------

    def bind(self, args: Any) -> dict[str, Any]:
        """``Scheduler.Bind``: node lock → annotations → Binding → release."""
        ns, name, uid, node = parse_binding_args(args)
        ref = ObjectRef("Pod", name, ns, uid or None)
        try:
            pod = self.cluster.get_pod(ns, name)
        except ClusterError as exc:
            self.tracer.step("Bind", ref, f"cannot read pod: {exc}", warning=True)
            return {"Error": str(exc)}
        try:
            reqs = device.pod_requests(pod, self.cfg.defaults)
        except RequestError as exc:
            return {"Error": f"pod {ns}/{name}: {exc}"}
        if sum(r.nums for r in reqs) == 0:
            try:
                self.cluster.create_binding(ns, name, uid, node)
            except ClusterError as exc:
                return {"Error": str(exc)}
            self.tracer.step("Bind", ref, f"bound to {node} (no vGPU)")
            return {"Error": ""}

        key = f"{ns}/{name}"
        with self._lock:
            info = self._pods.get(key)
            if info is None or info.node != node:
                # Filter chose elsewhere or ran before a restart: fit again on this node.
                results, _, _, _ = self._evaluate(pod, [node], reqs)
                if not results[0].fit:
                    msg = f"pod {ns}/{name} does not fit node {node}: {results[0].reason}"
                    self.tracer.step("Bind", ref, msg, warning=True)
                    return {"Error": msg}
                info = PodInfo(ns, name, node, results[0].devices)
                self._pods[key] = info

        locked = False
        try:
            self._lock_node(node, ns, name, ref)
            locked = True
            encoded = ann.encode_pod_devices(info.devices)
            self.cluster.patch_pod_annotations(
                ns,
                name,
                {
                    ann.ASSIGNED_NODE: node,
                    ann.DEVICES_TO_ALLOCATE: encoded,
                    ann.DEVICES_ALLOCATED: encoded,
                    ann.BIND_PHASE: ann.BIND_ALLOCATING,
                    ann.BIND_TIME: str(int(self.clock().timestamp())),
                },
            )
            self.cluster.create_binding(ns, name, uid, node)
        except (ClusterError, nodelock.NodeLocked) as exc:
            self._bind_failed(ns, name, node, ref, locked, exc)
            return {"Error": str(exc)}
        self.tracer.step(
            "Bind", ref, f"bound to {node}; GPUs {_grants_line(info.devices)}", node=node
        )
        if not self.cfg.keep_node_lock:
            self._release(node, ns, name, ref)
        return {"Error": ""}

    def _lock_node(self, node: str, ns: str, name: str, ref: ObjectRef) -> None:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                nodelock.lock_node(
                    self.cluster,
                    node,
                    ns,
                    name,
                    now=self.clock(),
                    timeout=self.cfg.node_lock_timeout,
                )
                self.tracer.step("LockNode", ref, f"{nodelock.NODE_LOCK_KEY} taken on {node}")
                return
            except nodelock.NodeLocked:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _release(self, node: str, ns: str, name: str, ref: ObjectRef) -> None:
        try:
            if nodelock.release_node_lock(self.cluster, node, ns, name):
                self.tracer.step(
                    "ReleaseNodeLock", ref, f"{nodelock.NODE_LOCK_KEY} released on {node}"
                )
        except ClusterError as exc:
            _log.warning("could not release the lock on %s: %s", node, exc)

    def _bind_failed(
        self, ns: str, name: str, node: str, ref: ObjectRef, locked: bool, exc: Exception
    ) -> None:
        with self._lock:
            self._pods.pop(f"{ns}/{name}", None)
        try:
            self.cluster.patch_pod_annotations(ns, name, {ann.BIND_PHASE: ann.BIND_FAILED})
        except ClusterError as patch_exc:
            _log.warning("could not mark %s/%s failed: %s", ns, name, patch_exc)
        if locked:
            self._release(node, ns, name, ref)
        self.tracer.step("Bind", ref, f"binding to {node} failed: {exc}", warning=True)


# -- wire format ---------------------------------------------------------------------------


def parse_extender_args(
    args: Any,
) -> tuple[dict[str, Any], list[str], list[dict[str, Any]] | None]:
    """ExtenderArgs → (pod, candidate names, full Node objects when not cache-capable)."""
    if not isinstance(args, Mapping):
        raise BadRequest("ExtenderArgs must be a JSON object")
    keys = _keys(args)
    pod = keys.get("pod")
    if not isinstance(pod, Mapping):
        raise BadRequest("ExtenderArgs.Pod is missing or not an object")
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise BadRequest("ExtenderArgs.Pod.metadata.name is missing")
    for key in ("namespace", "uid"):
        if not isinstance(meta.get(key, ""), str):
            raise BadRequest(f"ExtenderArgs.Pod.metadata.{key} must be a string")
    try:
        device.annotations(pod)
    except RequestError as exc:
        raise BadRequest(str(exc)) from exc
    names = keys.get("nodenames")
    nodes_obj = keys.get("nodes")
    nodes: list[dict[str, Any]] | None = None
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("ExtenderArgs.NodeNames must be a list of strings")
    elif isinstance(nodes_obj, Mapping):
        items = nodes_obj.get("items") or []
        if not isinstance(items, list) or not all(
            isinstance(n, Mapping) and isinstance(_meta(n).get("name"), str) for n in items
        ):
            raise BadRequest("ExtenderArgs.Nodes.items must be Node objects with names")
        nodes = list(items)
        names = [_meta(n)["name"] for n in items]
    else:
        raise BadRequest("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes")
    return dict(pod), list(names), nodes


def parse_binding_args(args: Any) -> tuple[str, str, str, str]:
    if not isinstance(args, Mapping):
        raise BadRequest("ExtenderBindingArgs must be a JSON object")
    keys = _keys(args)
    values = [keys.get(k) for k in ("podnamespace", "podname", "poduid", "node")]
    ns, name, uid, node = (v if v is not None else "" for v in values)
    if not all(isinstance(v, str) for v in (ns, name, uid, node)):
        raise BadRequest("ExtenderBindingArgs fields must be strings")
    if not name or not node:
        raise BadRequest("ExtenderBindingArgs needs PodName and Node")
    return ns or "default", name, uid, node


def filter_error(message: str) -> dict[str, Any]:
    """An ExtenderFilterResult that fails the whole Filter (kube-scheduler retries the pod)."""
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def _filter_result(
    nodes: list[dict[str, Any]] | None,
    keep: list[str],
    failed: dict[str, str],
) -> dict[str, Any]:
    """ExtenderFilterResult in the shape the request came in (names or Node objects)."""
    result = {**filter_error(""), "FailedNodes": failed}
    if nodes is None:
        result["NodeNames"] = keep
    else:
        result["Nodes"] = {"items": [n for n in nodes if _meta(n).get("name") in keep]}
    return result


def filter_record(
    results: Sequence[NodeResult],
    chosen: NodeResult | None,
    node_policy: str,
    gpu_policy: str,
    now: dt.datetime,
) -> str:
    """The ``gpulab.io/filter-result`` annotation `gpulab explain pod` prints."""
    return json.dumps(
        {
            "time": now.isoformat(timespec="seconds"),
            "nodePolicy": node_policy,
            "gpuPolicy": gpu_policy,
            "chosen": chosen.node if chosen else None,
            "nodes": [
                {
                    "node": r.node,
                    "fit": r.fit,
                    "reason": r.reason,
                    "score": r.score,
                    "devices": [[g.uuid for g in ctr] for ctr in r.devices],
                }
                for r in results
            ],
        },
        separators=(",", ":"),
    )


def _grants_line(devices: Sequence[Sequence[ContainerDevice]]) -> str:
    return "; ".join(
        ", ".join(f"{g.uuid} {g.usedmem}MiB {g.usedcores}%" for g in ctr) or "-" for ctr in devices
    )


def _reasons_line(failed: Mapping[str, str]) -> str:
    return "; ".join(f"{n}: {r}" for n, r in sorted(failed.items())) or "no candidate nodes"
