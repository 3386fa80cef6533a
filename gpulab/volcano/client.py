"""A small client for the volcano.sh API (cf. volcano.sh/apis ``pkg/client`` and vcctl).

What the demo, the e2e tests and the benchmark do with Queues, PodGroups, vcjobs and
Commands, through the official Kubernetes client's CustomObjectsApi. ``operate_queue``
creates the bus.volcano.sh Command that ``vcctl queue operate -a open|close`` creates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.volcano import apis

Obj = dict[str, Any]
S = (apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION)
B = (apis.BATCH_GROUP, apis.BATCH_VERSION)


class VolcanoClient:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    # -- queues ----------------------------------------------------------------------------

    def create_queue(self, queue: Mapping[str, Any]) -> Obj:
        body = {**queue, "metadata": {"name": queue["metadata"]["name"]}}
        body.pop("status", None)
        return self.custom.create_cluster_custom_object(*S, "queues", body)

    def queue(self, name: str) -> Obj | None:
        try:
            return self.custom.get_cluster_custom_object(*S, "queues", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete_queue(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(*S, "queues", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def operate_queue(self, name: str, action: str, namespace: str = "default") -> Obj:
        """``vcctl queue operate``: a Command (OpenQueue / CloseQueue) targeting the queue."""
        queue = self.queue(name)
        if queue is None:
            raise LookupError(f"queue {name} not found")
        target = {
            "apiVersion": f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
            "kind": "Queue",
            "name": name,
            "uid": queue["metadata"]["uid"],
            "controller": True,
        }
        body = {
            "apiVersion": f"{apis.BUS_GROUP}/{apis.BUS_VERSION}",
            "kind": "Command",
            "metadata": {"generateName": f"{name}-{action.lower()}-", "namespace": namespace},
            "target": target,
            "action": action,
        }
        return self.custom.create_namespaced_custom_object(
            apis.BUS_GROUP, apis.BUS_VERSION, namespace, "commands", body
        )

    # -- vcjobs ----------------------------------------------------------------------------

    def create_job(self, namespace: str, job: Mapping[str, Any]) -> Obj:
        body = {**job, "metadata": {**job["metadata"], "namespace": namespace}}
        return self.custom.create_namespaced_custom_object(*B, namespace, "jobs", body)

    def job(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.custom.get_namespaced_custom_object(*B, namespace, "jobs", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def job_phase(self, namespace: str, name: str) -> str:
        job = self.job(namespace, name) or {}
        return str(((job.get("status") or {}).get("state") or {}).get("phase") or "")

    def pod_group(self, namespace: str, job: str) -> Obj | None:
        """The PodGroup of vcjob ``job`` (``<job>-<uid>``)."""
        obj = self.job(namespace, job)
        if obj is None:
            return None
        try:
            return self.custom.get_namespaced_custom_object(
                *S, namespace, "podgroups", apis.pod_group_name(obj)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pod_groups(self, namespace: str | None = None) -> list[Obj]:
        if namespace:
            listing = self.custom.list_namespaced_custom_object(*S, namespace, "podgroups")
        else:
            listing = self.custom.list_cluster_custom_object(*S, "podgroups")
        return list(listing.get("items") or [])

    def pods(self, namespace: str, job: str) -> list[client.V1Pod]:
        selector = f"{apis.JOB_NAME_KEY}={job}"
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def bound(self, namespace: str, job: str) -> int:
        """Pods of the job on a node and not being deleted."""
        return sum(
            1
            for p in self.pods(namespace, job)
            if p.spec.node_name and not p.metadata.deletion_timestamp
        )


def condition(pg: Mapping[str, Any] | None, ctype: str) -> Obj | None:
    for c in ((pg or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def phase(pg: Mapping[str, Any] | None) -> str:
    return str(((pg or {}).get("status") or {}).get("phase") or "")


def gpus(resources: Mapping[str, Any] | None) -> int:
    """nvidia.com/gpu in a ResourceList (``status.allocated`` of a Queue)."""
    return int(str((resources or {}).get("nvidia.com/gpu") or "0"))
