"""The Kubernetes calls the extender makes and the informers that feed it: the I/O edge.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/util/client`` and the ``pkg/util`` helpers
(``PatchPodAnnotations`` — which also labels the pod ``hami.io/vgpu-node`` —,
``PatchNodeAnnotations``, ``RemoveNodeAnnotation``, ``Pods().Bind``) and the informer set-up
of ``Scheduler.Start`` (pods, nodes and ResourceQuotas through ``gpulab.informer``, which
plays client-go's SharedInformerFactory; Bind reads pods and nodes from the informers'
stores, as upstream reads its listers). ``gpulab.hami.fake.FakeCluster`` implements the same
two protocols in memory for tests. Objects are the JSON dicts the API server serves.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any, NoReturn, Protocol

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.informer import NODES, PODS, Handlers, Informer, ListWatch, Resource
from gpulab.kube import drain

RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")
ASSIGNED_NODE_LABEL = "hami.io/vgpu-node"
_MERGE_PATCH = "application/merge-patch+json"


class ClusterError(RuntimeError):
    """An API call failed."""


class NotFound(ClusterError):
    pass


class Conflict(ClusterError):
    """The object changed since it was read (HTTP 409): re-read and retry."""


class Cluster(Protocol):
    """The API calls (``client.GetClient()`` in HAMi)."""

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

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """Pods with ``spec.nodeName`` = node (the device plugin's fallback search)."""
        ...


class Listers(Protocol):
    """The informers' caches (``podLister``, ``nodeLister``)."""

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def node(self, name: str) -> dict[str, Any] | None: ...

    def nodes(self) -> list[dict[str, Any]]: ...


class Watched(Protocol):
    """What the informers call: ``Scheduler`` implements it."""

    pod_handlers: Handlers
    node_handlers: Handlers
    quota_handlers: Handlers


def _raise(exc: ApiException, what: str) -> NoReturn:
    if exc.status == 404:
        raise NotFound(f"{what} not found") from exc
    if exc.status == 409:
        raise Conflict(f"{what} changed meanwhile (409)") from exc
    raise ClusterError(f"{what}: HTTP {exc.status} {exc.reason}") from exc


def pod_patch(annotations: dict[str, str | None]) -> dict[str, Any]:
    """``util.PatchPodAnnotations``' body: setting ``hami.io/vgpu-node`` labels the pod too."""
    meta: dict[str, Any] = {"annotations": annotations}
    node = annotations.get(ASSIGNED_NODE_LABEL)
    if node:
        meta["labels"] = {ASSIGNED_NODE_LABEL: node}
    return {"metadata": meta}


class KubeCluster:
    """``Cluster`` over the official kubernetes client."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with _api_call(f"pod {namespace}/{name}"):
            return _body(self.core.read_namespaced_pod(name, namespace, _preload_content=False))

    def get_node(self, name: str) -> dict[str, Any]:
        with _api_call(f"node {name}"):
            return _body(self.core.read_node(name, _preload_content=False))

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        with _api_call(f"pod {namespace}/{name}"):
            drain(
                self.core.patch_namespaced_pod(
                    name,
                    namespace,
                    pod_patch(annotations),
                    _content_type=_MERGE_PATCH,
                    _preload_content=False,
                )
            )

    def patch_node_annotations(
        self, name: str, annotations: dict[str, str | None], resource_version: str | None = None
    ) -> None:
        meta: dict[str, Any] = {"annotations": annotations}
        if resource_version:
            # A merge patch carrying resourceVersion is a compare-and-swap: the API
            # server answers 409 if the node changed, as HAMi's nodelock relies on.
            meta["resourceVersion"] = resource_version
        with _api_call(f"node {name}"):
            drain(
                self.core.patch_node(
                    name, {"metadata": meta}, _content_type=_MERGE_PATCH, _preload_content=False
                )
            )

    def create_binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, **({"uid": uid} if uid else {})},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        with _api_call(f"binding of pod {namespace}/{name}"):
            drain(self.core.create_namespaced_binding(namespace, body, _preload_content=False))

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        with _api_call(f"pods on node {node}"):
            resp = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False
            )
            return list(_body(resp).get("items") or [])


@contextlib.contextmanager
def _api_call(what: str) -> Iterator[None]:
    """An API call's failures as ClusterError: the API server's answer (ApiException) and
    no answer at all (refused, reset or cut short while it restarts: urllib3's errors),
    as client-go returns both as an ``error`` for HAMi to handle."""
    try:
        yield
    except ApiException as exc:
        _raise(exc, what)
    except urllib3.exceptions.HTTPError as exc:
        raise ClusterError(f"{what}: {exc}") from exc


class StoreListers:
    """``Listers`` over the informers' stores."""

    def __init__(self, pods: Informer, nodes: Informer) -> None:
        self._pods, self._nodes = pods, nodes

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._pods.store.get(f"{namespace}/{name}")

    def node(self, name: str) -> dict[str, Any] | None:
        return self._nodes.store.get(name)

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes.store.list()


def start_informers(
    api: client.ApiClient, watched: Watched, timeout: float
) -> tuple[StoreListers, list[Informer]]:
    """``Scheduler.Start``: pod, node and ResourceQuota informers, then wait for sync.

    Returns the listers and the informers (to stop them); raises ClusterError when they
    have not synced within ``timeout`` seconds."""
    informers = [
        Informer(ListWatch(api, PODS), watched.pod_handlers, name="hami-pods"),
        Informer(ListWatch(api, NODES), watched.node_handlers, name="hami-nodes"),
        Informer(ListWatch(api, RESOURCE_QUOTAS), watched.quota_handlers, name="hami-quotas"),
    ]
    for inf in informers:
        inf.start()
    for inf in informers:
        if not inf.wait_for_sync(timeout):
            for other in informers:
                other.stop()
            raise ClusterError(
                f"the {inf.lw} informer did not sync within {timeout:g}s: is the API server "
                "reachable and may this identity list and watch it (manifests/hami/rbac.yaml)?"
            )
    return StoreListers(informers[0], informers[1]), informers


def _body(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data)  # read to the end: the connection goes back to the pool
