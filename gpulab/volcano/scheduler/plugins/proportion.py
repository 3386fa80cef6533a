"""proportion: queues share the cluster by weight; an over-share queue gives back.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/plugins/proportion/proportion.go``:

``OnSessionOpen`` works out, for every queue that has jobs, ``allocated`` (its tasks
holding nodes), ``request`` (those plus its pending tasks), ``inqueue`` (the unallocated
part of its Inqueue/Running jobs' minResources), ``elastic``, ``capability`` and
``realCapability`` (the cluster minus other queues' ``guarantee``, capped by
``capability``). Then ``deserved`` is dealt out in rounds: each unsatisfied queue gets
``remaining * weight / total weight``, capped by its realCapability and its request
(and at least its guarantee); a queue whose request is met, or whose deserved stopped
growing, leaves the deal; what it did not need goes back to the pot for the next round.

It registers:
- queue order: higher ``spec.priority``, then the smaller share (allocated / deserved);
- ``Overused``: deserved <= allocated - allocate skips such a queue;
- ``Allocatable`` / ``Preemptive``: allocated + the task(s) stays within deserved (and
  the queue is Open);
- ``Reclaimable``: victims only while their queue's allocated exceeds its deserved;
- ``JobEnqueueable``: the queue is Open and minResources + allocated + inqueue - elastic
  fits its realCapability (else an Event "queue resource quota insufficient: ...");
- event handlers keeping ``allocated`` and the share current during the session.

Lab difference: the simulate* functions of the unified eviction (gangpreempt /
gangreclaim actions, not in the lab) are not registered.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo, TaskStatus, allocated_status
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.api.resource_info import (
    CPU,
    INFINITY,
    MEMORY,
    PODS,
    ZERO,
    Resource,
    exceeded_part,
    is_count_quota,
    is_scalar_resource_name,
    res_max,
    share,
)
from gpulab.volcano.scheduler.conf import Arguments
from gpulab.volcano.scheduler.framework.interface import Event, EventHandler
from gpulab.volcano.scheduler.framework.session import PERMIT, REJECT, Session

NAME = "proportion"
MAX_FLOAT = sys.float_info.max


@dataclass
class QueueAttr:
    queue_id: str
    name: str
    weight: int
    share: float = 0.0
    deserved: Resource = field(default_factory=Resource)
    allocated: Resource = field(default_factory=Resource)
    request: Resource = field(default_factory=Resource)
    elastic: Resource = field(default_factory=Resource)
    inqueue: Resource = field(default_factory=Resource)
    capability: Resource | None = None
    real_capability: Resource = field(default_factory=Resource)
    guarantee: Resource = field(default_factory=Resource)

    def update_share(self) -> None:
        """updateQueueAttrShare: the largest allocated/deserved over deserved's resources."""
        self.share = max(
            (
                share(self.allocated.get(n), self.deserved.get(n))
                for n in self.deserved.resource_names()
            ),
            default=0.0,
        )


def inqueue_resource(job: JobInfo, allocated: Resource) -> Resource:
    """plugins/util GetInqueueResource: the part of minResources not yet allocated."""
    min_list = ((job.pod_group or {}).get("spec") or {}).get("minResources") or {}
    mins = Resource.from_list(min_list)
    out = Resource()
    for name in min_list:
        if name == CPU:
            out.milli_cpu = max(mins.milli_cpu - allocated.milli_cpu, 0.0)
        elif name == MEMORY:
            out.memory = max(mins.memory - allocated.memory, 0.0)
        elif name == PODS:
            reserved = mins.scalar.get(PODS, 0.0) - allocated.scalar.get(PODS, 0.0)
            if reserved > 0:
                out.scalar[PODS] = reserved
        elif not is_count_quota(name) and is_scalar_resource_name(name):
            reserved = mins.scalar.get(name, 0.0)
            if name not in allocated.scalar:
                out.scalar[name] = reserved
            elif reserved - allocated.scalar[name] > 0:
                out.scalar[name] = reserved - allocated.scalar[name]
    return out


def format_resource_names(prefix: str, verb: str, names: list[str]) -> str:
    """plugins/util FormatResourceNames."""
    if not names:
        return prefix
    return f"{prefix}: {', '.join(f'{verb} {n}' for n in names)}"


def calculate_deserved(attrs: list[QueueAttr], total: Resource) -> None:
    """Deal ``total`` out to the queues by weight, in rounds (see the module docstring)."""
    remaining = total.clone()
    meet: set[str] = set()
    while True:
        total_weight = sum(a.weight for a in attrs if a.queue_id not in meet)
        if total_weight == 0:
            break
        old_remaining = remaining.clone()
        increased, decreased = Resource(), Resource()
        for attr in attrs:
            if attr.queue_id in meet:
                continue
            old = attr.deserved.clone()
            attr.deserved.add(remaining.clone().multi(attr.weight / total_weight))
            attr.deserved.min_dimension_resource(attr.real_capability, INFINITY)
            attr.deserved.min_dimension_resource(attr.request, ZERO)
            attr.deserved = res_max(attr.deserved, attr.guarantee)
            attr.update_share()
            if attr.request.less_equal(attr.deserved, ZERO) or attr.deserved == old:
                meet.add(attr.queue_id)
            inc, dec = attr.deserved.diff(old, ZERO)
            increased.add(inc)
            decreased.add(dec)
        remaining = exceeded_part(remaining.clone().add(decreased), increased)
        if remaining.is_empty() or remaining == old_remaining:
            break


class ProportionPlugin:
    name = NAME

    def __init__(self, arguments: Arguments) -> None:
        self.arguments = arguments
        self.queue_opts: dict[str, QueueAttr] = {}

    def on_session_open(self, ssn: Session) -> None:
        total = ssn.total_resource.clone()
        total_guarantee = Resource()
        for queue in ssn.queues.values():
            guarantee = (queue.spec.get("guarantee") or {}).get("resource")
            if guarantee:
                total_guarantee.add(Resource.from_list(guarantee))
        for job in ssn.jobs.values():
            attr = self.queue_opts.get(job.queue)
            if attr is None:
                attr = self._new_attr(ssn.queues[job.queue], total, total_guarantee)
                self.queue_opts[job.queue] = attr
            for status, tasks in job.task_status_index.items():
                for t in tasks.values():
                    if allocated_status(status):
                        attr.allocated.add(t.resreq)
                        attr.request.add(t.resreq)
                    elif status == TaskStatus.PENDING:
                        attr.request.add(t.resreq)
            if job.has_min_resources() and (
                job.phase == apis.PG_INQUEUE
                or (job.phase == apis.PG_RUNNING and job.allocated_task_num() >= job.min_available)
            ):
                attr.inqueue.add(inqueue_resource(job, job.allocated))
            attr.elastic.add(job.elastic_resources())
        calculate_deserved(list(self.queue_opts.values()), total)
        self._register(ssn)

    def _new_attr(self, queue: QueueInfo, total: Resource, total_guarantee: Resource) -> QueueAttr:
        attr = QueueAttr(queue.uid, queue.name, queue.weight)
        capability = queue.spec.get("capability")
        if capability:
            attr.capability = Resource.from_list(capability)
            if attr.capability.milli_cpu <= 0:
                attr.capability.milli_cpu = MAX_FLOAT
            if attr.capability.memory <= 0:
                attr.capability.memory = MAX_FLOAT
        guarantee = (queue.spec.get("guarantee") or {}).get("resource")
        if guarantee:
            attr.guarantee = Resource.from_list(guarantee)
        attr.real_capability = exceeded_part(total, total_guarantee).add(attr.guarantee)
        if attr.capability is not None:
            attr.real_capability.min_dimension_resource(attr.capability, INFINITY)
        return attr

    def _register(self, ssn: Session) -> None:
        opts = self.queue_opts

        def queue_order(left: QueueInfo, right: QueueInfo) -> int:
            if left.priority != right.priority:
                return right.priority - left.priority
            ls, rs = opts[left.uid].share, opts[right.uid].share
            if ls == rs:
                return 0
            return -1 if ls < rs else 1

        ssn.add_queue_order_fn(NAME, queue_order)

        def reclaimable(
            _reclaimer: TaskInfo, reclaimees: list[TaskInfo]
        ) -> tuple[list[TaskInfo], int]:
            victims: list[TaskInfo] = []
            allocations: dict[str, Resource] = {}
            for reclaimee in reclaimees:
                job = ssn.jobs.get(reclaimee.job)
                attr = opts.get(job.queue) if job else None
                if job is None or attr is None:
                    continue
                allocated = allocations.setdefault(job.queue, attr.allocated.clone())
                if not allocated.less_equal(attr.deserved, ZERO):
                    allocated.sub(reclaimee.resreq)
                    victims.append(reclaimee)
            return victims, PERMIT

        ssn.add_reclaimable_fn(NAME, reclaimable)
        ssn.add_overused_fn(
            NAME, lambda q: opts[q.uid].deserved.less_equal(opts[q.uid].allocated, ZERO)
        )

        def queue_allocatable(queue: QueueInfo, candidates: list[TaskInfo]) -> bool:
            if queue.state != apis.QUEUE_OPEN:
                return False
            attr = opts[queue.uid]
            request = Resource()
            for task in candidates:
                request.add(task.resreq)
            future = attr.allocated.clone().add(request)
            return future.less_equal_with_dimension(attr.deserved, request)[0]

        ssn.add_allocatable_fn(NAME, lambda q, t: queue_allocatable(q, [t]))
        ssn.add_preemptive_fn(NAME, queue_allocatable)

        def enqueueable(job: JobInfo) -> int:
            attr, queue = opts[job.queue], ssn.queues[job.queue]
            if queue.state != apis.QUEUE_OPEN:
                return REJECT
            if not job.has_min_resources():
                return PERMIT
            min_req = job.min_resources()
            wanted = min_req.clone().add(attr.allocated).add(attr.inqueue).sub(attr.elastic)
            fits, names = wanted.less_equal_with_dimension(attr.real_capability, min_req)
            if fits:
                attr.inqueue.add(min_req)
                return PERMIT
            ssn.cache.record_pod_group_event(
                job,
                False,
                apis.PG_UNSCHEDULABLE_TYPE,
                format_resource_names("queue resource quota insufficient", "insufficient", names),
            )
            return REJECT

        ssn.add_job_enqueueable_fn(NAME, enqueueable)

        def on_allocate(event: Event) -> None:
            job = ssn.jobs.get(event.task.job)
            attr = opts.get(job.queue) if job else None
            if attr is not None:
                attr.allocated.add(event.task.resreq)
                attr.update_share()

        def on_deallocate(event: Event) -> None:
            job = ssn.jobs.get(event.task.job)
            attr = opts.get(job.queue) if job else None
            if attr is not None:
                attr.allocated.sub(event.task.resreq)
                attr.update_share()

        ssn.add_event_handler(EventHandler(on_allocate, on_deallocate))

    def on_session_close(self, ssn: Session) -> None:
        self.queue_opts = {}
