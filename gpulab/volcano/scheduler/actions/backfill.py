"""backfill: place BestEffort tasks (no requests) wherever the predicates allow.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/actions/backfill/backfill.go``: the
BestEffort pending (and pipelined, un-pipelined first) tasks of non-Pending, valid jobs,
in queue / job / task order; each goes to the best node passing the predicates through
``Session.Allocate``, which dispatches the job's tasks once it is ready.
"""

from __future__ import annotations

from gpulab.volcano.scheduler.api.job_info import FitErrors, JobInfo, TaskInfo, TaskStatus
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.framework.statement import Statement
from gpulab.volcano.scheduler.util import (
    PredicateHelper,
    PriorityQueue,
    prioritize_nodes,
    select_best_node,
)

NAME = "backfill"


class Backfill:
    name = NAME

    def execute(self, ssn: Session) -> None:
        error_cache = ssn.action_arguments(NAME).get_bool("predicateErrorCacheEnable", True)
        placed: dict[str, int] = {}
        for task in self.pick_up_pending_tasks(ssn):
            job = ssn.jobs[task.job]
            try:
                ssn.pre_predicate_fn(task)
            except Exception as err:
                errors = FitErrors()
                for node in ssn.node_list:
                    errors.set_node_error(node.name, err)
                job.nodes_fit_errors[task.uid] = errors
                continue
            fit, errors = PredicateHelper().predicate_nodes(
                task, ssn.node_list, ssn.predicate_for_allocate_action, error_cache
            )
            if not fit:
                job.nodes_fit_errors[task.uid] = errors
                continue
            node = fit[0]
            if len(fit) > 1:
                scores = prioritize_nodes(task, fit, ssn.batch_node_order_fn, ssn.node_order_fn)
                node = select_best_node(scores)[0] or node
            try:
                ssn.allocate(task, node)
            except Exception as err:
                errors = FitErrors()
                errors.set_node_error(node.name, err)
                job.nodes_fit_errors[task.uid] = errors
                continue
            placed[job.uid] = placed.get(job.uid, 0) + 1
        for uid, n in placed.items():
            ssn.record(NAME, uid, f"{n} BestEffort task(s) placed")

    @staticmethod
    def pick_up_pending_tasks(ssn: Session) -> list[TaskInfo]:
        queues: PriorityQueue[QueueInfo] = PriorityQueue(ssn.queue_order_fn)
        jobs: dict[str, PriorityQueue[JobInfo]] = {}
        tasks: dict[str, PriorityQueue[TaskInfo]] = {}
        for job in ssn.jobs.values():
            if job.is_pending():
                continue
            result = ssn.job_valid(job)
            if (result is not None and not result.passed) or job.queue not in ssn.queues:
                continue
            for task in job.tasks_in(TaskStatus.PENDING):
                if task.best_effort and not task.sch_gated:
                    tasks.setdefault(job.uid, PriorityQueue(ssn.task_order_fn)).push(task)
            for task in job.tasks_in(TaskStatus.PIPELINED):
                if task.best_effort:
                    Statement(ssn).unpipeline(task)
                    tasks.setdefault(job.uid, PriorityQueue(ssn.task_order_fn)).push(task)
            if job.uid not in tasks:
                continue
            if job.queue not in jobs:
                queues.push(ssn.queues[job.queue])
                jobs[job.queue] = PriorityQueue(ssn.job_order_fn)
            jobs[job.queue].push(job)
        out: list[TaskInfo] = []
        while not queues.empty():
            queue = queues.pop()
            while not jobs[queue.uid].empty():
                job = jobs[queue.uid].pop()
                while not tasks[job.uid].empty():
                    out.append(tasks[job.uid].pop())
        return out
