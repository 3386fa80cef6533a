"""The API calls the Kueue controllers make (what kubernetes-sigs/kueue v0.19.2 does
through controller-runtime's client), on plain dicts, through the official client's
connection (gpulab.kube.api_client).

Status is written with PUT on the status subresource carrying the resourceVersion
read, so a stale write fails with 409 instead of overwriting; spec and metadata with a
JSON merge patch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.informer import Resource
from gpulab.kueue import api

Obj = dict[str, Any]


def _kueue(spec: tuple[str, str, bool]) -> Resource:
    kind, plural, namespaced = spec
    return Resource(api.GROUP, api.VERSION, plural, kind, namespaced)


RESOURCE_FLAVORS = _kueue(api.RESOURCE_FLAVOR)
CLUSTER_QUEUES = _kueue(api.CLUSTER_QUEUE)
LOCAL_QUEUES = _kueue(api.LOCAL_QUEUE)
WORKLOADS = _kueue(api.WORKLOAD)
COHORTS = _kueue(api.COHORT)
ADMISSION_CHECKS = _kueue(api.ADMISSION_CHECK)
WORKLOAD_PRIORITY_CLASSES = _kueue(api.WORKLOAD_PRIORITY_CLASS)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet")
LIMIT_RANGES = Resource("", "v1", "limitranges", "LimitRange")
RESOURCE_CLAIM_TEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"
)


def is_conflict(exc: ApiException) -> bool:
    return exc.status == 409


def is_not_found(exc: ApiException) -> bool:
    return exc.status == 404


class KubeClient:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    def _path(self, res: Resource, obj: Mapping[str, Any], sub: str = "") -> str:
        meta = obj["metadata"]
        path = f"{res.path(meta.get('namespace'))}/{meta['name']}"
        return f"{path}/{sub}" if sub else path

    def _call(self, method: str, path: str, body: Any = None, patch: bool = False) -> Obj:
        headers = {"Accept": "application/json"}
        headers["Content-Type"] = "application/merge-patch+json" if patch else "application/json"
        response = self.api_client.call_api(
            path,
            method,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=30,
        )
        return json.loads(response.data)

    def get(self, res: Resource, namespace: str | None, name: str) -> Obj:
        return self._call(
            "GET", self._path(res, {"metadata": {"namespace": namespace, "name": name}})
        )

    def create(self, res: Resource, body: Obj) -> Obj:
        return self._call("POST", res.path(body["metadata"].get("namespace")), body)

    def patch(self, res: Resource, obj: Mapping[str, Any], body: Obj) -> Obj:
        """JSON merge patch of the object (spec, metadata)."""
        return self._call("PATCH", self._path(res, obj), body, patch=True)

    def patch_status(self, res: Resource, obj: Mapping[str, Any], body: Obj) -> Obj:
        return self._call("PATCH", self._path(res, obj, "status"), body, patch=True)

    def replace_status(self, res: Resource, obj: Obj) -> Obj:
        """PUT the status subresource; fails with 409 if ``obj`` is stale."""
        return self._call("PUT", self._path(res, obj, "status"), obj)

    def update(self, res: Resource, obj: Obj) -> Obj:
        """PUT the object; fails with 409 if ``obj`` is stale."""
        return self._call("PUT", self._path(res, obj), obj)

    def delete(self, res: Resource, obj: Mapping[str, Any]) -> None:
        try:
            self._call("DELETE", self._path(res, obj))
        except ApiException as exc:
            if not is_not_found(exc):
                raise
