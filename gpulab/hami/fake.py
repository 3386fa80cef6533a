"""An in-memory ``Cluster``: pods and nodes as dicts, with the API server's rules that
matter to the extender (resourceVersion compare-and-swap, one Binding per pod, 404s).

Used by the component tests and handy for running the extender without a cluster. Every
change is reported to ``watchers`` as ``(kind, event, object)``, as an informer would see it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from gpulab.hami.cluster import Conflict, NotFound

Watcher = Callable[[str, str, dict[str, Any]], None]


class FakeCluster:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rv = 0
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bindings: list[tuple[str, str, str]] = []
        self.watchers: list[Watcher] = []

    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    def _emit(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """``obj`` is a snapshot taken under the lock."""
        for w in list(self.watchers):
            w(kind, event, obj)

    def add_node(self, node: dict[str, Any]) -> None:
        with self._lock:
            node = copy.deepcopy(node)
            self._bump(node)
            snap = copy.deepcopy(node)
            self.nodes[node["metadata"]["name"]] = node
        self._emit("nodes", "ADDED", snap)

    def add_pod(self, pod: dict[str, Any]) -> None:
        with self._lock:
            pod = copy.deepcopy(pod)
            meta = pod.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            self._bump(pod)
            snap = copy.deepcopy(pod)
            self.pods[(meta["namespace"], meta["name"])] = pod
        self._emit("pods", "ADDED", snap)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self.pods.pop((namespace, name), None)
        if pod is not None:
            self._emit("pods", "DELETED", pod)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            if (namespace, name) not in self.pods:
                raise NotFound(f"pod {namespace}/{name} not found")
            return copy.deepcopy(self.pods[(namespace, name)])

    def get_node(self, name: str) -> dict[str, Any]:
        with self._lock:
            if name not in self.nodes:
                raise NotFound(f"node {name} not found")
            return copy.deepcopy(self.nodes[name])

    @staticmethod
    def _merge(obj: dict[str, Any], annotations: dict[str, str | None]) -> None:
        annos = obj.setdefault("metadata", {}).setdefault("annotations", {})
        for k, v in annotations.items():
            if v is None:
                annos.pop(k, None)
            else:
                annos[k] = v

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        with self._lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise NotFound(f"pod {namespace}/{name} not found")
            self._merge(pod, annotations)
            self._bump(pod)
            snap = copy.deepcopy(pod)
        self._emit("pods", "MODIFIED", snap)

    def patch_node_annotations(
        self, name: str, annotations: dict[str, str | None], resource_version: str | None = None
    ) -> None:
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                raise NotFound(f"node {name} not found")
            if resource_version and node["metadata"]["resourceVersion"] != resource_version:
                raise Conflict(f"node {name} changed meanwhile (409)")
            self._merge(node, annotations)
            self._bump(node)
            snap = copy.deepcopy(node)
        self._emit("nodes", "MODIFIED", snap)

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self._lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                raise NotFound(f"pod {namespace}/{name} not found")
            if uid and pod["metadata"].get("uid") not in (None, uid):
                raise Conflict(f"pod {namespace}/{name} has another UID (409)")
            if pod.setdefault("spec", {}).get("nodeName"):
                raise Conflict(f"pod {namespace}/{name} is already assigned to a node (409)")
            pod["spec"]["nodeName"] = node
            self.bindings.append((namespace, name, node))
            self._bump(pod)
            snap = copy.deepcopy(pod)
        self._emit("pods", "MODIFIED", snap)

    def connect(self, scheduler: Any) -> None:
        """Feed a Scheduler as its informers would: initial lists, then every change."""
        with self._lock:
            nodes = [copy.deepcopy(n) for n in self.nodes.values()]
            pods = [copy.deepcopy(p) for p in self.pods.values()]
        scheduler.on_nodes_listed(nodes)
        scheduler.on_pods_listed(pods)

        def watch(kind: str, event: str, obj: dict[str, Any]) -> None:
            if kind == "nodes":
                scheduler.on_node_event(event, obj)
            else:
                scheduler.on_pod_event(event, obj)

        self.watchers.append(watch)
