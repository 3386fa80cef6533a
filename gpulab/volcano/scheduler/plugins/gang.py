"""gang: a job runs with at least minAvailable tasks, or not at all.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/gang/gang.go``:
- ``JobValid``: enough valid pods overall ("Not enough valid tasks for gang-scheduling,
  valid: x, min: y", reason NotEnoughTasks) and per task (``minTaskMember``);
- ``JobReady``: ready tasks (Allocated, Binding, Bound, Running, Succeeded) reach
  minAvailable - allocate commits a job's Statement only then;
- ``JobPipelined``: ready plus pipelined reach it (Permit / Reject);
- ``JobStarving``: ready plus pipelined are still short of it (reclaim and preempt act
  for starving jobs only);
- job order: a job that is not ready yet goes before a ready one;
- ``Preemptable`` / ``Reclaimable``: only tasks beyond a victim job's minAvailable;
- ``OnSessionClose``: each unready job gets the PodGroup condition ``Unschedulable``
  (reason NotEnoughResources, "x/y tasks in gang unschedulable: <FitError>"), each
  ready one ``Scheduled``.

Lab difference: no sub-group (subJob) functions, no unified eviction (gangpreempt /
gangreclaim actions are not in the lab).
"""

from __future__ import annotations

import datetime as dt

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import (
    JobInfo,
    TaskInfo,
    TaskStatus,
    ValidateResult,
    allocated_status,
)
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.session import PERMIT, REJECT, Session

NAME = "gang"


def valid_job(job: JobInfo) -> ValidateResult | None:
    if not job.check_task_valid():
        return ValidateResult(
            False,
            apis.NOT_ENOUGH_PODS_OF_TASK_REASON,
            "Not enough valid pods of each task for gang-scheduling",
        )
    valid = job.valid_task_num()
    if valid < job.min_available:
        return ValidateResult(
            False,
            apis.NOT_ENOUGH_PODS_REASON,
            f"Not enough valid tasks for gang-scheduling, valid: {valid}, min: {job.min_available}",
        )
    return None


def job_ready(job: JobInfo) -> bool:
    return job.check_task_ready() and job.is_ready()


def job_pipelined(job: JobInfo) -> int:
    return PERMIT if job.check_task_pipelined() and job.is_pipelined() else REJECT


def unready_task_count(job: JobInfo) -> int:
    """minAvailable minus the tasks that could be placed (ready, or allocated in a
    discarded Statement)."""
    schedulable = sum(
        1
        for t in job.tasks_in(TaskStatus.PENDING)
        if allocated_status((t.last_transaction or t.transaction()).status)
    )
    return job.min_available - (schedulable + job.ready_task_num())


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GangPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments

    def on_session_open(self, ssn: Session) -> None:
        ssn.add_job_valid_fn(NAME, valid_job)

        def evictable(_evictor: TaskInfo, evictees: list[TaskInfo]) -> tuple[list[TaskInfo], int]:
            victims: list[TaskInfo] = []
            occupied: dict[str, int] = {}
            for evictee in evictees:
                job = ssn.jobs.get(evictee.job)
                if job is None:
                    continue
                occupied.setdefault(job.uid, job.ready_task_num())
                if occupied[job.uid] > job.min_available:
                    occupied[job.uid] -= 1
                    victims.append(evictee)
            return victims, PERMIT

        ssn.add_reclaimable_fn(NAME, evictable)
        ssn.add_preemptable_fn(NAME, evictable)

        def job_order(left: JobInfo, right: JobInfo) -> int:
            lr, rr = left.is_ready(), right.is_ready()
            if lr == rr:
                return 0
            return 1 if lr else -1

        ssn.add_job_order_fn(NAME, job_order)
        ssn.add_job_ready_fn(NAME, job_ready)
        ssn.add_job_pipelined_fn(NAME, job_pipelined)
        ssn.add_job_starving_fn(NAME, lambda job: job.is_starving())

    def on_session_close(self, ssn: Session) -> None:
        for job in ssn.jobs.values():
            if not job.tasks:
                continue
            if not job.is_ready():
                msg = (
                    f"{unready_task_count(job)}/{len(job.tasks)} tasks in gang "
                    f"unschedulable: {job.fit_error()}"
                )
                condition = {
                    "type": apis.PG_UNSCHEDULABLE_TYPE,
                    "status": "True",
                    "lastTransitionTime": now(),
                    "transitionID": ssn.uid,
                    "reason": apis.NOT_ENOUGH_RESOURCES_REASON,
                    "message": msg,
                }
            else:
                condition = {
                    "type": apis.PG_SCHEDULED,
                    "status": "True",
                    "lastTransitionTime": now(),
                    "transitionID": ssn.uid,
                    "reason": "tasks in gang are ready to be scheduled",
                    "message": "",
                }
            ssn.update_pod_group_condition(job, condition)
