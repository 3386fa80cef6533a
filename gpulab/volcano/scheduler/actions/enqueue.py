"""enqueue: let Pending PodGroups into their queue (Pending -> Inqueue).

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/actions/enqueue/enqueue.go``: queues in
queue order, each queue's Pending jobs in job order, one job per turn; a job without
``minResources``, or one every ``JobEnqueueable`` vote permits (proportion: the queue is
Open and has room under its capability; overcommit: the cluster has room), becomes
Inqueue and ``JobEnqueued`` books it. The job controller creates a vcjob's pods only
once its PodGroup is Inqueue.
"""

from __future__ import annotations

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import JobInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.util import PriorityQueue

NAME = "enqueue"


class Enqueue:
    name = NAME

    def execute(self, ssn: Session) -> None:
        queues: PriorityQueue[QueueInfo] = PriorityQueue(ssn.queue_order_fn)
        seen: set[str] = set()
        jobs_map: dict[str, PriorityQueue[JobInfo]] = {}
        for job in ssn.jobs.values():
            queue = ssn.queues.get(job.queue)
            if queue is None:
                continue
            if queue.uid not in seen:
                seen.add(queue.uid)
                queues.push(queue)
            if job.is_pending():
                jobs_map.setdefault(job.queue, PriorityQueue(ssn.job_order_fn)).push(job)
        while not queues.empty():
            queue = queues.pop()
            jobs = jobs_map.get(queue.uid)
            if jobs is None or jobs.empty():
                continue
            job = jobs.pop()
            if not job.has_min_resources() or ssn.job_enqueueable(job):
                ssn.job_enqueued(job)
                assert job.pod_group is not None
                job.pod_group.setdefault("status", {})["phase"] = apis.PG_INQUEUE
                ssn.record(NAME, job.uid, f"PodGroup Pending -> Inqueue (queue {job.queue})")
            else:
                ssn.record(NAME, job.uid, f"stays Pending: queue {job.queue} has no room", True)
            queues.push(queue)
