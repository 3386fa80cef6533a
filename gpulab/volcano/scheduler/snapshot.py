"""The cache's Snapshot(): the cluster as one session sees it, built from the API objects.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/cache/event_handlers.go`` (a pod with a
``scheduling.k8s.io/group-name`` joins the JobInfo of that PodGroup; a pod on a node
counts there unless it finished; ``setPodGroup``: a PodGroup without a queue goes to the
default queue; the PriorityClass of the PodGroup gives the job its priority, the global
default class or 0 otherwise) and ``cache.go`` ``Snapshot`` (every node: ``setNodeState``
ignores node conditions, so a NotReady node's resources stay in the session's total and
only its taints keep pods off it; only jobs that have a PodGroup and whose queue exists;
pods of other schedulers only when bound).

The cache's own knowledge overlays the API objects: a task it sent to the binder is
Binding on its node until the pod shows ``spec.nodeName`` (``AddBindTask``), a task it
evicted is Releasing until the pod is gone (``Evict``).

Pure: dicts in, a ClusterInfo out. TaskInfos are parsed once per pod version
(:class:`TaskCache`) and cloned into each snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo, TaskStatus
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.interface import ClusterInfo

Obj = Mapping[str, Any]
TERMINATED = (TaskStatus.SUCCEEDED, TaskStatus.FAILED)


@dataclass
class Overlay:
    """What the cache did that the API objects may not show yet."""

    binding: dict[str, str] = field(default_factory=dict)  # pod uid -> node
    releasing: set[str] = field(default_factory=set)  # pod uids being evicted


class TaskCache:
    """TaskInfos by pod uid, parsed again only when the pod's resourceVersion changes."""

    def __init__(self) -> None:
        self._tasks: dict[str, tuple[str, TaskInfo]] = {}

    def get(self, pod: Obj) -> TaskInfo:
        meta = pod.get("metadata") or {}
        uid, rv = str(meta.get("uid")), str(meta.get("resourceVersion") or "")
        held = self._tasks.get(uid)
        if held is None or held[0] != rv or not rv:
            held = (rv, TaskInfo.of(dict(pod)))
            self._tasks[uid] = held
        return held[1].clone()

    def forget_missing(self, uids: set[str]) -> None:
        for uid in [u for u in self._tasks if u not in uids]:
            del self._tasks[uid]


def priority_of(pg: Obj, classes: Mapping[str, int], default: int) -> int:
    name = (pg.get("spec") or {}).get("priorityClassName")
    return classes.get(name, default) if name else default


def build(
    pods: Iterable[Obj],
    podgroups: Iterable[Obj],
    nodes: Iterable[Obj],
    queues: Iterable[Obj],
    *,
    priority_classes: Mapping[str, int] | None = None,
    default_priority: int = 0,
    scheduler_names: tuple[str, ...] = (apis.DEFAULT_SCHEDULER_NAME,),
    default_queue: str = apis.DEFAULT_QUEUE,
    overlay: Overlay | None = None,
    tasks: TaskCache | None = None,
) -> ClusterInfo:
    """A ClusterInfo for one session (see the module docstring)."""
    overlay = overlay or Overlay()
    tasks = tasks or TaskCache()
    classes = priority_classes or {}
    node_infos = {info.name: info for info in (NodeInfo.of(node) for node in nodes)}
    queue_infos = {q.uid: q for q in (QueueInfo.of(q) for q in queues)}
    jobs: dict[str, JobInfo] = {}
    for pg in podgroups:
        meta = pg.get("metadata") or {}
        uid = f"{meta.get('namespace')}/{meta.get('name')}"
        job = jobs.setdefault(uid, JobInfo(uid))
        job.set_pod_group(pg)
        if not job.queue:
            job.queue = default_queue
        job.priority = priority_of(pg, classes, default_priority)
    held: list[Obj] = []
    seen: set[str] = set()
    for pod in pods:
        spec = pod.get("spec") or {}
        ours = spec.get("schedulerName") in scheduler_names
        task = tasks.get(pod)
        seen.add(task.uid)
        if task.uid in overlay.binding and not task.node_name and task.status == TaskStatus.PENDING:
            task.status, task.node_name = TaskStatus.BINDING, overlay.binding[task.uid]
        if task.uid in overlay.releasing and task.status not in TERMINATED:
            task.status = TaskStatus.RELEASING
        if not ours and not task.node_name:
            continue
        if task.node_name and task.status not in TERMINATED:
            node = node_infos.get(task.node_name)
            if node is not None:
                node.add_task(task)
                held.append(pod if spec.get("nodeName") else _on(pod, task.node_name))
        if task.job:
            job = jobs.setdefault(task.job, JobInfo(task.job))
            job.add_task_info(task)
    tasks.forget_missing(seen)
    snapshot_jobs = {
        uid: job
        for uid, job in jobs.items()
        if job.pod_group is not None and job.queue in queue_infos
    }
    return ClusterInfo(snapshot_jobs, node_infos, queue_infos, held)


def _on(pod: Obj, node: str) -> Obj:
    """The pod as bound to ``node`` (what the API server will soon say)."""
    return {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": node}}
