"""drf: Dominant Resource Fairness between jobs.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/drf/drf.go`` without hierarchy:
a job's share is its largest allocated/total ratio over the cluster's resources
(``calculateShare``); jobs with the smaller share go first (job order); ``Preemptable``
lets a task evict tasks of jobs whose share, after giving them up, stays at least the
preemptor's (within 1e-6); the shares follow each allocation and eviction through the
session's event handlers.

Lab difference: ``enableHierarchy`` (hierarchical DRF over queues) is not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo, allocated_status
from gpulab.volcano.scheduler.api.resource_info import Resource, share
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.interface import Event, EventHandler
from gpulab.volcano.scheduler.framework.session import PERMIT, Session

NAME = "drf"
SHARE_DELTA = 0.000001


@dataclass
class DrfAttr:
    allocated: Resource = field(default_factory=Resource)
    share: float = 0.0
    dominant: str = ""


def calculate_share(allocated: Resource, total: Resource) -> tuple[str, float]:
    best, dominant = 0.0, ""
    for name in total.resource_names():
        s = share(allocated.get(name), total.get(name))
        if s > best:
            best, dominant = s, name
    return dominant, best


class DrfPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.total = Resource()
        self.job_attrs: dict[str, DrfAttr] = {}

    def _update(self, attr: DrfAttr) -> None:
        attr.dominant, attr.share = calculate_share(attr.allocated, self.total)

    def on_session_open(self, ssn: Session) -> None:
        self.total = ssn.total_resource.clone()
        for job in ssn.jobs.values():
            attr = DrfAttr()
            for status, tasks in job.task_status_index.items():
                if allocated_status(status):
                    for t in tasks.values():
                        attr.allocated.add(t.resreq)
            self._update(attr)
            self.job_attrs[job.uid] = attr

        def preemptable(
            preemptor: TaskInfo, preemptees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            latt = self.job_attrs.get(preemptor.job)
            if latt is None:
                return [], PERMIT
            _, ls = calculate_share(latt.allocated.clone().add(preemptor.resreq), self.total)
            allocations: dict[str, Resource] = {}
            victims = []
            for preemptee in preemptees:
                ratt = self.job_attrs.get(preemptee.job)
                if ratt is None:
                    continue
                ralloc = allocations.setdefault(preemptee.job, ratt.allocated.clone())
                ralloc.sub(preemptee.resreq)
                _, rs = calculate_share(ralloc, self.total)
                if ls < rs or abs(ls - rs) <= SHARE_DELTA:
                    victims.append(preemptee)
            return victims, PERMIT

        ssn.add_preemptable_fn(NAME, preemptable)

        def job_order(left: JobInfo, right: JobInfo) -> int:
            ls, rs = self.job_attrs[left.uid].share, self.job_attrs[right.uid].share
            if ls == rs:
                return 0
            return -1 if ls < rs else 1

        ssn.add_job_order_fn(NAME, job_order)

        def on_allocate(event: Event) -> None:
            attr = self.job_attrs.get(event.task.job)
            if attr is not None:
                attr.allocated.add(event.task.resreq)
                self._update(attr)

        def on_deallocate(event: Event) -> None:
            attr = self.job_attrs.get(event.task.job)
            if attr is not None:
                attr.allocated.sub(event.task.resreq)
                self._update(attr)

        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))

    def on_session_close(self, ssn: Session) -> None:
        self.total = Resource()
        self.job_attrs = {}
