"""The pod runner's calls to the API server (what kubelet's status manager, volume
plugins, token manager and kwok's Logs objects need), behind one small class."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from harness.podrunner.volumes import decode_secret

_log = logging.getLogger("gpulab.podrunner")
Obj = dict[str, Any]
_MERGE = "application/merge-patch+json"
KWOK_GROUP, KWOK_VERSION = "kwok.x-k8s.io", "v1alpha1"


class RunnerAPI:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def patch_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": status}, _content_type=_MERGE
        )

    def delete_pod(self, pod: Obj) -> None:
        """The final delete kubelet makes once every container has stopped."""
        meta = pod["metadata"]
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
        )
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            cm = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(cm.data or {})

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            sec = self.core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return decode_secret(sec.data)

    def token(
        self, namespace: str, service_account: str, pod: Obj, audience: str | None, seconds: int
    ) -> tuple[str, float]:
        """TokenRequest bound to the pod, as kubelet's token manager asks for it."""
        meta = pod["metadata"]
        body = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience] if audience else [],
                expiration_seconds=seconds,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
                ),
            )
        )
        out = self.core.create_namespaced_service_account_token(service_account, namespace, body)
        expiry: dt.datetime = out.status.expiration_timestamp
        return out.status.token, expiry.timestamp()

    def set_logs(self, pod: Obj, files: dict[str, tuple[str, str | None]]) -> None:
        """kwok's Logs object for the pod: container -> (current log, previous log)."""
        meta = pod["metadata"]
        body = {
            "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}",
            "kind": "Logs",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                # deleted with the pod by the garbage collector
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
                ],
            },
            "spec": {
                "logs": [
                    {
                        "containers": [name],
                        "logsFile": current,
                        **({"previousLogsFile": previous} if previous else {}),
                        "follow": True,
                    }
                    for name, (current, previous) in sorted(files.items())
                ]
            },
        }
        try:
            self.custom.patch_namespaced_custom_object(
                KWOK_GROUP,
                KWOK_VERSION,
                meta["namespace"],
                "logs",
                meta["name"],
                body,
                field_manager="gpulab-pod-runner",
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as exc:  # `kubectl logs` then does not work; the pod does
            _log.warning(
                "could not record the logs of %s/%s: %s",
                meta["namespace"],
                meta["name"],
                exc.reason,
            )
