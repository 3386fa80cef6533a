"""priority: higher-priority jobs and tasks first; only lower priority is preempted.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/priority/priority.go``: task
order by the pod's priority (``spec.priority``, or the ``volcano.sh/task-priority``
annotation), job order by the PodGroup's PriorityClass value, ``Preemptable`` (another
job only if its priority is lower; within a job, a lower-priority task), ``JobStarving``
(ready plus pipelined tasks short of all its tasks).
"""

from __future__ import annotations

from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.session import PERMIT, Session

NAME = "priority"


def _desc(left: int, right: int) -> int:
    """-1 when ``left`` has the higher priority (it goes first)."""
    if left == right:
        return 0
    return -1 if left > right else 1


class PriorityPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments

    def on_session_open(self, ssn: Session) -> None:
        ssn.add_task_order_fn(NAME, lambda a, b: _desc(a.priority, b.priority))
        ssn.add_job_order_fn(NAME, lambda a, b: _desc(a.priority, b.priority))

        def preemptable(
            preemptor: TaskInfo, preemptees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            preemptor_job = ssn.jobs.get(preemptor.job)
            if preemptor_job is None:
                return [], PERMIT
            victims = []
            for preemptee in preemptees:
                job = ssn.jobs.get(preemptee.job)
                if job is None:
                    continue
                if job.uid != preemptor_job.uid:
                    if job.priority < preemptor_job.priority:
                        victims.append(preemptee)
                elif preemptee.priority < preemptor.priority:
                    victims.append(preemptee)
            return victims, PERMIT

        ssn.add_preemptable_fn(NAME, preemptable)

        def starving(job: JobInfo) -> bool:
            return job.ready_task_num() + job.waiting_task_num() < len(job.tasks)

        ssn.add_job_starving_fn(NAME, starving)

    def on_session_close(self, ssn: Session) -> None:
        pass
