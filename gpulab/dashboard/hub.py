"""The dashboard's live state: one informer per kind, views recomputed per key, fan-out.

    informers   one gpulab.informer.Informer per kind (Nodes, Pods, Events, CRDs, and each
                chapter's kinds once its CRD is established), shared by every page
    indexes     kept by the handlers (pods by node / gang / DaemonSet, Events by pod and
                the device plugin's health Events by node), like client-go Indexers
    work queue  handlers only add view keys ("node:gpu-a100", "pending:ns/pod"); one worker
                recomputes a key's view (gpulab.dashboard.views) and publishes it when it
                changed, so a burst of changes to one node is one update
    Fanout      the latest view of every key and the recent calls; each connected page gets
                a snapshot, then every change as a patch (no full re-render per event)

The API server's reachability comes from the informers' own list and watch calls: a
failing call marks it down (the page shows a banner), the next one that succeeds marks it
up, and the informers' relists bring every view up to date again.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab import informer, trace
from gpulab.dashboard import chain, views
from gpulab.informer import Delta, Handlers, Informer, ListWatch, Resource, Store
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger("gpulab.dashboard")

Obj = dict[str, Any]
CALLS_KEPT = 400  # the newest calls a page gets on connect
SUBSCRIBER_BACKLOG = 20_000  # a page further behind than this is dropped (it reconnects)

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CRD", False)


@dataclass(frozen=True)
class Kind:
    """A chapter's resource: the panel it feeds and the CRD that must exist for it."""

    name: str
    panel: str
    group: str
    versions: tuple[str, ...]  # preferred first
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"


KINDS = (
    Kind("clusterqueues", "kueue", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "clusterqueues",
         "ClusterQueue", namespaced=False),
    Kind("localqueues", "kueue", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "localqueues",
         "LocalQueue"),
    Kind("workloads", "kueue", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "workloads", "Workload"),
    Kind("volcano-queues", "volcano", "scheduling.volcano.sh", ("v1beta1",), "queues", "Queue",
         namespaced=False),
    Kind("volcano-podgroups", "volcano", "scheduling.volcano.sh", ("v1beta1",), "podgroups",
         "PodGroup"),
    Kind("coscheduling-podgroups", "coscheduling", "scheduling.x-k8s.io", ("v1alpha1",),
         "podgroups", "PodGroup"),
    Kind("clusterpolicies", "operator", "nvidia.com", ("v1",), "clusterpolicies",
         "ClusterPolicy", namespaced=False),
)  # fmt: skip
PANELS = ("kueue", "volcano", "coscheduling", "operator")
GANG_FLAVORS = {"volcano-podgroups": "volcano", "coscheduling-podgroups": "coscheduling"}


class ApiHealth:
    """Whether the API server answered the informers' last call."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.up: bool | None = None
        self.error = ""
        self.since = dt.datetime.now(dt.UTC)
        self._lock = threading.Lock()
        self._on_change = on_change

    def ok(self) -> None:
        self._set(True, "")

    def failed(self, exc: BaseException) -> None:
        self._set(False, f"{type(exc).__name__}: {exc}"[:300])

    def _set(self, up: bool, error: str) -> None:
        with self._lock:
            if self.up == up:
                return
            self.up, self.error, self.since = up, error, dt.datetime.now(dt.UTC)
        self._on_change()

    def view(self) -> dict[str, Any]:
        return {"up": self.up, "error": self.error, "since": self.since.isoformat()}


def _unreachable(exc: BaseException) -> bool:
    """A connection error or a 5xx: the API server is not serving (a 404 or 403 is an
    answer: the server is there)."""
    return not isinstance(exc, ApiException) or exc.status >= 500 or exc.status == 0


class WatchedListWatch(ListWatch):
    """A ListWatch that reports each list/watch call's outcome to :class:`ApiHealth`."""

    def __init__(self, health: ApiHealth, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._health = health

    def list(self) -> tuple[list[Obj], str]:
        return self._observed(super().list)

    def watch(self, rv: str, timeout_seconds: int = informer.WATCH_SECONDS) -> Any:
        return self._observed(lambda: super(WatchedListWatch, self).watch(rv, timeout_seconds))

    def _observed(self, call: Callable[[], Any]) -> Any:
        try:
            result = call()
        except Exception as exc:
            if _unreachable(exc):
                self._health.failed(exc)
            raise
        self._health.ok()
        return result


class Fanout:
    """The latest view per key and the recent calls; each page's queue gets every change.

    ``publish`` and ``subscribe`` hold one lock, so a page's snapshot plus the patches
    after it are exactly the state (nothing missed, nothing twice).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[str, Any] = {}
        self._calls: list[chain.Call] = []  # sorted by time
        self._subs: dict[asyncio.Queue[Any], asyncio.AbstractEventLoop] = {}

    def view(self, key: str) -> Any:
        with self._lock:
            return self._views.get(key)

    def keys(self, prefix: str) -> list[str]:
        with self._lock:
            return [k for k in self._views if k.startswith(prefix)]

    def set_view(self, key: str, value: Any) -> bool:
        with self._lock:
            if self._views.get(key) == value:
                return False
            if value is None:
                self._views.pop(key, None)
            else:
                self._views[key] = value
            self._send({"k": key, "v": value})
        return True

    def add_call(self, call: chain.Call) -> None:
        """A new call, or a repeat of an Event (its series grew), which moves its call; a
        repeat of the latest call is merged into it (chain.merge)."""
        with self._lock:
            replaced: list[str] = []  # ids the page drops besides call.id itself
            self._calls = [c for c in self._calls if c.id != call.id]
            merged = chain.merge(self._calls[-1], call) if self._calls else None
            if merged is not None:
                replaced.append(self._calls.pop().id)
                call = merged
            bisect.insort(self._calls, call, key=lambda c: c.time)
            del self._calls[:-CALLS_KEPT]
            self._send({"call": call.json(), "replaces": replaced})

    def calls(self) -> list[chain.Call]:
        with self._lock:
            return list(self._calls)

    def _send(self, message: dict[str, Any]) -> None:
        for queue, loop in list(self._subs.items()):
            if queue.qsize() > SUBSCRIBER_BACKLOG:
                del self._subs[queue]
                loop.call_soon_threadsafe(queue.put_nowait, None)  # ends that stream
            else:
                loop.call_soon_threadsafe(queue.put_nowait, message)

    def subscribe(self, loop: asyncio.AbstractEventLoop) -> tuple[dict[str, Any], asyncio.Queue]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        with self._lock:
            snapshot = {
                "views": dict(self._views),
                "calls": [c.json() for c in chain.collapse(self._calls)],
                "lanes": list(chain.LANES),
            }
            self._subs[queue] = loop
        return snapshot, queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        with self._lock:
            self._subs.pop(queue, None)


class Hub:
    """Informers, indexes and the view worker for one cluster."""

    def __init__(self, api: client.ApiClient, server: str = "") -> None:
        self.api = api
        self.server = server
        self.fanout = Fanout()
        self.health = ApiHealth(lambda: self.queue.add("status"))
        self.queue = WorkQueue()
        self._informers: dict[str, Informer] = {}
        self._lock = threading.RLock()
        self._installed: dict[str, str] = {}  # kind name -> served version
        # indexes (client-go Indexers), guarded by _lock
        self._pods_by_node: dict[str, set[str]] = defaultdict(set)
        self._pods_by_group: dict[str, set[str]] = defaultdict(set)
        self._pods_by_ds: dict[str, set[str]] = defaultdict(set)
        self._events_by_pod: dict[str, dict[str, Obj]] = defaultdict(dict)
        self._health_events: dict[str, dict[str, Obj]] = defaultdict(dict)
        self._worker: threading.Thread | None = None

    # ----------------------------------------------------------------- life cycle

    def start(self) -> Hub:
        self.queue.add("status")
        self._worker = threading.Thread(
            target=run_worker, args=(self.queue, self._reconcile, "dashboard"), daemon=True
        )
        self._worker.start()
        self._watch("nodes", informer.NODES, self._on_node)
        self._watch("pods", informer.PODS, self._on_pod)
        self._watch("events", informer.EVENTS, self._on_event)
        crds = self._watch("crds", CRDS, self._on_crd)
        # panels say "not installed" only once every CRD has been listed
        threading.Thread(
            target=lambda: crds.wait_for_sync(None) and self.queue.add("status"), daemon=True
        ).start()
        return self

    def stop(self) -> None:
        with self._lock:
            informers = list(self._informers.values())
        for inf in informers:
            inf.stop()
        self.queue.shutdown()

    def wait_for_sync(self, timeout: float) -> bool:
        with self._lock:
            informers = list(self._informers.values())
        return all(inf.wait_for_sync(timeout) for inf in informers)

    def _watch(self, name: str, resource: Resource, on_change: Callable[[Delta], None]) -> Informer:
        lw = WatchedListWatch(self.health, self.api, resource)
        handlers = Handlers(
            on_add=lambda o: on_change(Delta("ADDED", o)),
            on_update=lambda old, new: on_change(Delta("MODIFIED", new, old)),
            on_delete=lambda o: on_change(Delta("DELETED", o)),
        )
        inf = Informer(lw, handlers, name=f"dashboard-{name}")
        with self._lock:
            self._informers[name] = inf
        return inf.start()

    def store(self, name: str) -> Store | None:
        with self._lock:
            inf = self._informers.get(name)
        return inf.store if inf is not None else None

    def _objects(self, name: str) -> list[Obj]:
        store = self.store(name)
        return store.list() if store is not None else []

    def _get(self, name: str, key: str) -> Obj | None:
        store = self.store(name)
        return store.get(key) if store is not None else None

    def _add_all(self, prefix: str, keys: Iterable[str]) -> None:
        for k in {*keys, *(k.split(":", 1)[1] for k in self.fanout.keys(prefix + ":"))}:
            self.queue.add(f"{prefix}:{k}")

    # ----------------------------------------------------------------- handlers (enqueue only)

    def _on_node(self, d: Delta) -> None:
        self.queue.add(f"node:{views.key(d.obj)}")
        gpus = [views.allocatable(o).get(views.GPU) for o in (d.obj, d.old) if o is not None]
        if d.type != "MODIFIED" or len(set(gpus)) > 1:
            self._add_all("vq", [])  # the cluster's GPU total changed
        self._add_all("op", [])

    def _on_pod(self, d: Delta) -> None:
        k = views.key(d.obj)
        if d.type == "DELETED":
            before, after = d.obj, None
        else:
            before, after = d.old, d.obj
        with self._lock:
            for pod, index in ((before, False), (after, True)):
                if pod is None:
                    continue
                node = (pod.get("spec") or {}).get("nodeName")
                targets: list[tuple[dict[str, set[str]], str]] = []
                if node:
                    targets.append((self._pods_by_node, node))
                targets += [(self._pods_by_group, g) for g in views.pod_groups(pod)]
                targets += [
                    (self._pods_by_ds, f"{views.meta(pod).get('namespace')}/{r.get('name')}")
                    for r in views.meta(pod).get("ownerReferences") or []
                    if r.get("kind") == "DaemonSet"
                ]
                for idx, name in targets:
                    if index:
                        idx[name].add(k)
                    else:
                        idx[name].discard(k)
                    self._touched(idx, name)
            if after is None:
                self._events_by_pod.pop(k, None)
        self.queue.add(f"pending:{k}")

    def _touched(self, idx: dict[str, set[str]], name: str) -> None:
        """Enqueue the views a change to the pods under ``name`` in ``idx`` affects."""
        if idx is self._pods_by_node:
            self.queue.add(f"node:{name}")
        elif idx is self._pods_by_group:
            self.queue.add(f"pg:{name}")
            if name.startswith("volcano/"):
                self._add_all("vq", [])
        else:
            self._add_all("op", [])

    def _on_event(self, d: Delta) -> None:
        ev = d.obj
        about = ev.get("involvedObject") or {}
        ek = views.key(ev)
        gone = d.type == "DELETED"
        with self._lock:
            if about.get("kind") == "Pod":
                pod = f"{about.get('namespace')}/{about.get('name')}"
                if gone:
                    self._events_by_pod.get(pod, {}).pop(ek, None)
                else:
                    self._events_by_pod[pod][ek] = ev
                if ev.get("reason") == "FailedScheduling":
                    self.queue.add(f"pending:{pod}")
            elif about.get("kind") == "Node" and _from_device_plugin(ev):
                node = str(about.get("name"))
                if gone:
                    self._health_events[node].pop(ek, None)
                elif ev.get("reason") in ("Start", "CheckHealth"):
                    self._health_events[node][ek] = ev
                self.queue.add(f"node:{node}")
        if not gone and trace.repeated(d):
            uid = views.meta(ev).get("uid") or ek
            self.fanout.add_call(chain.call(trace.to_trace_event(ev), uid))

    def _on_crd(self, d: Delta) -> None:
        crd = d.obj
        name = views.meta(crd).get("name")
        for kind in KINDS:
            if kind.crd != name:
                continue
            served = _served(crd) if d.type != "DELETED" else set()
            version = next((v for v in kind.versions if v in served), None)
            self._set_installed(kind, version)
        self.queue.add("status")

    def _set_installed(self, kind: Kind, version: str | None) -> None:
        with self._lock:
            current = self._installed.get(kind.name)
            if current == version:
                return
            old = self._informers.pop(kind.name, None)
            if version is None:
                self._installed.pop(kind.name, None)
            else:
                self._installed[kind.name] = version
        if old is not None:
            old.stop()
        if version is not None:
            resource = Resource(
                kind.group, version, kind.plural, kind.kind, namespaced=kind.namespaced
            )
            self._watch(kind.name, resource, lambda d, k=kind: self._on_custom(k, d))
            if kind.name == "clusterpolicies":
                self._watch("daemonsets", informer.DAEMONSETS, lambda _d: self._add_all("op", []))
        elif kind.name == "clusterpolicies":
            with self._lock:
                ds = self._informers.pop("daemonsets", None)
            if ds is not None:
                ds.stop()
        self._refresh_panel(kind.panel)

    def _refresh_panel(self, panel: str) -> None:
        prefixes = {
            "kueue": ("cq",),
            "volcano": ("vq", "pg"),
            "coscheduling": ("pg",),
            "operator": ("op",),
        }[panel]
        for prefix in prefixes:
            self._add_all(prefix, [])
        self.queue.add("status")

    def _on_custom(self, kind: Kind, d: Delta) -> None:
        k = views.key(d.obj)
        if kind.panel == "kueue":
            names = [str(views.meta(o).get("name")) for o in self._objects("clusterqueues")]
            self._add_all("cq", names + ([k] if kind.name == "clusterqueues" else []))
        elif kind.name == "volcano-queues":
            self._add_all("vq", [str(views.meta(o).get("name")) for o in self._objects(kind.name)])
        elif kind.name in GANG_FLAVORS:
            self.queue.add(f"pg:{GANG_FLAVORS[kind.name]}/{k}")
            if kind.name == "volcano-podgroups":
                self._add_all("vq", [])
        elif kind.name == "clusterpolicies":
            self.queue.add(f"op:{k}")

    # ----------------------------------------------------------------- the worker

    def _reconcile(self, key: str) -> None:
        prefix, _, name = key.partition(":")
        view = {
            "status": self._status_view,
            "node": self._node_view,
            "pending": self._pending_view,
            "cq": self._cq_view,
            "vq": self._vq_view,
            "pg": self._pg_view,
            "op": self._op_view,
        }[prefix](name)
        self.fanout.set_view(key, view)

    def _status_view(self, _name: str) -> dict[str, Any]:
        with self._lock:
            installed = {k.panel for k in KINDS if k.name in self._installed}
        with self._lock:
            crds = self._informers.get("crds")
        synced = crds is not None and crds.has_synced()
        panels = {p: (p in installed) if synced else None for p in PANELS}
        return {"api": self.health.view(), "panels": panels, "server": self.server}

    def _pods(self, keys: Iterable[str]) -> list[Obj]:
        pods = self.store("pods")
        found = (pods.get(k) for k in keys) if pods is not None else ()
        return [p for p in found if p is not None]

    def _node_view(self, name: str) -> dict[str, Any] | None:
        node = self._get("nodes", name)
        if node is None:
            return None
        with self._lock:
            keys = list(self._pods_by_node.get(name, ()))
            health = list(self._health_events.get(name, {}).values())
        return views.node_view(node, self._pods(keys), health)

    def pod_events(self, pod_key: str) -> list[Obj]:
        with self._lock:
            return list(self._events_by_pod.get(pod_key, {}).values())

    def _pending_view(self, name: str) -> dict[str, Any] | None:
        pod = self._get("pods", name)
        if pod is None or not views.unscheduled(pod):
            return None
        events = self.pod_events(name)
        failed = views.latest(e for e in events if e.get("reason") == "FailedScheduling")
        return views.pending_view(pod, failed)

    def explain(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self._get("pods", f"{namespace}/{name}")
        if pod is None:
            return None
        return views.explain_view(pod, self.pod_events(f"{namespace}/{name}"))

    def _cq_view(self, name: str) -> dict[str, Any] | None:
        cq = self._get("clusterqueues", name)
        if cq is None:
            return None
        lqs = [q for q in self._objects("localqueues") if views.local_queue_target(q) == name]
        mine = {views.key(q) for q in lqs}
        wls = [w for w in self._objects("workloads") if views.workload_queue(w) in mine]
        return views.cluster_queue_view(cq, self._objects("clusterqueues"), wls, lqs)

    def _vq_view(self, name: str) -> dict[str, Any] | None:
        queue = self._get("volcano-queues", name)
        if queue is None:
            return None
        gpus: dict[str, int] = defaultdict(int)
        for pg in self._objects("volcano-podgroups"):
            with self._lock:
                keys = list(self._pods_by_group.get(f"volcano/{views.key(pg)}", ()))
            bound = [
                p
                for p in self._pods(keys)
                if (p.get("spec") or {}).get("nodeName") and not views.is_terminal(p)
            ]
            queue_name = (pg.get("spec") or {}).get("queue") or "default"
            gpus[queue_name] += sum(map(views.pod_gpus, bound))
        total = sum(
            views.parse_quantity(views.allocatable(n).get(views.GPU))
            for n in self._objects("nodes")
        )
        return views.volcano_queue_view(queue, self._objects("volcano-queues"), gpus, int(total))

    def _pg_view(self, name: str) -> dict[str, Any] | None:
        flavor, _, pg_key = name.partition("/")
        kind = next(k for k, f in GANG_FLAVORS.items() if f == flavor)
        pg = self._get(kind, pg_key)
        if pg is None:
            return None
        with self._lock:
            keys = list(self._pods_by_group.get(name, ()))
        return views.podgroup_view(flavor, pg, self._pods(keys))

    def _op_view(self, name: str) -> dict[str, Any] | None:
        policy = self._get("clusterpolicies", name)
        if policy is None:
            return None
        daemonsets = self._objects("daemonsets")
        with self._lock:
            keys = [k for ds in daemonsets for k in self._pods_by_ds.get(views.key(ds), ())]
        nodes = self._objects("nodes")
        gpu_nodes = [
            str(views.meta(n).get("name"))
            for n in nodes
            if (views.meta(n).get("labels") or {}).get("nvidia.com/gpu.present") == "true"
        ]
        return views.cluster_policy_view(policy, daemonsets, self._pods(keys), sorted(gpu_nodes))


def _from_device_plugin(ev: Obj) -> bool:
    reporter = ev.get("reportingComponent") or (ev.get("source") or {}).get("component") or ""
    return reporter.removeprefix("gpulab.io/") == "device-plugin"


def _served(crd: Obj) -> set[str]:
    """The versions a CRD serves, once it is Established."""
    conditions = (crd.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
        return set()
    return {v.get("name") for v in (crd.get("spec") or {}).get("versions") or [] if v.get("served")}
