"""allocate: place Inqueue jobs' pending tasks, a gang only as a whole.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/actions/allocate/allocate.go`` for jobs
without network topology (``buildAllocateContext``, ``allocateResources``,
``allocateResourcesForTasks``, ``prioritizeNodes``, ``allocateResourcesForTask``,
``predicate``):

1. pick a queue (queue order; skip an ``Overused`` one), then its best job (job order);
2. pick the job's tasks in task order; skip one its queue cannot take (``Allocatable``)
   or whose role already failed this session;
3. ``predicate``: the task's request must fit the node's FutureIdle ("Insufficient
   <resource>"), then the plugins' predicates; no node -> record the FitErrors and stop
   (or go on if the others could still make the gang, ``NeedContinueAllocating``);
4. score the nodes where the task fits Idle (else those where it fits FutureIdle) and take
   the best; Allocate there (or Pipeline, waiting for resources being released);
5. once ``JobReady``, stop and commit the Statement - the binder binds all of the
   gang's tasks together; a job that is only ``JobPipelined`` keeps its tentative places
   uncommitted; any other job's Statement is discarded, nothing of it is bound.
An elastic job (minAvailable < replicas) goes back to its queue for one more task per
turn, so queues take turns by share.

Lab differences: no hyper-node / sub-group search (``allocateForJob``), no nomination
fast path for gang preemption, no scheduling-gate removal; a task's nominated node is not
tried first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import (
    UNSCHEDULABLE,
    FitError,
    FitErrors,
    JobInfo,
    Status,
    TaskInfo,
    TaskStatus,
)
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.framework.session import Session
from gpulab.volcano.scheduler.framework.statement import Statement, StatementError
from gpulab.volcano.scheduler.util import (
    PredicateHelper,
    PriorityQueue,
    prioritize_nodes,
    select_best_node,
)

NAME = "allocate"
PREDICATE_ERR_CACHE = "predicateErrorCacheEnable"  # conf.EnablePredicateErrCacheKey


@dataclass
class _Tally:
    """What one job got this session, for the trace."""

    bound: dict[str, int] = field(default_factory=dict)
    pipelined: dict[str, int] = field(default_factory=dict)
    discarded: int | None = None  # tasks it could place before the Statement was discarded
    # the plugins' verdicts on the job's first task this session: predicates per node,
    # then nodeorder's scores per node (what a learner would set a breakpoint for)
    predicates: str | None = None
    nodeorder: str | None = None


def insufficient(task: TaskInfo, node: NodeInfo) -> None:
    """The resource part of allocate's predicate."""
    fits, names = task.init_resreq.less_equal_with_names(node.future_idle())
    if not fits:
        raise FitError(task.key, node.name, [Status(UNSCHEDULABLE, f"Insufficient {names[0]}")])


class Allocate:
    name = NAME

    def execute(self, ssn: Session) -> None:
        self.ssn = ssn
        self.error_cache = ssn.action_arguments(NAME).get_bool(PREDICATE_ERR_CACHE, True)
        self.tally: dict[str, _Tally] = {}
        queues: PriorityQueue[QueueInfo] = PriorityQueue(ssn.queue_order_fn)
        jobs_by_queue: dict[str, PriorityQueue[JobInfo]] = {}
        tasks: dict[str, PriorityQueue[TaskInfo]] = {}
        for job in ssn.jobs.values():
            if job.is_pending():
                if "enqueue" in ssn.enabled_actions:
                    continue
                assert job.pod_group is not None
                job.pod_group.setdefault("status", {})["phase"] = apis.PG_INQUEUE
            result = ssn.job_valid(job)
            if result is not None and not result.passed:
                continue
            if job.queue not in ssn.queues:
                continue
            pending: PriorityQueue[TaskInfo] = PriorityQueue(ssn.task_order_fn)
            for task in job.tasks_in(TaskStatus.PENDING):
                if not task.sch_gated and not task.resreq.is_empty():
                    pending.push(task)
            if pending.empty():
                continue
            if job.queue not in jobs_by_queue:
                jobs_by_queue[job.queue] = PriorityQueue(ssn.job_order_fn)
                queues.push(ssn.queues[job.queue])
            jobs_by_queue[job.queue].push(job)
            tasks[job.uid] = pending
        while not queues.empty():
            queue = queues.pop()
            if ssn.overused(queue):
                continue
            jobs = jobs_by_queue.get(queue.uid)
            if jobs is None or jobs.empty():
                continue
            job = jobs.pop()
            stmt = self.allocate_resources_for_tasks(job, queue, tasks[job.uid])
            if stmt is not None and ssn.job_ready(job):
                for op in stmt.operations:
                    where = self._tally(job).bound
                    where[op.task.node_name] = where.get(op.task.node_name, 0) + 1
                stmt.commit()
                if len(tasks[job.uid]):
                    jobs.push(job)
            queues.push(queue)
        self._record()

    def _tally(self, job: JobInfo) -> _Tally:
        return self.tally.setdefault(job.uid, _Tally())

    def predicate(self, task: TaskInfo, node: NodeInfo) -> None:
        insufficient(task, node)
        self.ssn.predicate_for_allocate_action(task, node)

    def allocate_resources_for_tasks(
        self, job: JobInfo, queue: QueueInfo, tasks: PriorityQueue[TaskInfo]
    ) -> Statement | None:
        ssn = self.ssn
        nodes = ssn.node_list
        stmt = Statement(ssn)
        helper = PredicateHelper()
        while not tasks.empty():
            task = tasks.pop()
            if not ssn.allocatable(queue, task):
                continue
            if job.task_has_fit_errors(task):
                job.nodes_fit_errors[task.uid] = FitErrors(
                    err=f"Task {task.name} with role spec {task.task_role} has already "
                    "predicated failed, skip"
                )
                continue
            try:
                ssn.pre_predicate_fn(task)
            except Exception as err:
                errors = FitErrors()
                for node in nodes:
                    errors.set_node_error(node.name, err)
                job.nodes_fit_errors[task.uid] = errors
                if job.need_continue_allocating():
                    continue
                break
            fit, errors = helper.predicate_nodes(task, nodes, self.predicate, self.error_cache)
            tally = self._tally(job)
            if tally.predicates is None:
                tally.predicates = predicate_line(task, nodes, fit, errors)
            if not fit:
                job.nodes_fit_errors[task.uid] = errors
                if job.need_continue_allocating():
                    continue
                break
            best = self.prioritize_nodes(task, fit, tally)
            if best is None:
                continue
            self.allocate_resources_for_task(stmt, task, best, job)
            if ssn.job_ready(job):
                break
        if ssn.job_ready(job) or ssn.job_pipelined(job):
            return stmt
        self._tally(job).discarded = len(stmt.operations)
        stmt.discard()
        return None

    def prioritize_nodes(
        self, task: TaskInfo, fit: list[NodeInfo], tally: _Tally
    ) -> NodeInfo | None:
        """Nodes where the task fits Idle first; only if none, those where it fits
        FutureIdle (resources being released). ``tally`` keeps the first scores for the
        trace."""
        idle: list[NodeInfo] = []
        future: list[NodeInfo] = []
        for n in fit:
            if task.init_resreq.less_equal(n.idle):
                idle.append(n)
            elif task.init_resreq.less_equal(n.future_idle()):
                future.append(n)
        for group in (idle, future):
            if len(group) == 1:
                if tally.nodeorder is None:
                    tally.nodeorder = f"{task.name}: only {group[0].name} left, not scored"
                return group[0]
            if group:
                scores = prioritize_nodes(
                    task, group, self.ssn.batch_node_order_fn, self.ssn.node_order_fn
                )
                best, _ = select_best_node(scores)
                if tally.nodeorder is None and best is not None:
                    tally.nodeorder = nodeorder_line(task, scores, best)
                if best is not None:
                    return best
        return None

    def allocate_resources_for_task(
        self, stmt: Statement, task: TaskInfo, node: NodeInfo, job: JobInfo
    ) -> None:
        try:
            if task.init_resreq.less_equal(node.idle):
                stmt.allocate(task, node)
            elif task.init_resreq.less_equal(node.future_idle()):
                stmt.pipeline(task, node.name, False)
                where = self._tally(job).pipelined
                where[node.name] = where.get(node.name, 0) + 1
        except StatementError:
            pass

    def _record(self) -> None:
        for uid, t in self.tally.items():
            job = self.ssn.jobs[uid]
            # quiet: a gang that still does not fit meets the same verdicts every session
            quiet = not t.bound and not t.pipelined
            if t.predicates is not None:
                self.ssn.record(NAME, uid, t.predicates, quiet=quiet, step="predicates")
            if t.nodeorder is not None:
                self.ssn.record(NAME, uid, t.nodeorder, quiet=quiet, step="nodeorder")
            if t.bound:
                n = sum(t.bound.values())
                where = ", ".join(f"{node} ({k})" for node, k in sorted(t.bound.items()))
                self.ssn.record(
                    NAME,
                    uid,
                    f"{n} task(s) -> {where}; JobReady ({job.ready_task_num()} ready, "
                    f"minAvailable {job.min_available}): Statement committed, binding",
                )
            elif t.pipelined:
                n = sum(t.pipelined.values())
                where = ", ".join(f"{node} ({k})" for node, k in sorted(t.pipelined.items()))
                self.ssn.record(
                    NAME,
                    uid,
                    f"{n} task(s) pipelined on {where}, waiting for resources to be released",
                )
            elif t.discarded is not None:
                self.ssn.record(
                    NAME,
                    uid,
                    f"gang does not fit ({job.ready_task_num() + t.discarded}/"
                    f"{job.min_available} placeable), Statement discarded",
                    quiet=True,
                )


def predicate_line(
    task: TaskInfo, nodes: list[NodeInfo], fit: list[NodeInfo], errors: FitErrors
) -> str:
    """The predicates' verdict per node for ``task``: passed, or the first reason."""
    passed = {n.name for n in fit}
    verdicts = []
    for node in nodes:
        if node.name in passed:
            verdicts.append(f"{node.name} passed")
        elif (fe := errors.nodes.get(node.name)) is not None:
            verdicts.append(f"{node.name} {'; '.join(fe.reasons()) or 'failed'}")
    return f"{task.name}: " + ", ".join(verdicts or ["no node checked"])


def nodeorder_line(task: TaskInfo, scores: dict[float, list[NodeInfo]], best: NodeInfo) -> str:
    """The node-order plugins' total per node for ``task`` and the node taken; equal
    totals are broken by name (the lab's SelectBestNodeAndScore)."""
    ranked = sorted(((s, n.name) for s, nodes in scores.items() for n in nodes), reverse=True)
    totals = ", ".join(f"{name}={score:g}" for score, name in ranked)
    tie = len(scores[max(scores)]) > 1
    return f"{task.name}: {totals} -> {best.name}" + (" (a tie, broken by name)" if tie else "")
