"""Binding a pod to a node: the Binding subresource, as kube-scheduler's DefaultBinder does.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/defaultbinder/default_binder.go``
(``Bind``: POST ``/api/v1/namespaces/<ns>/pods/<name>/binding`` with a ``v1.Binding`` whose
``metadata`` carries the pod's name and UID and whose ``target`` is the Node). The API
server sets ``spec.nodeName`` only if the pod is still unbound (409 otherwise) and copies
the Binding's annotations onto the pod (``pkg/registry/core/pod/storage/storage.go``
``setPodNodeAndMetadata``).

A stable, reusable part: :func:`binding_body` is pure; :class:`KubeBinder` is the one
place that calls the API; the Volcano chapter's ``bind`` step uses both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.errors import UserError
from gpulab.kube import drain

Obj = Mapping[str, Any]


class BindError(UserError):
    """The Binding was refused or never answered (``status`` None: the API server could
    not be reached or did not answer in time); the message says why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def binding_body(pod: Obj, node: str, annotations: Mapping[str, str] | None = None) -> dict:
    """The v1 Binding for ``pod`` -> ``node`` (annotations land on the pod)."""
    meta = pod.get("metadata") or {}
    metadata: dict[str, Any] = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


class KubeBinder:
    """POSTs Bindings through the official client (raw JSON: the generated client cannot
    read the Status the API server answers with back as a V1Binding)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    def bind(self, pod: Obj, node: str, annotations: Mapping[str, str] | None = None) -> None:
        body = binding_body(pod, node, annotations)
        meta = body["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding"
        try:
            resp = self._api.call_api(
                path,
                "POST",
                body=body,
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=30,
            )
            drain(resp)
        except ApiException as exc:
            raise BindError(
                f"binding {meta['namespace']}/{meta['name']} to {node}: {exc.status} "
                f"{_reason(exc)}",
                exc.status,
            ) from exc
        except urllib3.exceptions.HTTPError as exc:
            # an API server that is down or stalled (its etcd frozen): the caller must
            # forget the bind it assumed, as client-go's error return makes upstream do;
            # the pod watch shows whether the Binding landed after all
            raise BindError(f"binding {meta['namespace']}/{meta['name']} to {node}: {exc}") from exc


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        return str(exc.reason)
