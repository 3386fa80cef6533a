"""reclaim: a starving job takes resources back from queues over their share.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/actions/reclaim/reclaim.go``: for each
queue (queue order, not ``Overused``), each ``JobStarving`` job (job order), each pending
task (task order, unless ``preemptionPolicy: Never``) the queue may take
(``Preemptive``): on each node passing the preempt predicates, the Running, preemptable
tasks of *other*, reclaimable queues are candidates; the plugins narrow them
(``Reclaimable``: proportion - only while that queue is over its deserved share; gang -
only beyond a job's minAvailable; conformance - no critical pods); victims are evicted,
in victim order, until the task fits the node's FutureIdle, and the task is pipelined
there. The job's Statement is committed (the evictions happen) only if the job is then
``JobPipelined``, else discarded.

Lab difference: the evictions are the cache's (a DELETE of the pod, after marking it
DisruptionTarget as upstream's evictor does).
"""

from __future__ import annotations

from gpulab.volcano.scheduler.api.job_info import JobInfo, TaskInfo, TaskStatus
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.framework.statement import Statement, StatementError
from gpulab.volcano.scheduler.util import PredicateHelper, PriorityQueue, validate_victims

NAME = "reclaim"


class Reclaim:
    name = NAME

    def execute(self, ssn: Session) -> None:
        queues: PriorityQueue[QueueInfo] = PriorityQueue(ssn.queue_order_fn)
        seen: set[str] = set()
        preemptors: dict[str, PriorityQueue[JobInfo]] = {}
        preemptor_tasks: dict[str, PriorityQueue[TaskInfo]] = {}
        for job in ssn.jobs.values():
            if job.is_pending():
                continue
            result = ssn.job_valid(job)
            if (result is not None and not result.passed) or job.queue not in ssn.queues:
                continue
            if job.queue not in seen:
                seen.add(job.queue)
                queues.push(ssn.queues[job.queue])
            if ssn.job_starving(job):
                preemptors.setdefault(job.queue, PriorityQueue(ssn.job_order_fn)).push(job)
                pq: PriorityQueue[TaskInfo] = PriorityQueue(ssn.task_order_fn)
                for task in job.tasks_in(TaskStatus.PENDING):
                    if not task.sch_gated:
                        pq.push(task)
                preemptor_tasks[job.uid] = pq
        while not queues.empty():
            queue = queues.pop()
            if ssn.overused(queue):
                continue
            jobs = preemptors.get(queue.uid)
            while jobs is not None and not jobs.empty():
                job = jobs.pop()
                stmt = Statement(ssn)
                evicted: list[TaskInfo] = []
                while ssn.job_starving(job):
                    tasks = preemptor_tasks.get(job.uid)
                    if tasks is None or tasks.empty():
                        break
                    task = tasks.pop()
                    if (task.pod.get("spec") or {}).get("preemptionPolicy") == "Never":
                        continue
                    if not ssn.preemptive(queue, [task]):
                        continue
                    try:
                        ssn.pre_predicate_fn(task)
                    except Exception:
                        continue
                    evicted.extend(self.reclaim_for_task(ssn, stmt, task, job))
                if ssn.job_pipelined(job):
                    stmt.commit()
                    if evicted:
                        victims = ", ".join(sorted(v.key for v in evicted))
                        ssn.record(
                            NAME,
                            job.uid,
                            f"evicted {len(evicted)} task(s) of over-share queues ({victims}); "
                            "JobPipelined, Statement committed",
                        )
                else:
                    stmt.discard()
                if not jobs.empty():
                    queues.push(queue)

    @staticmethod
    def reclaim_for_task(
        ssn: Session, stmt: Statement, task: TaskInfo, job: JobInfo
    ) -> list[TaskInfo]:
        """Evict enough on one node for ``task`` and pipeline it there; the victims."""
        nodes = ssn.filter_out_unresolvable_nodes(task)
        fit, _ = PredicateHelper().predicate_nodes(task, nodes, ssn.predicate_for_preempt_action)
        for node in fit:
            reclaimees = []
            for on_node in node.tasks.values():
                if on_node.status != TaskStatus.RUNNING or not on_node.preemptable:
                    continue
                owner = ssn.jobs.get(on_node.job)
                if owner is None or owner.queue == job.queue:
                    continue
                if not ssn.queues[owner.queue].reclaimable():
                    continue
                reclaimees.append(on_node.clone())
            if not reclaimees:
                continue
            victims = ssn.reclaimable(task, reclaimees)
            try:
                validate_victims(task, node, victims)
            except Exception:
                continue
            ordered = ssn.build_victims_priority_queue(victims, task)
            available = node.future_idle()
            node_stmt = Statement(ssn)
            chosen: list[TaskInfo] = []
            while not ordered.empty():
                if task.init_resreq.less_equal(available):
                    break
                victim = ordered.pop()
                node_stmt.evict(victim, "reclaim")
                available.add(victim.resreq)
                chosen.append(victim)
            if not task.init_resreq.less_equal(available):
                node_stmt.discard()
                continue
            try:
                node_stmt.pipeline(task, node.name, bool(chosen))
            except StatementError:
                node_stmt.discard()
                continue
            stmt.merge(node_stmt)
            return chosen
        return []
