"""The API calls the Kueue controllers make, on plain dicts.

Every resource (the kueue CRDs and batch/v1 Jobs) goes through CustomObjectsApi,
which serves any ``/apis/<group>/<version>`` path and returns dicts, so one code path
covers them all. Status is written with PUT on the status subresource carrying the
resourceVersion read, so a stale write fails with 409 instead of overwriting.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from gpulab.kueue import api

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def _kueue(spec: tuple[str, str, bool]) -> Resource:
    kind, plural, namespaced = spec
    return Resource(api.GROUP, api.VERSION, plural, kind, namespaced)


RESOURCE_FLAVORS = _kueue(api.RESOURCE_FLAVOR)
CLUSTER_QUEUES = _kueue(api.CLUSTER_QUEUE)
LOCAL_QUEUES = _kueue(api.LOCAL_QUEUE)
WORKLOADS = _kueue(api.WORKLOAD)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
ALL = (RESOURCE_FLAVORS, CLUSTER_QUEUES, LOCAL_QUEUES, WORKLOADS, JOBS)


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


def is_conflict(exc: ApiException) -> bool:
    return exc.status == 409


def is_not_found(exc: ApiException) -> bool:
    return exc.status == 404


class KubeClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def list(self, res: Resource) -> tuple[list[Obj], str]:
        out = self._custom.list_cluster_custom_object(res.group, res.version, res.plural)
        return list(out.get("items") or []), out["metadata"]["resourceVersion"]

    def watch(self, res: Resource, resource_version: str, timeout: int = 300) -> Iterator[Obj]:
        """Watch events ({"type", "object"}) from ``resource_version``."""
        w = watch.Watch()
        yield from w.stream(
            self._custom.list_cluster_custom_object,
            res.group,
            res.version,
            res.plural,
            resource_version=resource_version,
            timeout_seconds=timeout,
            allow_watch_bookmarks=True,
        )

    def create(self, res: Resource, body: Obj) -> Obj:
        ns = body["metadata"]["namespace"]
        return self._custom.create_namespaced_custom_object(
            res.group, res.version, ns, res.plural, body
        )

    def patch(self, res: Resource, obj: Mapping[str, Any], body: Obj) -> Obj:
        """JSON merge patch of the object (spec, metadata)."""
        meta = obj["metadata"]
        if res.namespaced:
            return self._custom.patch_namespaced_custom_object(
                res.group, res.version, meta["namespace"], res.plural, meta["name"], body
            )
        return self._custom.patch_cluster_custom_object(
            res.group, res.version, res.plural, meta["name"], body
        )

    def patch_status(self, res: Resource, obj: Mapping[str, Any], body: Obj) -> Obj:
        meta = obj["metadata"]
        if res.namespaced:
            return self._custom.patch_namespaced_custom_object_status(
                res.group, res.version, meta["namespace"], res.plural, meta["name"], body
            )
        return self._custom.patch_cluster_custom_object_status(
            res.group, res.version, res.plural, meta["name"], body
        )

    def replace_status(self, res: Resource, obj: Obj) -> Obj:
        """PUT the status subresource; fails with 409 if ``obj`` is stale."""
        meta = obj["metadata"]
        if res.namespaced:
            return self._custom.replace_namespaced_custom_object_status(
                res.group, res.version, meta["namespace"], res.plural, meta["name"], obj
            )
        return self._custom.replace_cluster_custom_object_status(
            res.group, res.version, res.plural, meta["name"], obj
        )

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        return {
            ns.metadata.name: dict(ns.metadata.labels or {})
            for ns in self._core.list_namespace().items
        }

    def priority_class_value(self, name: str) -> int | None:
        try:
            pc = self._custom.get_cluster_custom_object(
                "scheduling.k8s.io", "v1", "priorityclasses", name
            )
        except ApiException as exc:
            if is_not_found(exc):
                return None
            raise
        return int(pc.get("value", 0))
