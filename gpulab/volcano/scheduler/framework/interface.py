"""What a session needs from the outside, and what plugins and actions are.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/framework/interface.go`` (``Action``:
Name/Initialize/Execute/UnInitialize, ``Plugin``: Name/OnSessionOpen/OnSessionClose),
``event.go`` (``Event``, ``EventHandler`` with AllocateFunc / DeallocateFunc) and the part
of ``pkg/scheduler/cache/interface.go`` a session calls (``AddBindTask``, ``Evict``,
``UpdateJobStatus``, ``UpdateQueueStatus``, ``RecordPodGroupEvent``).

The cache is the only I/O a session reaches; unit tests pass a fake one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo

if TYPE_CHECKING:
    from gpulab.volcano.scheduler.conf import Arguments
    from gpulab.volcano.scheduler.framework.session import Session


@dataclass
class ClusterInfo:
    """What cache.Snapshot() hands a new session (api.ClusterInfo)."""

    jobs: dict[str, JobInfo]
    nodes: dict[str, NodeInfo]
    queues: dict[str, QueueInfo]
    # k8s-style view of the same nodes for the in-tree predicates and scores
    pods: list[Mapping[str, Any]]


class Cache(Protocol):
    def add_bind_task(self, task: TaskInfo) -> None:
        """Bind ``task`` to ``task.node_name`` (asynchronously)."""

    def evict(self, task: TaskInfo, reason: str) -> None:
        """Delete the pod of ``task`` (asynchronously), recording ``reason``."""

    def update_job_status(self, job: JobInfo, update_pg: bool) -> None:
        """Write the PodGroup back when ``update_pg`` and record the job's Events and pod
        conditions (UpdateJobStatus + RecordJobStatusEvent)."""

    def update_queue_status(self, queue: QueueInfo, allocated: Mapping[str, str]) -> None:
        """Write ``status.allocated`` of a queue."""

    def record_pod_group_event(self, job: JobInfo, warning: bool, reason: str, msg: str) -> None:
        """An Event on the job's PodGroup."""


@dataclass
class Event:
    task: TaskInfo
    err: Exception | None = None


@dataclass
class EventHandler:
    allocate: Callable[[Event], None] | None = None
    deallocate: Callable[[Event], None] | None = None


class Plugin(Protocol):
    name: str

    def on_session_open(self, ssn: Session) -> None: ...

    def on_session_close(self, ssn: Session) -> None: ...


class Action(Protocol):
    name: str

    def execute(self, ssn: Session) -> None: ...


PluginBuilder = Callable[["Arguments"], Plugin]
