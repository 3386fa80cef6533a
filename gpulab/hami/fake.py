"""An in-memory API server for the HAMi (v2.10.0) extender: pods, nodes and ResourceQuotas
as dicts, with the rules that matter to it (resourceVersion compare-and-swap, one Binding
per pod, 404s, a UID per pod), and the informer side: ``connect`` lists everything into a
scheduler's handlers and delivers every later change, and the object dicts serve as its
listers.

Used by the component tests and the benchmark; implements ``cluster.Cluster`` and
``cluster.Listers``. A lab tool: HAMi has no counterpart (its tests use client-go fakes).
"""

from __future__ import annotations

import copy
import threading
import uuid
from typing import Any

from gpulab.hami.cluster import Conflict, NotFound, Watched, pod_patch

Obj = dict[str, Any]


class FakeCluster:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rv = 0
        self.pods: dict[tuple[str, str], Obj] = {}
        self.nodes: dict[str, Obj] = {}
        self.quotas: dict[tuple[str, str], Obj] = {}
        self.bindings: list[tuple[str, str, str]] = []
        self.calls: list[str] = []  # API verbs in order, for tests that count round trips
        self._watched: list[Watched] = []

    # -- writes (and what an informer would deliver) -----------------------------------

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    def _emit(self, kind: str, event: str, old: Obj | None, new: Obj) -> None:
        for w in list(self._watched):
            handlers = {
                "pods": w.pod_handlers,
                "nodes": w.node_handlers,
                "quotas": w.quota_handlers,
            }[kind]
            if event == "ADDED" and handlers.on_add:
                handlers.on_add(new)
            elif event == "MODIFIED" and handlers.on_update:
                handlers.on_update(old or new, new)
            elif event == "DELETED" and handlers.on_delete:
                handlers.on_delete(new)

    def add_node(self, node: Obj) -> None:
        with self._lock:
            node = copy.deepcopy(node)
            self._bump(node)
            self.nodes[node["metadata"]["name"]] = node
        self._emit("nodes", "ADDED", None, node)

    def delete_node(self, name: str) -> None:
        with self._lock:
            node = self.nodes.pop(name, None)
        if node is not None:
            self._emit("nodes", "DELETED", None, node)

    def add_pod(self, pod: Obj) -> Obj:
        with self._lock:
            pod = copy.deepcopy(pod)
            meta = pod.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            meta.setdefault("uid", str(uuid.uuid4()))
            self._bump(pod)
            self.pods[(meta["namespace"], meta["name"])] = pod
        self._emit("pods", "ADDED", None, pod)
        return pod

    def update_pod(self, pod: Obj) -> None:
        """Replace a pod (a kubelet status update, say) and tell the informers."""
        with self._lock:
            meta = pod["metadata"]
            old = self.pods[(meta["namespace"], meta["name"])]
            new = copy.deepcopy(pod)
            self._bump(new)
            self.pods[(meta["namespace"], meta["name"])] = new
        self._emit("pods", "MODIFIED", old, new)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self.pods.pop((namespace, name), None)
        if pod is not None:
            self._emit("pods", "DELETED", None, pod)

    def add_quota(self, quota: Obj) -> None:
        with self._lock:
            quota = copy.deepcopy(quota)
            meta = quota["metadata"]
            self._bump(quota)
            self.quotas[(meta["namespace"], meta["name"])] = quota
        self._emit("quotas", "ADDED", None, quota)

    # -- Cluster ----------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> Obj:
        with self._lock:
            self.calls.append("get pod")
            if (namespace, name) not in self.pods:
                raise NotFound(f"pod {namespace}/{name} not found")
            return copy.deepcopy(self.pods[(namespace, name)])

    def get_node(self, name: str) -> Obj:
        with self._lock:
            self.calls.append("get node")
            if name not in self.nodes:
                raise NotFound(f"node {name} not found")
            return copy.deepcopy(self.nodes[name])

    @staticmethod
    def _merge(target: dict[str, Any], values: dict[str, Any]) -> None:
        for k, v in values.items():
            if v is None:
                target.pop(k, None)
            else:
                target[k] = v

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        with self._lock:
            self.calls.append("patch pod")
            old = self.pods.get((namespace, name))
            if old is None:
                raise NotFound(f"pod {namespace}/{name} not found")
            pod = copy.deepcopy(old)
            body = pod_patch(annotations)["metadata"]
            meta = pod.setdefault("metadata", {})
            self._merge(meta.setdefault("annotations", {}), body["annotations"])
            self._merge(meta.setdefault("labels", {}), body.get("labels", {}))
            self._bump(pod)
            self.pods[(namespace, name)] = pod
        self._emit("pods", "MODIFIED", old, pod)

    def patch_node_annotations(
        self, name: str, annotations: dict[str, str | None], resource_version: str | None = None
    ) -> None:
        with self._lock:
            self.calls.append("patch node")
            old = self.nodes.get(name)
            if old is None:
                raise NotFound(f"node {name} not found")
            if resource_version and old["metadata"]["resourceVersion"] != resource_version:
                raise Conflict(f"node {name} changed meanwhile (409)")
            node = copy.deepcopy(old)
            self._merge(node["metadata"].setdefault("annotations", {}), dict(annotations))
            self._bump(node)
            self.nodes[name] = node
        self._emit("nodes", "MODIFIED", old, node)

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self._lock:
            self.calls.append("create binding")
            old = self.pods.get((namespace, name))
            if old is None:
                raise NotFound(f"pod {namespace}/{name} not found")
            if uid and old["metadata"].get("uid") not in (None, uid):
                raise Conflict(f"pod {namespace}/{name} has another UID (409)")
            if (old.get("spec") or {}).get("nodeName"):
                raise Conflict(f"pod {namespace}/{name} is already assigned to a node (409)")
            pod = copy.deepcopy(old)
            pod.setdefault("spec", {})["nodeName"] = node
            self.bindings.append((namespace, name, node))
            self._bump(pod)
            self.pods[(namespace, name)] = pod
        self._emit("pods", "MODIFIED", old, pod)

    def list_pods_on_node(self, node: str) -> list[Obj]:
        with self._lock:
            self.calls.append("list pods")
            return [
                copy.deepcopy(p)
                for p in self.pods.values()
                if (p.get("spec") or {}).get("nodeName") == node
            ]

    # -- Listers (the informers' caches) -------------------------------------------------

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self.pods.get((namespace, name))

    def node(self, name: str) -> Obj | None:
        return self.nodes.get(name)

    def list_nodes(self) -> list[Obj]:
        with self._lock:
            return list(self.nodes.values())

    def connect(self, scheduler: Any) -> None:
        """Feed a Scheduler as its informers would: the lists, then every change."""
        with self._lock:
            nodes = list(self.nodes.values())
            pods = list(self.pods.values())
            quotas = list(self.quotas.values())
            self._watched.append(scheduler)
        for q in quotas:
            scheduler.quota_handlers.on_add(q)
        for n in nodes:
            scheduler.node_handlers.on_add(n)
        for p in pods:
            scheduler.pod_handlers.on_add(p)
        scheduler.attach(_Listers(self))


class _Listers:
    def __init__(self, fc: FakeCluster) -> None:
        self._fc = fc

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self._fc.pod(namespace, name)

    def node(self, name: str) -> Obj | None:
        return self._fc.node(name)

    def nodes(self) -> list[Obj]:
        return self._fc.list_nodes()
