"""The node agent's API-server side (:class:`manager.NodeAPI` over the official client).

What kubelet does through its node status updater (capacity/allocatable of device-plugin
resources via the status subresource), its pod informer (``spec.nodeName`` field selector)
and its status manager (a rejected pod becomes ``Failed`` / ``UnexpectedAdmissionError``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from kubernetes import client, watch

_WATCH_SECONDS = 30


class KubeNodeAPI:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._core = client.CoreV1Api(api)

    def patch_node_resources(
        self, node: str, capacity: dict[str, str], allocatable: dict[str, str]
    ) -> None:
        body = {"status": {"capacity": capacity, "allocatable": allocatable}}
        self._core.patch_node_status(node, body)

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        items = [self._api.sanitize_for_serialization(p) for p in pods.items]
        return items, pods.metadata.resource_version

    def watch_pods(
        self, node: str, resource_version: str, stop: threading.Event
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        w = watch.Watch()
        stream = w.stream(
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
            resource_version=resource_version,
            timeout_seconds=_WATCH_SECONDS,
        )
        for event in stream:
            if stop.is_set():
                w.stop()
                return
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                yield event["type"], self._api.sanitize_for_serialization(event["object"])

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})

    def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> None:
        body = {"status": {"phase": "Failed", "reason": reason, "message": message}}
        self._core.patch_namespaced_pod_status(name, namespace, body)
