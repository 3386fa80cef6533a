"""overcommit: let jobs into the queue only while the cluster (times a factor) has room.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/overcommit/overcommit.go``:
idle = total allocatable * ``overcommit-factor`` (default 1.2) - what the nodes use;
``JobEnqueueable`` permits a job whose minResources, added to what Inqueue (and not yet
allocated Running) jobs reserve, fits that idle, else records an Event "resource in
cluster is overused: overused <resource>" and rejects; ``JobEnqueued`` books it.
"""

from __future__ import annotations

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import JobInfo
from gpulab.volcano.scheduler.api.resource_info import Resource
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.session import PERMIT, REJECT, Session
from gpulab.volcano.scheduler.plugins.proportion import format_resource_names, inqueue_resource

NAME = "overcommit"
FACTOR_KEY = "overcommit-factor"
DEFAULT_FACTOR = 1.2


class OvercommitPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.idle = Resource()
        self.inqueue = Resource()

    def on_session_open(self, ssn: Session) -> None:
        factor = self.arguments.get_float(FACTOR_KEY, DEFAULT_FACTOR)
        if factor < 1.0:
            factor = DEFAULT_FACTOR
        used = Resource()
        for node in ssn.nodes.values():
            used.add(node.used)
        self.idle = ssn.total_resource.clone().multi(factor).sub(used)
        self.inqueue = Resource()
        for job in ssn.jobs.values():
            if not job.has_min_resources():
                continue
            if job.phase == apis.PG_INQUEUE:
                self.inqueue.add(job.min_resources())
            elif job.phase == apis.PG_RUNNING and job.allocated_task_num() >= job.min_available:
                self.inqueue.add(inqueue_resource(job, job.allocated))

        def enqueueable(job: JobInfo) -> int:
            if not job.has_min_resources():
                return PERMIT
            min_req = job.min_resources()
            fits, names = (
                self.inqueue.clone().add(min_req).less_equal_with_dimension(self.idle, min_req)
            )
            if fits:
                return PERMIT
            ssn.cache.record_pod_group_event(
                job,
                False,
                apis.PG_UNSCHEDULABLE_TYPE,
                format_resource_names("resource in cluster is overused", "overused", names),
            )
            return REJECT

        def enqueued(job: JobInfo) -> None:
            if job.has_min_resources():
                self.inqueue.add(job.min_resources())

        ssn.add_job_enqueueable_fn(NAME, enqueueable)
        ssn.add_job_enqueued_fn(NAME, enqueued)

    def on_session_close(self, ssn: Session) -> None:
        self.idle = Resource()
        self.inqueue = Resource()
