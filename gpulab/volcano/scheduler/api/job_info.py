"""What the scheduler knows about a PodGroup and its pods: JobInfo and TaskInfo.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/scheduler/api``:
- ``types.go`` ``TaskStatus`` (Pending, Allocated, Pipelined, Binding, Bound, Running,
  Releasing, Succeeded, Failed, Unknown) and ``helpers.go`` (``getTaskStatus`` from the pod
  phase, ``AllocatedStatus``, ``ScheduledStatus``, ``CompletedStatus``, ``PreemptableStatus``,
  ``helpers.CompareTask``);
- ``job_info.go`` ``TaskInfo`` (``NewTaskInfo``: the pod's request, priority, preemptable,
  task role) and ``JobInfo`` (``TaskStatusIndex``, ``ReadyTaskNum``, ``WaitingTaskNum``,
  ``ValidTaskNum``, ``IsReady`` / ``IsPipelined`` / ``IsStarving``, ``CheckTaskValid`` /
  ``Ready`` / ``Pipelined``, ``NeedContinueAllocating``, ``FitError`` - the text behind
  "x/y tasks in gang unschedulable: ...", ``TaskSchedulingReason``);
- ``unschedule_info.go`` ``FitError`` / ``FitErrors`` ("0/N nodes are unavailable: ...").

A JobID is ``<namespace>/<podgroup name>``, the pods' ``scheduling.k8s.io/group-name``.

Lab differences: a job has exactly one (the default) sub-job - PodGroup
``subGroupPolicy`` is not read, so SubJobReady is JobReady; no network topology, DRA,
NUMA or revocable zones; the disruption budget annotations are not read.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.resource_info import Resource, pod_resource_request

Obj = dict[str, Any]


class TaskStatus(enum.IntFlag):
    PENDING = 1 << 0
    ALLOCATED = 1 << 1
    PIPELINED = 1 << 2
    BINDING = 1 << 3
    BOUND = 1 << 4
    RUNNING = 1 << 5
    RELEASING = 1 << 6
    SUCCEEDED = 1 << 7
    FAILED = 1 << 8
    UNKNOWN = 1 << 9

    def __str__(self) -> str:
        return (self.name or "Unknown").capitalize()


S = TaskStatus


def task_status_of(pod: Mapping[str, Any]) -> TaskStatus:
    """getTaskStatus: the pod's phase (and deletion, and binding) as a TaskStatus."""
    phase = (pod.get("status") or {}).get("phase")
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    if phase == "Running":
        return S.RELEASING if deleting else S.RUNNING
    if phase in ("Pending", None, ""):
        if deleting:
            return S.RELEASING
        return S.BOUND if (pod.get("spec") or {}).get("nodeName") else S.PENDING
    if phase == "Succeeded":
        return S.SUCCEEDED
    if phase == "Failed":
        return S.FAILED
    return S.UNKNOWN


def allocated_status(s: TaskStatus) -> bool:
    return s in (S.BOUND, S.BINDING, S.RUNNING, S.ALLOCATED)


def scheduled_status(s: TaskStatus) -> bool:
    return s in (S.RUNNING, S.BOUND, S.FAILED, S.SUCCEEDED)


def completed_status(s: TaskStatus) -> bool:
    return s in (S.FAILED, S.SUCCEEDED)


def preemptable_status(s: TaskStatus) -> bool:
    return s in (S.BOUND, S.RUNNING)


def _bool_key(meta: Mapping[str, Any], key: str) -> bool | None:
    """A ``true``/``false`` annotation, else label; None when neither is set (an
    unparsable value counts as false, as strconv.ParseBool's error does upstream)."""
    for where in ("annotations", "labels"):
        value = (meta.get(where) or {}).get(key)
        if value is not None:
            return str(value).lower() in ("1", "t", "true")
    return None


@dataclass
class TransactionContext:
    node_name: str = ""
    status: TaskStatus = S.PENDING
    eviction_occurred: bool = False


@dataclass
class TaskInfo:
    """One pod as the scheduler sees it (api.TaskInfo)."""

    uid: str
    job: str  # JobID: namespace/podgroup
    name: str
    namespace: str
    task_role: str
    resreq: Resource
    init_resreq: Resource
    pod: Obj = field(repr=False)
    priority: int = 1
    preemptable: bool = True
    best_effort: bool = False
    sch_gated: bool = False
    node_name: str = ""
    status: TaskStatus = S.PENDING
    eviction_occurred: bool = False
    last_transaction: TransactionContext | None = None

    @classmethod
    def of(cls, pod: Obj) -> TaskInfo:
        """NewTaskInfo(pod)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        req = pod_resource_request(pod)
        group = apis.group_name_of(pod)
        ann, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        priority = spec.get("priority")
        priority = 1 if priority is None else int(priority)
        task_priority = ann.get(apis.TASK_PRIORITY_ANNOTATION)
        if task_priority is not None and str(task_priority).lstrip("-").isdigit():
            priority = int(task_priority)
        preemptable = _bool_key(meta, apis.POD_PREEMPTABLE)
        return cls(
            uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"),
            job=f"{meta.get('namespace')}/{group}" if group else "",
            name=str(meta.get("name")),
            namespace=str(meta.get("namespace")),
            task_role=ann.get(apis.TASK_SPEC_KEY) or labels.get(apis.TASK_SPEC_KEY) or "",
            resreq=req,
            init_resreq=req,
            pod=pod,
            priority=priority,
            preemptable=True if preemptable is None else preemptable,
            best_effort=req.is_empty(),
            sch_gated=bool(spec.get("schedulingGates")),
            node_name=str(spec.get("nodeName") or ""),
            status=task_status_of(pod),
        )

    def clone(self) -> TaskInfo:
        """A copy whose status and node may change independently (resources shared)."""
        return replace(self)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def transaction(self) -> TransactionContext:
        return TransactionContext(self.node_name, self.status, self.eviction_occurred)

    def generate_last_tx_context(self) -> None:
        self.last_transaction = self.transaction()

    def clear_last_tx_context(self) -> None:
        self.last_transaction = None

    @property
    def creation_timestamp(self) -> str:
        return str((self.pod.get("metadata") or {}).get("creationTimestamp") or "")

    def __str__(self) -> str:
        return f"Task {self.key} ({self.status}{' on ' + self.node_name if self.node_name else ''})"


def _pod_index(task: TaskInfo) -> int | None:
    parts = task.name.split("-")
    if len(parts) >= 3 and parts[-1].isdigit():
        return int(parts[-1])
    return None


def compare_task(left: TaskInfo, right: TaskInfo) -> bool:
    """helpers.CompareTask: lower pod index first, else older pod, else smaller UID."""
    li, ri = _pod_index(left), _pod_index(right)
    if li is None or ri is None or li == ri:
        if left.creation_timestamp == right.creation_timestamp:
            return left.uid < right.uid
        return left.creation_timestamp < right.creation_timestamp
    return li < ri


# -- fit errors ----------------------------------------------------------------------------

UNSCHEDULABLE, UNSCHEDULABLE_AND_UNRESOLVABLE, ERROR = (
    "Unschedulable",
    "UnschedulableAndUnresolvable",
    "Error",
)
NODE_POD_NUMBER_EXCEEDED = "node(s) pod number exceeded"
ALL_NODE_UNAVAILABLE_MSG = "all nodes are unavailable"
POD_REASON_UNSCHEDULABLE = "Unschedulable"
POD_REASON_SCHEDULABLE = "Schedulable"
POD_REASON_SCHEDULER_ERROR = "SchedulerError"


@dataclass(frozen=True)
class Status:
    code: str
    reason: str
    plugin: str = ""


@dataclass
class FitError(Exception):
    """Why a task does not fit one node (api.FitError)."""

    task: str
    node: str
    statuses: list[Status] = field(default_factory=list)

    def reasons(self) -> list[str]:
        return [s.reason for s in self.statuses if s.reason]

    def has(self, *codes: str) -> bool:
        return any(s.code in codes for s in self.statuses)

    def __str__(self) -> str:
        return f"task {self.task} on node {self.node} fit failed: {', '.join(self.reasons())}"


@dataclass
class FitErrors:
    """Why a task fits no node, per node (api.FitErrors)."""

    nodes: dict[str, FitError] = field(default_factory=dict)
    err: str = ""

    def set_node_error(self, node: str, err: Exception) -> None:
        if isinstance(err, FitError):
            err.node = node
            self.nodes[node] = err
        else:
            self.nodes[node] = FitError("", node, [Status(ERROR, str(err))])

    def unschedulable_and_unresolvable_nodes(self) -> set[str]:
        return {n for n, fe in self.nodes.items() if fe.has(UNSCHEDULABLE_AND_UNRESOLVABLE)}

    def error(self) -> str:
        """``0/N nodes are unavailable: 2 Insufficient nvidia.com/gpu, 1 ....``"""
        head = self.err or f"0/{len(self.nodes)} nodes are unavailable"
        if not self.nodes:
            return head
        counts: dict[str, int] = {}
        for fe in self.nodes.values():
            for reason in fe.reasons():
                counts[reason] = counts.get(reason, 0) + 1
        return f"{head}: {', '.join(sorted(f'{n} {r}' for r, n in counts.items()))}."


@dataclass
class ValidateResult:
    passed: bool
    reason: str = ""
    message: str = ""


# -- the job -------------------------------------------------------------------------------


@dataclass
class JobInfo:
    """A PodGroup and its pods (api.JobInfo)."""

    uid: str
    name: str = ""
    namespace: str = ""
    queue: str = ""
    priority: int = 0
    min_available: int = 0
    pod_group: Obj | None = None
    creation_timestamp: str = ""
    preemptable: bool = False
    tasks: dict[str, TaskInfo] = field(default_factory=dict)
    task_status_index: dict[TaskStatus, dict[str, TaskInfo]] = field(default_factory=dict)
    task_min_available: dict[str, int] = field(default_factory=dict)
    task_min_available_total: int = 0
    allocated: Resource = field(default_factory=Resource)
    total_request: Resource = field(default_factory=Resource)
    job_fit_errors: str = ""
    nodes_fit_errors: dict[str, FitErrors] = field(default_factory=dict)

    # ---------------------------------------------------------------- PodGroup

    def set_pod_group(self, pg: Obj) -> None:
        """SetPodGroup: name, queue, minMember, minTaskMember from the PodGroup."""
        meta, spec = pg.get("metadata") or {}, pg.get("spec") or {}
        self.name = str(meta.get("name"))
        self.namespace = str(meta.get("namespace"))
        self.min_available = int(spec.get("minMember") or 0)
        self.queue = str(spec.get("queue") or "")
        self.creation_timestamp = str(meta.get("creationTimestamp") or "")
        preemptable = _bool_key(meta, apis.POD_PREEMPTABLE)
        self.preemptable = bool(preemptable)
        members = spec.get("minTaskMember") or {}
        self.task_min_available = {k: int(v) for k, v in members.items()}
        self.task_min_available_total = sum(self.task_min_available.values())
        self.pod_group = pg

    @property
    def phase(self) -> str:
        return str(((self.pod_group or {}).get("status") or {}).get("phase") or "")

    def min_resources(self) -> Resource:
        """GetMinResources."""
        spec = (self.pod_group or {}).get("spec") or {}
        return Resource.from_list(spec.get("minResources"))

    def has_min_resources(self) -> bool:
        return ((self.pod_group or {}).get("spec") or {}).get("minResources") is not None

    def elastic_resources(self) -> Resource:
        """GetElasticResources: allocated beyond minResources."""
        from gpulab.volcano.scheduler.api.resource_info import exceeded_part

        return exceeded_part(self.allocated, self.min_resources())

    # ---------------------------------------------------------------- tasks

    def add_task_info(self, task: TaskInfo) -> None:
        self.tasks[task.uid] = task
        self.task_status_index.setdefault(task.status, {})[task.uid] = task
        self.total_request.add(task.resreq)
        if allocated_status(task.status):
            self.allocated.add(task.resreq)

    def delete_task_info(self, task: TaskInfo) -> None:
        held = self.tasks.pop(task.uid, None)
        if held is None:
            return
        self.total_request.sub(held.resreq)
        if allocated_status(held.status):
            self.allocated.sub(held.resreq)
        index = self.task_status_index.get(held.status)
        if index is not None:
            index.pop(held.uid, None)
            if not index:
                del self.task_status_index[held.status]

    def update_task_status(self, task: TaskInfo, status: TaskStatus) -> None:
        if task.uid in self.tasks:
            self.delete_task_info(task)
        task.status = status
        self.add_task_info(task)

    def tasks_in(self, *statuses: TaskStatus) -> Iterator[TaskInfo]:
        for status in statuses:
            yield from list(self.task_status_index.get(status, {}).values())

    def count(self, *statuses: TaskStatus) -> int:
        return sum(len(self.task_status_index.get(s, {})) for s in statuses)

    # ---------------------------------------------------------------- gang arithmetic

    def ready_task_num(self) -> int:
        return self.count(S.BOUND, S.BINDING, S.RUNNING, S.ALLOCATED, S.SUCCEEDED)

    def waiting_task_num(self) -> int:
        return self.count(S.PIPELINED)

    def pending_best_effort_task_num(self) -> int:
        return sum(1 for t in self.tasks_in(S.PENDING) if t.best_effort)

    def allocated_task_num(self) -> int:
        return sum(len(ts) for s, ts in self.task_status_index.items() if allocated_status(s))

    def valid_task_num(self) -> int:
        return sum(
            len(ts)
            for s, ts in self.task_status_index.items()
            if allocated_status(s) or s in (S.SUCCEEDED, S.PIPELINED, S.PENDING)
        )

    def is_ready(self) -> bool:
        return self.ready_task_num() + self.pending_best_effort_task_num() >= self.min_available

    def is_pipelined(self) -> bool:
        return (
            self.waiting_task_num() + self.ready_task_num() + self.pending_best_effort_task_num()
            >= self.min_available
        )

    def is_starving(self) -> bool:
        return self.waiting_task_num() + self.ready_task_num() < self.min_available

    def is_pending(self) -> bool:
        return self.pod_group is None or self.phase in ("", apis.PG_PENDING)

    def _roles(self, statuses: tuple[TaskStatus, ...], pending_best_effort: bool) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s, ts in self.task_status_index.items():
            if allocated_status(s) or s in statuses:
                for t in ts.values():
                    counts[t.task_role] = counts.get(t.task_role, 0) + 1
            elif s == S.PENDING and pending_best_effort:
                for t in ts.values():
                    if t.init_resreq.is_empty():
                        counts[t.task_role] = counts.get(t.task_role, 0) + 1
        return counts

    def _roles_meet_min(self, counts: Mapping[str, int]) -> bool:
        return all(counts.get(role, 0) >= n for role, n in self.task_min_available.items() if n)

    def check_task_valid(self) -> bool:
        if self.min_available < self.task_min_available_total:
            return True
        return self._roles_meet_min(self._roles((S.SUCCEEDED, S.PIPELINED, S.PENDING), False))

    def check_task_ready(self) -> bool:
        if self.min_available < self.task_min_available_total:
            return True
        return self._roles_meet_min(self._roles((S.SUCCEEDED,), True))

    def check_task_pipelined(self) -> bool:
        if self.min_available < self.task_min_available_total:
            return True
        return self._roles_meet_min(self._roles((S.SUCCEEDED, S.PIPELINED), True))

    def fit_failed_roles(self) -> set[str]:
        return {self.tasks[uid].task_role for uid in self.nodes_fit_errors if uid in self.tasks}

    def task_has_fit_errors(self, task: TaskInfo) -> bool:
        """A task of a role that already failed to fit this session (the role cache)."""
        return bool(task.task_role) and task.task_role in self.fit_failed_roles()

    def need_continue_allocating(self) -> bool:
        """NeedContinueAllocating: after one task fit nowhere, can the rest still make
        the gang?"""
        if self.min_available >= len(self.tasks):
            return False
        failed = self.fit_failed_roles()
        pending: dict[str, int] = {}
        for t in self.tasks_in(S.PENDING):
            pending[t.task_role] = pending.get(t.task_role, 0) + 1
        if self.min_available < self.task_min_available_total:
            left = sum(n for role, n in pending.items() if role not in failed)
            return self.ready_task_num() + left >= self.min_available
        allocated = self._roles((S.SUCCEEDED,), True)
        return all(
            allocated.get(role, 0) >= self.task_min_available.get(role, 0)
            for role in failed
            if self.task_min_available.get(role, 0)
        )

    # ---------------------------------------------------------------- explaining

    def task_scheduling_reason(self, uid: str) -> tuple[str, str, str]:
        """(reason, message, nominatedNodeName) for a task's PodScheduled condition."""
        task = self.tasks.get(uid)
        if task is None:
            return "", "", ""
        ctx = task.last_transaction or task.transaction()
        msg = self.job_fit_errors
        if ctx.status == S.ALLOCATED:
            return (
                POD_REASON_SCHEDULABLE,
                f"Pod {task.key} can possibly be assigned to {ctx.node_name}, "
                "once minAvailable is satisfied",
                "",
            )
        if ctx.status == S.PIPELINED:
            return (
                POD_REASON_UNSCHEDULABLE,
                f"Pod {task.key} can possibly be assigned to {ctx.node_name}, once resource "
                "is released and minAvailable is satisfied",
                ctx.node_name if ctx.eviction_occurred else "",
            )
        if ctx.status == S.PENDING:
            fe = self.nodes_fit_errors.get(uid)
            return POD_REASON_UNSCHEDULABLE, (fe.error() if fe else msg), ""
        return str(ctx.status), msg, ""

    def fit_error(self) -> str:
        """FitError: ``pod group is not ready, 4 Pending, 4 minAvailable; Pending: 4
        Unschedulable. Origin reason is <task>: 0/2 nodes are unavailable: ...``"""
        counts: dict[str, int] = {}
        for status, ts in self.task_status_index.items():
            counts[str(status)] = counts.get(str(status), 0) + len(ts)
        counts["minAvailable"] = self.min_available
        state = apis.PG_READY if self.is_ready() else apis.PG_NOT_READY
        msg = f"{state}, {', '.join(sorted(f'{n} {k}' for k, n in counts.items()))}"
        pending: dict[str, int] = {}
        for uid in self.task_status_index.get(S.PENDING, {}):
            reason = self.task_scheduling_reason(uid)[0]
            pending[reason] = pending.get(reason, 0) + 1
        if pending:
            msg += f"; Pending: {', '.join(sorted(f'{n} {r}' for r, n in pending.items()))}"
        if self.job_fit_errors:
            msg += ". Origin reason is: " + self.job_fit_errors
        else:
            for task in sorted(self.tasks.values(), key=lambda t: t.name):
                fe = self.nodes_fit_errors.get(task.uid)
                if fe is not None:
                    msg += f". Origin reason is {task.name}: {fe.error()}"
                    break
        return msg

    def reset_fit_err(self) -> None:
        self.job_fit_errors = ""
        self.nodes_fit_errors = {}

    def clone(self) -> JobInfo:
        """Clone: the same PodGroup (copied), every task cloned."""
        job = JobInfo(
            self.uid,
            self.name,
            self.namespace,
            self.queue,
            self.priority,
            self.min_available,
            _copy_pg(self.pod_group),
            self.creation_timestamp,
            self.preemptable,
            task_min_available=dict(self.task_min_available),
            task_min_available_total=self.task_min_available_total,
        )
        for task in self.tasks.values():
            job.add_task_info(task.clone())
        return job

    def __str__(self) -> str:
        return f"Job {self.uid} (queue {self.queue}, minAvailable {self.min_available})"


def _copy_pg(pg: Obj | None) -> Obj | None:
    """A copy whose status (and its conditions) the session may change."""
    if pg is None:
        return None
    status = dict(pg.get("status") or {})
    status["conditions"] = [dict(c) for c in status.get("conditions") or []]
    return {**pg, "status": status}


def job_terminated(job: JobInfo) -> bool:
    return job.pod_group is None and not job.tasks
