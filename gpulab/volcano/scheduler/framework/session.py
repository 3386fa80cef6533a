"""The Session: one scheduling cycle's snapshot, the plugins' functions, the decisions.

Mirrors volcano-sh/volcano v1.15.1:
- ``pkg/scheduler/framework/session.go``: the Session's state (Jobs, Nodes, Queues,
  TotalResource, the PodGroups' old status), ``Allocate`` (a task is Allocated; once the
  job is ``JobReady`` all its Allocated tasks are dispatched to the cache's binder),
  ``Pipeline``, ``Evict``, ``dispatch``, ``UpdatePodGroupCondition``,
  ``PredicateForAllocateAction`` / ``PredicateForPreemptAction``,
  ``FilterOutUnschedulableAndUnresolvableNodesForTask``, ``jobStatus`` / ``getPodGroupPhase``
  and ``updateQueueStatus`` (used by CloseSession);
- ``session_plugins.go``: ``Add*Fn`` and the tier walks that combine the plugins' answers
  (``JobReady``: all must agree; ``JobPipelined`` / ``JobEnqueueable``: a Reject wins, a
  Permit ends the walk at its tier; ``Reclaimable`` / ``Preemptable``: intersection of
  the victims within the first tier that decides; order functions: first non-zero
  answer, then creation time; ``NodeOrderFn`` / ``BatchNodeOrderFn``: sums),
  ``BuildVictimsPriorityQueue``.

Pure: the cache (interface.Cache) is the only outside world a session touches, and
``records`` keeps what each action decided for the call-chain trace (a lab addition).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.framework.snapshot import Snapshot
from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.job_info import (
    UNSCHEDULABLE_AND_UNRESOLVABLE,
    FitError,
    JobInfo,
    Status,
    TaskInfo,
    TaskStatus,
    ValidateResult,
    allocated_status,
    compare_task,
    completed_status,
    scheduled_status,
)
from gpulab.volcano.scheduler.api.node_info import NodeInfo
from gpulab.volcano.scheduler.api.queue_info import QueueInfo
from gpulab.volcano.scheduler.api.resource_info import Resource
from gpulab.volcano.scheduler.conf import Arguments, PluginOption, Tier
from gpulab.volcano.scheduler.framework.interface import Cache, Event, EventHandler, Plugin
from gpulab.volcano.scheduler.util import PriorityQueue

PERMIT, ABSTAIN, REJECT = 1, 0, -1  # plugins/util: votes

CompareFn = Callable[[Any, Any], int]
PredicateFn = Callable[[TaskInfo, NodeInfo], None]
EvictableFn = Callable[[TaskInfo, list[TaskInfo]], tuple[list[TaskInfo], int]]


@dataclass
class Record:
    """One decision of an action, for the trace (the lab's narration). A ``quiet``
    record repeats every cycle while nothing changes (a gang that still does not fit)."""

    action: str
    job: str
    message: str
    quiet: bool = False
    # a plugin's verdict inside the action (allocate's "predicates", "nodeorder"), told on
    # a line of its own before the action's decision; None: the action's decision itself
    step: str | None = None


@dataclass
class Session:
    cache: Cache
    jobs: dict[str, JobInfo]
    nodes: dict[str, NodeInfo]
    queues: dict[str, QueueInfo]
    node_map: Snapshot  # k8s NodeInfos for the in-tree predicates and scores
    tiers: tuple[Tier, ...] = ()
    enabled_actions: frozenset[str] = frozenset()  # conf.EnabledActionMap
    configurations: Mapping[str, Arguments] = field(default_factory=dict)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    total_resource: Resource = field(default_factory=Resource)
    pod_group_old_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    dirty_jobs: set[str] = field(default_factory=set)
    plugins: dict[str, Plugin] = field(default_factory=dict)
    event_handlers: list[EventHandler] = field(default_factory=list)
    fns: dict[str, dict[str, Any]] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    _walks: dict[tuple[str, str | None], list[tuple[int, PluginOption, Any]]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        for n in self.nodes.values():
            self.total_resource.add(n.allocatable)

    @property
    def node_list(self) -> list[NodeInfo]:
        return [self.nodes[name] for name in sorted(self.nodes)]

    def action_arguments(self, action: str) -> Arguments:
        """GetArgOfActionFromConf."""
        return self.configurations.get(action, Arguments())

    def record(
        self, action: str, job: str, message: str, quiet: bool = False, step: str | None = None
    ) -> None:
        self.records.append(Record(action, job, message, quiet, step))

    # ---------------------------------------------------------------- registration

    def _add(self, kind: str, plugin: str, fn: Any) -> None:
        self.fns.setdefault(kind, {})[plugin] = fn
        self._walks.clear()

    def add_job_order_fn(self, plugin: str, fn: CompareFn) -> None:
        self._add("jobOrder", plugin, fn)

    def add_queue_order_fn(self, plugin: str, fn: CompareFn) -> None:
        self._add("queueOrder", plugin, fn)

    def add_victim_queue_order_fn(self, plugin: str, fn: Callable[..., int]) -> None:
        self._add("victimQueueOrder", plugin, fn)

    def add_task_order_fn(self, plugin: str, fn: CompareFn) -> None:
        self._add("taskOrder", plugin, fn)

    def add_predicate_fn(self, plugin: str, fn: PredicateFn) -> None:
        self._add("predicate", plugin, fn)

    def add_pre_predicate_fn(self, plugin: str, fn: Callable[[TaskInfo], None]) -> None:
        self._add("prePredicate", plugin, fn)

    def add_node_order_fn(self, plugin: str, fn: Callable[[TaskInfo, NodeInfo], float]) -> None:
        self._add("nodeOrder", plugin, fn)

    def add_batch_node_order_fn(
        self, plugin: str, fn: Callable[[TaskInfo, list[NodeInfo]], dict[str, float]]
    ) -> None:
        self._add("batchNodeOrder", plugin, fn)

    def add_preemptable_fn(self, plugin: str, fn: EvictableFn) -> None:
        self._add("preemptable", plugin, fn)

    def add_reclaimable_fn(self, plugin: str, fn: EvictableFn) -> None:
        self._add("reclaimable", plugin, fn)

    def add_overused_fn(self, plugin: str, fn: Callable[[QueueInfo], bool]) -> None:
        self._add("overused", plugin, fn)

    def add_preemptive_fn(
        self, plugin: str, fn: Callable[[QueueInfo, list[TaskInfo]], bool]
    ) -> None:
        self._add("preemptive", plugin, fn)

    def add_allocatable_fn(self, plugin: str, fn: Callable[[QueueInfo, TaskInfo], bool]) -> None:
        self._add("allocatable", plugin, fn)

    def add_job_ready_fn(self, plugin: str, fn: Callable[[JobInfo], bool]) -> None:
        self._add("jobReady", plugin, fn)

    def add_job_pipelined_fn(self, plugin: str, fn: Callable[[JobInfo], int]) -> None:
        self._add("jobPipelined", plugin, fn)

    def add_job_valid_fn(self, plugin: str, fn: Callable[[JobInfo], ValidateResult | None]) -> None:
        self._add("jobValid", plugin, fn)

    def add_job_enqueueable_fn(self, plugin: str, fn: Callable[[JobInfo], int]) -> None:
        self._add("jobEnqueueable", plugin, fn)

    def add_job_enqueued_fn(self, plugin: str, fn: Callable[[JobInfo], None]) -> None:
        self._add("jobEnqueued", plugin, fn)

    def add_job_starving_fn(self, plugin: str, fn: Callable[[JobInfo], bool]) -> None:
        self._add("jobStarving", plugin, fn)

    def add_event_handler(self, handler: EventHandler) -> None:
        self.event_handlers.append(handler)

    # ---------------------------------------------------------------- tier walks

    def _each(self, kind: str, switch: str | None) -> list[tuple[int, PluginOption, Any]]:
        """(tier index, plugin option, function) in tier order, switch permitting;
        worked out once per session (the registrations end with OnSessionOpen)."""
        walk = self._walks.get((kind, switch))
        if walk is None:
            registered = self.fns.get(kind, {})
            walk = [
                (i, option, registered[option.name])
                for i, tier in enumerate(self.tiers)
                for option in tier.plugins
                if option.name in registered and (switch is None or option.enabled(switch))
            ]
            self._walks[(kind, switch)] = walk
        return walk

    def _tiers(self, kind: str, switch: str | None) -> list[list[Any]]:
        by_tier: list[list[Any]] = [[] for _ in self.tiers]
        for i, _option, fn in self._each(kind, switch):
            by_tier[i].append(fn)
        return by_tier

    def _compare(self, kind: str, switch: str, left: Any, right: Any) -> int:
        for _i, _o, fn in self._each(kind, switch):
            result = fn(left, right)
            if result:
                return int(result)
        return 0

    def job_order_compare(self, left: JobInfo, right: JobInfo) -> int:
        return self._compare("jobOrder", "enableJobOrder", left, right)

    def job_order_fn(self, left: JobInfo, right: JobInfo) -> bool:
        """JobOrderFn: the plugins, then the older job, then the smaller UID."""
        result = self.job_order_compare(left, right)
        if result:
            return result < 0
        if left.creation_timestamp == right.creation_timestamp:
            return left.uid < right.uid
        return left.creation_timestamp < right.creation_timestamp

    def queue_order_fn(self, left: QueueInfo, right: QueueInfo) -> bool:
        result = self._compare("queueOrder", "enableQueueOrder", left, right)
        if result:
            return result < 0
        if left.creation_timestamp == right.creation_timestamp:
            return left.uid < right.uid
        return left.creation_timestamp < right.creation_timestamp

    def victim_queue_order_fn(
        self, left: QueueInfo, right: QueueInfo, preemptor: QueueInfo
    ) -> bool:
        for _i, _o, fn in self._each("victimQueueOrder", None):
            result = fn(left, right, preemptor)
            if result:
                return result < 0
        return not self.queue_order_fn(left, right)

    def task_compare(self, left: TaskInfo, right: TaskInfo) -> int:
        return self._compare("taskOrder", "enableTaskOrder", left, right)

    def task_order_fn(self, left: TaskInfo, right: TaskInfo) -> bool:
        result = self.task_compare(left, right)
        if result:
            return result < 0
        return compare_task(left, right)

    def predicate_fn(self, task: TaskInfo, node: NodeInfo) -> None:
        for _i, _o, fn in self._each("predicate", "enablePredicate"):
            fn(task, node)

    def pre_predicate_fn(self, task: TaskInfo) -> None:
        for _i, _o, fn in self._each("prePredicate", "enablePredicate"):
            fn(task)

    def node_order_fn(self, task: TaskInfo, node: NodeInfo) -> float:
        return sum(fn(task, node) for _i, _o, fn in self._each("nodeOrder", "enableNodeOrder"))

    def batch_node_order_fn(self, task: TaskInfo, nodes: list[NodeInfo]) -> dict[str, float]:
        total: dict[str, float] = {}
        for _i, _o, fn in self._each("batchNodeOrder", "enableNodeOrder"):
            for name, score in fn(task, nodes).items():
                total[name] = total.get(name, 0.0) + score
        return total

    def _victims(
        self, kind: str, switch: str, evictor: TaskInfo, evictees: list[TaskInfo]
    ) -> list[TaskInfo]:
        """Reclaimable / Preemptable: within a tier, the intersection of every plugin's
        victims; the first tier with victims decides; a plugin naming none sends the walk
        to the next tier.

        As upstream, ``victims`` is None both before the first vote and after an empty
        intersection (Go's nil slice), so the plugin after an empty intersection starts
        afresh with its own victims, dropping what the earlier plugins of the tier
        filtered; after the tier's last plugin the next tier decides. With the lab's
        first tier (gang, conformance, proportion for reclaim): when gang offers only
        system-critical tasks, which conformance refuses, proportion's victims are
        taken alone - tasks of a gang at its minimum among them. Upstream reports this
        as a bug (volcano-sh/volcano#5963, found in #5964; docs/volcano.md)."""
        for fns in self._tiers(kind, switch):
            victims: list[TaskInfo] | None = None
            for fn in fns:
                candidates, vote = fn(evictor, evictees)
                if vote == ABSTAIN:
                    continue
                if not candidates:
                    victims = None
                    break
                if victims is None:
                    victims = list(candidates)
                else:
                    keep = {c.uid for c in candidates}
                    victims = [v for v in victims if v.uid in keep] or None
            if victims is not None:
                return victims
        return []

    def reclaimable(self, reclaimer: TaskInfo, reclaimees: list[TaskInfo]) -> list[TaskInfo]:
        return self._victims("reclaimable", "enableReclaimable", reclaimer, reclaimees)

    def preemptable(self, preemptor: TaskInfo, preemptees: list[TaskInfo]) -> list[TaskInfo]:
        return self._victims("preemptable", "enablePreemptable", preemptor, preemptees)

    def overused(self, queue: QueueInfo) -> bool:
        return any(fn(queue) for _i, _o, fn in self._each("overused", "enabledOverused"))

    def preemptive(self, queue: QueueInfo, candidates: list[TaskInfo]) -> bool:
        return all(
            fn(queue, candidates) for _i, _o, fn in self._each("preemptive", "enablePreemptive")
        )

    def allocatable(self, queue: QueueInfo, candidate: TaskInfo) -> bool:
        return all(
            fn(queue, candidate) for _i, _o, fn in self._each("allocatable", "enabledAllocatable")
        )

    def job_ready(self, job: JobInfo) -> bool:
        return all(fn(job) for _i, _o, fn in self._each("jobReady", "enableJobReady"))

    def _vote(self, kind: str, switch: str, job: JobInfo) -> bool:
        """JobPipelined / JobEnqueueable: a Reject wins; a Permit settles its tier."""
        for fns in self._tiers(kind, switch):
            permitted = False
            for fn in fns:
                vote = fn(job)
                if vote < 0:
                    return False
                permitted |= vote > 0
            if permitted:
                return True
        return True

    def job_pipelined(self, job: JobInfo) -> bool:
        return self._vote("jobPipelined", "enableJobPipelined", job)

    def job_enqueueable(self, job: JobInfo) -> bool:
        return self._vote("jobEnqueueable", "enableJobEnqueued", job)

    def job_enqueued(self, job: JobInfo) -> None:
        for _i, _o, fn in self._each("jobEnqueued", "enableJobEnqueued"):
            fn(job)

    def job_starving(self, job: JobInfo) -> bool:
        """JobStarving: the first tier with functions decides; all must agree."""
        for fns in self._tiers("jobStarving", "enableJobStarving"):
            if fns:
                return all(fn(job) for fn in fns)
        return False

    def job_valid(self, job: JobInfo) -> ValidateResult | None:
        for _i, _o, fn in self._each("jobValid", None):
            result = fn(job)
            if result is not None and not result.passed:
                return result
        return None

    def build_victims_priority_queue(
        self, victims: list[TaskInfo], preemptor: TaskInfo
    ) -> PriorityQueue[TaskInfo]:
        """BuildVictimsPriorityQueue: the victim evicted first is popped first."""

        def less(left: TaskInfo, right: TaskInfo) -> bool:
            if left.job == right.job:
                return not self.task_order_fn(left, right)
            lj, rj, pj = (
                self.jobs.get(left.job),
                self.jobs.get(right.job),
                self.jobs.get(preemptor.job),
            )
            if lj is None or rj is None:
                if lj is None and rj is None:
                    return not self.task_order_fn(left, right)
                return lj is None
            if pj is not None and lj.queue != rj.queue:
                return self.victim_queue_order_fn(
                    self.queues[lj.queue], self.queues[rj.queue], self.queues[pj.queue]
                )
            result = self.job_order_compare(lj, rj)
            if result:
                return result > 0
            return not self.task_order_fn(left, right)

        queue: PriorityQueue[TaskInfo] = PriorityQueue(less)
        for victim in victims:
            queue.push(victim)
        return queue

    # ---------------------------------------------------------------- predicates

    def predicate_for_allocate_action(self, task: TaskInfo, node: NodeInfo) -> None:
        """Fail on Unschedulable or UnschedulableAndUnresolvable (and on errors)."""
        try:
            self.predicate_fn(task, node)
        except FitError:
            raise
        except Exception as err:
            raise FitError(task.key, node.name, [Status("Error", str(err))]) from err

    def predicate_for_preempt_action(self, task: TaskInfo, node: NodeInfo) -> None:
        """Fail only when evicting pods would not help (UnschedulableAndUnresolvable)."""
        try:
            self.predicate_fn(task, node)
        except FitError as fe:
            if fe.has(UNSCHEDULABLE_AND_UNRESOLVABLE, "Error"):
                raise
        except Exception as err:
            raise FitError(task.key, node.name, [Status("Error", str(err))]) from err

    def filter_out_unresolvable_nodes(self, task: TaskInfo) -> list[NodeInfo]:
        """FilterOutUnschedulableAndUnresolvableNodesForTask."""
        job = self.jobs.get(task.job)
        errors = job.nodes_fit_errors.get(task.uid) if job else None
        skip = errors.unschedulable_and_unresolvable_nodes() if errors else set()
        return [n for n in self.node_list if n.name not in skip]

    # ---------------------------------------------------------------- decisions

    def _fire(self, allocate: bool, task: TaskInfo) -> list[Exception]:
        errors: list[Exception] = []
        for handler in self.event_handlers:
            fn = handler.allocate if allocate else handler.deallocate
            if fn is not None:
                event = Event(task)
                fn(event)
                if event.err is not None:
                    errors.append(event.err)
        return errors

    def pipeline(self, task: TaskInfo, hostname: str) -> None:
        """Session.Pipeline: the task waits on ``hostname`` for resources being freed."""
        self.jobs[task.job].update_task_status(task, TaskStatus.PIPELINED)
        task.node_name = hostname
        self.nodes[hostname].add_task(task)
        self._fire(True, task)

    def allocate(self, task: TaskInfo, node: NodeInfo) -> None:
        """Session.Allocate (backfill): allocate, and dispatch the job once it is ready."""
        job = self.jobs[task.job]
        job.update_task_status(task, TaskStatus.ALLOCATED)
        task.node_name = node.name
        node.add_task(task)
        self._fire(True, task)
        if self.job_ready(job):
            for t in list(job.tasks_in(TaskStatus.ALLOCATED)):
                self.dispatch(t)

    def dispatch(self, task: TaskInfo) -> None:
        """Hand an Allocated task to the cache's binder; it is Binding from now on."""
        self.cache.add_bind_task(task)
        self.jobs[task.job].update_task_status(task, TaskStatus.BINDING)

    def evict(self, reclaimee: TaskInfo, reason: str) -> None:
        """Session.Evict: delete the pod now (outside any Statement)."""
        self.cache.evict(reclaimee, reason)
        self.jobs[reclaimee.job].update_task_status(reclaimee, TaskStatus.RELEASING)
        node = self.nodes.get(reclaimee.node_name)
        if node is not None:
            node.update_task(reclaimee)
        self._fire(False, reclaimee)

    def update_pod_group_condition(self, job: JobInfo, condition: dict[str, Any]) -> None:
        """UpdatePodGroupCondition: replace the condition of the same type, or append."""
        if job.pod_group is None:
            return
        conditions = job.pod_group.setdefault("status", {}).setdefault("conditions", [])
        for i, existing in enumerate(conditions):
            if existing.get("type") == condition.get("type"):
                conditions[i] = condition
                return
        conditions.append(condition)

    def mark_job_dirty(self, uid: str) -> None:
        self.dirty_jobs.add(uid)


# -- CloseSession's write-back -------------------------------------------------------------


def pod_group_phase(job: JobInfo, unschedulable: bool) -> str:
    """getPodGroupPhase: Running once minMember tasks are scheduled (Completed when all
    of those finished); Unknown when running tasks became unschedulable; a Pending job
    stays Pending, an Inqueue one Inqueue."""
    if job.count(TaskStatus.RUNNING) and unschedulable:
        return apis.PG_UNKNOWN
    scheduled = completed = 0
    for status, tasks in job.task_status_index.items():
        if scheduled_status(status):
            scheduled += len(tasks)
        if completed_status(status):
            completed += len(tasks)
    if scheduled >= int(((job.pod_group or {}).get("spec") or {}).get("minMember") or 0):
        return apis.PG_COMPLETED if scheduled == completed else apis.PG_RUNNING
    if job.phase != apis.PG_INQUEUE:
        return apis.PG_PENDING
    return job.phase


def job_status(ssn: Session, job: JobInfo) -> dict[str, Any]:
    """jobStatus: the PodGroup status to write back at CloseSession."""
    status = dict((job.pod_group or {}).get("status") or {})
    unschedulable = any(
        c.get("type") == apis.PG_UNSCHEDULABLE_TYPE
        and c.get("status") == "True"
        and c.get("transitionID") == ssn.uid
        for c in status.get("conditions") or []
    )
    status["phase"] = pod_group_phase(job, unschedulable)
    status["running"] = job.count(TaskStatus.RUNNING)
    status["failed"] = job.count(TaskStatus.FAILED)
    status["succeeded"] = job.count(TaskStatus.SUCCEEDED)
    return status


def pod_group_status_updated(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """isPodGroupStatusUpdated: a change other than conditions' time and transition ID."""
    strip = ("conditions",)
    if {k: v for k, v in new.items() if k not in strip} != {
        k: v for k, v in old.items() if k not in strip
    }:
        return True
    new_c, old_c = new.get("conditions") or [], old.get("conditions") or []
    if len(new_c) != len(old_c):
        return True
    ignore = ("lastTransitionTime", "transitionID")
    return any(
        {k: v for k, v in n.items() if k not in ignore}
        != {k: v for k, v in o.items() if k not in ignore}
        for n, o in zip(new_c, old_c, strict=True)
    )


def queue_allocated(ssn: Session) -> dict[str, Resource]:
    """updateQueueStatus's sums: each queue's allocated tasks (and root's: everything)."""
    allocated = {name: Resource() for name in ssn.queues}
    for job in ssn.jobs.values():
        for status, tasks in job.task_status_index.items():
            if not allocated_status(status):
                continue
            for task in tasks.values():
                if job.queue in allocated:
                    allocated[job.queue].add(task.resreq)
                if apis.ROOT_QUEUE in allocated and job.queue != apis.ROOT_QUEUE:
                    allocated[apis.ROOT_QUEUE].add(task.resreq)
    return allocated
