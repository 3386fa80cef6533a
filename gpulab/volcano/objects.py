"""Queue, PodGroup and vcjob objects as the API server serves them, built in one line.

For the unit tests, the demo, the e2e tests and the benchmark (cf.
``gpulab.framework.objects``). Every object made here is also a valid manifest for the
CRDs in ``manifests/volcano/crds``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gpulab.framework.objects import make_pod
from gpulab.volcano import apis

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"


def queue(
    name: str,
    weight: int = 1,
    *,
    capability: Mapping[str, Any] | None = None,
    reclaimable: bool | None = None,
    state: str | None = apis.QUEUE_OPEN,
    priority: int | None = None,
) -> Obj:
    spec: Obj = {"weight": weight}
    if capability:
        spec["capability"] = {k: str(v) for k, v in capability.items()}
    if reclaimable is not None:
        spec["reclaimable"] = reclaimable
    if priority is not None:
        spec["priority"] = priority
    body: Obj = {
        "apiVersion": f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
        "kind": "Queue",
        "metadata": {"name": name, "uid": name},
        "spec": spec,
    }
    if state:
        body["status"] = {"state": state}
    return body


def podgroup(
    name: str,
    namespace: str = "default",
    *,
    min_member: int = 1,
    queue: str = apis.DEFAULT_QUEUE,
    min_resources: Mapping[str, Any] | None = None,
    phase: str = apis.PG_PENDING,
    priority_class: str | None = None,
    min_task_member: Mapping[str, int] | None = None,
) -> Obj:
    spec: Obj = {"minMember": min_member, "queue": queue}
    if min_resources is not None:
        spec["minResources"] = {k: str(v) for k, v in min_resources.items()}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if min_task_member:
        spec["minTaskMember"] = dict(min_task_member)
    return {
        "apiVersion": f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": spec,
        "status": {"phase": phase},
    }


def task_pod(
    group: str,
    task: str,
    index: int,
    namespace: str = "default",
    *,
    requests: Mapping[str, Any] | None = None,
    node: str | None = None,
    phase: str | None = None,
    priority: int | None = None,
    scheduler: str = apis.DEFAULT_SCHEDULER_NAME,
) -> Obj:
    """A pod of PodGroup ``group`` named ``<group>-<task>-<index>``, as the job controller
    names and annotates them."""
    return make_pod(
        apis.pod_name(group, task, index),
        namespace,
        requests=requests,
        scheduler=scheduler,
        node_name=node,
        phase=phase or ("Running" if node else "Pending"),
        priority=priority,
        annotations={apis.KUBE_GROUP_NAME_ANNOTATION: group, apis.TASK_SPEC_KEY: task},
    )


def vcjob(
    name: str,
    tasks: Sequence[Mapping[str, Any]],
    *,
    queue: str | None = None,
    min_available: int | None = None,
    policies: Sequence[Mapping[str, str]] = (),
    max_retry: int | None = None,
    priority_class: str | None = None,
    namespace: str | None = None,
) -> Obj:
    """A batch.volcano.sh/v1alpha1 Job with the given ``tasks`` (see :func:`task`)."""
    spec: Obj = {"schedulerName": apis.DEFAULT_SCHEDULER_NAME, "tasks": list(tasks)}
    if queue is not None:
        spec["queue"] = queue
    if min_available is not None:
        spec["minAvailable"] = min_available
    if policies:
        spec["policies"] = [dict(p) for p in policies]
    if max_retry is not None:
        spec["maxRetry"] = max_retry
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta: Obj = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": f"{apis.BATCH_GROUP}/{apis.BATCH_VERSION}",
        "kind": "Job",
        "metadata": meta,
        "spec": spec,
    }


def task(
    name: str,
    replicas: int,
    *,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "1Gi",
    seconds: int | None = None,
    min_available: int | None = None,
    policies: Sequence[Mapping[str, str]] = (),
    image: str = "registry.k8s.io/pause:3.10",
) -> Obj:
    """A vcjob task of ``replicas`` pods asking ``gpus`` nvidia.com/gpu each; on the local
    backend kwok completes a pod after ``seconds`` (its pod-complete Stage)."""
    requests: Obj = {"cpu": cpu, "memory": memory}
    limits: Obj = {}
    if gpus:
        requests[GPU] = str(gpus)
        limits[GPU] = str(gpus)
    container: Obj = {"name": "main", "image": image, "resources": {"requests": requests}}
    if limits:
        container["resources"]["limits"] = limits
    template: Obj = {"spec": {"containers": [container], "restartPolicy": "Never"}}
    if seconds is not None:
        template["metadata"] = {
            "annotations": {"pod-complete.stage.kwok.x-k8s.io/delay": f"{seconds}s"}
        }
    body: Obj = {"name": name, "replicas": replicas, "template": template}
    if min_available is not None:
        body["minAvailable"] = min_available
    if policies:
        body["policies"] = [dict(p) for p in policies]
    return body
