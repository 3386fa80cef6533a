"""The manager's view of the cluster: the latest copy of every watched object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpulab.kueue import workload as wlutil
from gpulab.kueue.controllers.client import (
    CLUSTER_QUEUES,
    JOBS,
    LOCAL_QUEUES,
    RESOURCE_FLAVORS,
    WORKLOADS,
    Resource,
    key_of,
)

Obj = dict[str, Any]


@dataclass
class Store:
    objects: dict[str, dict[str, Obj]] = field(
        default_factory=lambda: {
            r.plural: {} for r in (RESOURCE_FLAVORS, CLUSTER_QUEUES, LOCAL_QUEUES, WORKLOADS, JOBS)
        }
    )

    def of(self, res: Resource) -> dict[str, Obj]:
        return self.objects[res.plural]

    def put(self, res: Resource, obj: Obj) -> None:
        self.of(res)[key_of(_typed(res, obj))] = obj

    def delete(self, res: Resource, obj: Obj) -> None:
        self.of(res).pop(key_of(obj), None)

    def replace_all(self, res: Resource, items: list[Obj] | tuple[Obj, ...]) -> set[str]:
        """Replace a kind's objects (after a relist); returns every key touched."""
        old = self.of(res)
        new = {key_of(_typed(res, o)): o for o in items}
        self.objects[res.plural] = new
        return set(old) | set(new)

    @property
    def workloads(self) -> dict[str, Obj]:
        return self.of(WORKLOADS)

    @property
    def jobs(self) -> dict[str, Obj]:
        return self.of(JOBS)

    @property
    def local_queues(self) -> dict[str, Obj]:
        return self.of(LOCAL_QUEUES)

    @property
    def cluster_queues(self) -> dict[str, Obj]:
        return self.of(CLUSTER_QUEUES)

    def workload_for_job(self, job: Obj) -> Obj | None:
        uid = job["metadata"].get("uid")
        ns = job["metadata"]["namespace"]
        for wl in self.workloads.values():
            if wl["metadata"]["namespace"] == ns and wlutil.owner_job_uid(wl) == uid:
                return wl
        return None

    def job_for_workload(self, wl: Obj) -> Obj | None:
        uid = wlutil.owner_job_uid(wl)
        ns = wl["metadata"]["namespace"]
        for job in self.jobs.values():
            if job["metadata"]["namespace"] == ns and job["metadata"].get("uid") == uid:
                return job
        return None

    def cluster_queue_of(self, wl: Obj) -> str | None:
        """The ClusterQueue behind the Workload's LocalQueue, if the LocalQueue exists."""
        lq = self.local_queues.get(f"{wl['metadata']['namespace']}/{wl['spec'].get('queueName')}")
        if lq is None:
            return None
        return (lq.get("spec") or {}).get("clusterQueue")


def _typed(res: Resource, obj: Obj) -> Obj:
    """List items of built-in kinds come without apiVersion/kind; Events need them."""
    obj.setdefault("apiVersion", res.api_version)
    obj.setdefault("kind", res.kind)
    return obj
