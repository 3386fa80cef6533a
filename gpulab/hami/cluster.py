"""The Kubernetes calls the extender makes, behind one small interface.

HAMi reaches the API server through ``pkg/util/client`` and ``pkg/util`` helpers
(``PatchPodAnnotations``, ``PatchNodeAnnotations``, ``Pods().Bind``); this module is that
edge. ``KubeCluster`` talks to a real API server with the official client;
``gpulab.hami.fake.FakeCluster`` keeps the same objects in memory for tests.
Objects travel as the JSON dicts the API server serves (camelCase keys).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

_log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """An API call failed."""


class NotFound(ClusterError):
    pass


class Conflict(ClusterError):
    """The object changed since it was read (HTTP 409): re-read and retry."""


class Cluster(Protocol):
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None: ...

    def patch_node_annotations(
        self, name: str, annotations: dict[str, str | None], resource_version: str | None = None
    ) -> None:
        """Merge-patch annotations; with ``resource_version`` fail with Conflict if stale."""
        ...

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None: ...


def _raise(exc: ApiException, what: str) -> None:
    if exc.status == 404:
        raise NotFound(f"{what} not found") from exc
    if exc.status == 409:
        raise Conflict(f"{what} changed meanwhile (409)") from exc
    raise ClusterError(f"{what}: HTTP {exc.status} {exc.reason}") from exc


class KubeCluster:
    """``Cluster`` over the official kubernetes client, plus the list+watch feeds that
    stand in for client-go informers."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return _body(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            _raise(exc, f"pod {namespace}/{name}")
            raise

    def get_node(self, name: str) -> dict[str, Any]:
        try:
            return _body(self.core.read_node(name, _preload_content=False))
        except ApiException as exc:
            _raise(exc, f"node {name}")
            raise

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        body = {"metadata": {"annotations": annotations}}
        try:
            self.core.patch_namespaced_pod(name, namespace, body, _content_type=_MERGE_PATCH)
        except ApiException as exc:
            _raise(exc, f"pod {namespace}/{name}")

    def patch_node_annotations(
        self, name: str, annotations: dict[str, str | None], resource_version: str | None = None
    ) -> None:
        meta: dict[str, Any] = {"annotations": annotations}
        if resource_version:
            # A merge patch carrying resourceVersion is a compare-and-swap: the API
            # server answers 409 if the node changed, as HAMi's nodelock relies on.
            meta["resourceVersion"] = resource_version
        try:
            self.core.patch_node(name, {"metadata": meta}, _content_type=_MERGE_PATCH)
        except ApiException as exc:
            _raise(exc, f"node {name}")

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, uid=uid or None),
            target=client.V1ObjectReference(kind="Node", name=node, api_version="v1"),
        )
        try:
            self.core.create_namespaced_binding(namespace, body)
        except ApiException as exc:
            _raise(exc, f"binding of pod {namespace}/{name}")
        except ValueError as exc:
            # The API server answers a Binding POST with a Status, which the generated
            # client fails to read back as a V1Binding ("target ... required"): the
            # Binding was created all the same.
            if "target" not in str(exc):
                raise

    def list_and_watch(
        self,
        kind: str,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        stop: threading.Event,
    ) -> None:
        """An informer: list, hand over the items, then watch; re-list when the watch
        expires (410) or drops. Runs until ``stop`` is set."""
        list_fn = {
            "pods": self.core.list_pod_for_all_namespaces,
            "nodes": self.core.list_node,
        }[kind]
        while not stop.is_set():
            try:
                listing = _body(list_fn(_preload_content=False))
                on_list(listing.get("items") or [])
                rv = listing.get("metadata", {}).get("resourceVersion")
                w = watch.Watch()
                for ev in w.stream(
                    list_fn, resource_version=rv, timeout_seconds=300, deserialize=False
                ):
                    if stop.is_set():
                        w.stop()
                        break
                    obj = ev.get("object") or ev.get("raw_object")
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED") and obj:
                        on_event(ev["type"], obj)
            except Exception as exc:  # API server restarts must not end the informer
                _log.warning("%s informer: %s; re-listing in 2 s", kind, exc)
                stop.wait(2.0)


_MERGE_PATCH = "application/merge-patch+json"


def _body(resp: Any) -> dict[str, Any]:
    data = resp.data if hasattr(resp, "data") else resp.read()
    return json.loads(data)
