"""preempt: within a queue, a starving job evicts lower-priority work.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/actions/preempt/preempt.go``
(``Execute``, ``preempt``, ``normalPreempt``, ``taskEligibleToPreempt``): for each queue's
``JobStarving`` jobs (job order), each pending task (task order) tries the nodes passing
the preempt predicates, best-scored first; the Running/Bound preemptable tasks of other
jobs of the *same* queue are candidates, narrowed by ``Preemptable`` (priority: lower
priority only; gang: beyond minAvailable; drf: larger share; conformance: no critical
pods); victims are evicted, lowest first, until the queue may take the task and it fits
FutureIdle, and the task is pipelined there. The job's Statement is committed only if it
is then ``JobPipelined``. Then, inside each starving job, a pending task may preempt a
lower-priority task of the same job.

Lab differences: topology-aware preemption (``enableTopologyAwarePreemption``) and the
nominated-node eligibility checks are not implemented; a task with
``preemptionPolicy: Never`` never preempts.
"""

from __future__ import annotations

from collections.abc import Callable

from gpulab.volcano.scheduler.api.job_info import (
    JobInfo,
    TaskInfo,
    TaskStatus,
    preemptable_status,
)
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.framework.statement import Statement, StatementError
from gpulab.volcano.scheduler.util import (
    PredicateHelper,
    PriorityQueue,
    prioritize_nodes,
    sort_nodes,
    validate_victims,
)

NAME = "preempt"


class Preempt:
    name = NAME

    def execute(self, ssn: Session) -> None:
        self.ssn = ssn
        self.evicted: dict[str, list[TaskInfo]] = {}
        preemptors: dict[str, PriorityQueue[JobInfo]] = {}
        preemptor_tasks: dict[str, PriorityQueue[TaskInfo]] = {}
        under_request: dict[str, list[JobInfo]] = {}
        for job in ssn.jobs.values():
            if job.is_pending():
                continue
            result = ssn.job_valid(job)
            if (result is not None and not result.passed) or job.queue not in ssn.queues:
                continue
            if not ssn.job_starving(job):
                continue
            preemptors.setdefault(job.queue, PriorityQueue(ssn.job_order_fn)).push(job)
            under_request.setdefault(job.queue, []).append(job)
            pq: PriorityQueue[TaskInfo] = PriorityQueue(ssn.task_order_fn)
            for task in job.tasks_in(TaskStatus.PENDING):
                if not task.sch_gated:
                    pq.push(task)
            preemptor_tasks[job.uid] = pq
        queues: PriorityQueue[QueueInfo] = PriorityQueue(ssn.queue_order_fn)
        for name in preemptors:
            queues.push(ssn.queues[name])
        helper = PredicateHelper()
        while not queues.empty():
            queue = queues.pop()
            jobs = preemptors[queue.uid]
            while not jobs.empty():
                job = jobs.pop()
                stmt = Statement(ssn)
                assigned = False
                while ssn.job_starving(job) and not preemptor_tasks[job.uid].empty():
                    preemptor = preemptor_tasks[job.uid].pop()

                    def other_job(t: TaskInfo, p: TaskInfo = preemptor, j: JobInfo = job) -> bool:
                        owner = ssn.jobs.get(t.job)
                        return (
                            preemptable_status(t.status)
                            and not (p.best_effort and not t.best_effort)
                            and t.preemptable
                            and owner is not None
                            and owner.queue == j.queue
                            and p.job != t.job
                        )

                    assigned = self.preempt(stmt, preemptor, other_job, helper)
                if ssn.job_pipelined(job):
                    stmt.commit()
                    self._record(job)
                else:
                    stmt.discard()
                    continue
                if assigned:
                    jobs.push(job)
            for job in under_request.get(queue.uid, []):
                pending: PriorityQueue[TaskInfo] = PriorityQueue(ssn.task_order_fn)
                for task in job.tasks_in(TaskStatus.PENDING):
                    if not task.sch_gated:
                        pending.push(task)
                while not pending.empty():
                    preemptor = pending.pop()

                    def same_job(t: TaskInfo, p: TaskInfo = preemptor) -> bool:
                        return (
                            preemptable_status(t.status)
                            and not (p.best_effort and not t.best_effort)
                            and t.preemptable
                            and p.job == t.job
                        )

                    stmt = Statement(ssn)
                    if not self.preempt(stmt, preemptor, same_job, helper):
                        stmt.discard()
                        break
                    stmt.commit()
                    self._record(job)

    def _record(self, job: JobInfo) -> None:
        victims = self.evicted.pop(job.uid, [])
        if victims:
            names = ", ".join(sorted(v.key for v in victims))
            self.ssn.record(
                NAME, job.uid, f"evicted {len(victims)} lower-priority task(s) ({names})"
            )

    def preempt(
        self,
        stmt: Statement,
        preemptor: TaskInfo,
        filter_fn: Callable[[TaskInfo], bool],
        helper: PredicateHelper,
    ) -> bool:
        ssn = self.ssn
        if (preemptor.pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return False
        try:
            ssn.pre_predicate_fn(preemptor)
        except Exception:
            return False
        nodes = ssn.filter_out_unresolvable_nodes(preemptor)
        fit, _ = helper.predicate_nodes(preemptor, nodes, ssn.predicate_for_preempt_action)
        return self.normal_preempt(stmt, preemptor, filter_fn, fit)

    def normal_preempt(
        self,
        stmt: Statement,
        preemptor: TaskInfo,
        filter_fn: Callable[[TaskInfo], bool],
        fit: list[NodeInfo],
    ) -> bool:
        ssn = self.ssn
        scores = prioritize_nodes(preemptor, fit, ssn.batch_node_order_fn, ssn.node_order_fn)
        job = ssn.jobs[preemptor.job]
        queue = ssn.queues[job.queue]
        for node in sort_nodes(scores):
            preemptees = [t.clone() for t in node.tasks.values() if filter_fn(t)]
            victims = ssn.preemptable(preemptor, preemptees)
            try:
                validate_victims(preemptor, node, victims)
            except Exception:
                continue
            node_stmt = Statement(ssn)
            ordered = ssn.build_victims_priority_queue(victims, preemptor)
            chosen: list[TaskInfo] = []
            while not ordered.empty():
                if ssn.allocatable(queue, preemptor) and preemptor.init_resreq.less_equal(
                    node.future_idle()
                ):
                    break
                victim = ordered.pop()
                node_stmt.evict(victim, "preempt")
                chosen.append(victim)
            if ssn.allocatable(queue, preemptor) and preemptor.init_resreq.less_equal(
                node.future_idle()
            ):
                try:
                    node_stmt.pipeline(preemptor, node.name, bool(chosen))
                except StatementError:
                    node_stmt.discard()
                    continue
                stmt.merge(node_stmt)
                self.evicted.setdefault(job.uid, []).extend(chosen)
                return True
            node_stmt.discard()
        return False
