"""The volcano.sh API facts the lab uses, spelled as upstream spells them.

Mirrors volcano-sh/volcano v1.15.1 ``staging/src/volcano.sh/apis/pkg/apis``:
``scheduling/v1beta1/{types,labels}.go`` (PodGroup, Queue, phases, conditions, the
``scheduling.k8s.io/group-name`` annotation), ``batch/v1alpha1/{job,labels}.go`` (vcjob
phases, ``volcano.sh/*`` keys), ``bus/v1alpha1/{events,actions}.go`` (lifecycle events and
actions, the Command kind) and ``pkg/controllers/job/helpers`` (pod naming, the
out-of-sync annotation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.informer import Resource

SCHEDULING_GROUP = "scheduling.volcano.sh"
SCHEDULING_VERSION = "v1beta1"
BATCH_GROUP = "batch.volcano.sh"
BATCH_VERSION = "v1alpha1"
BUS_GROUP = "bus.volcano.sh"
BUS_VERSION = "v1alpha1"

PODGROUPS = Resource(SCHEDULING_GROUP, SCHEDULING_VERSION, "podgroups", "PodGroup")
QUEUES = Resource(SCHEDULING_GROUP, SCHEDULING_VERSION, "queues", "Queue", namespaced=False)
JOBS = Resource(BATCH_GROUP, BATCH_VERSION, "jobs", "Job")
COMMANDS = Resource(BUS_GROUP, BUS_VERSION, "commands", "Command")
PRIORITY_CLASSES = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False
)

DEFAULT_SCHEDULER_NAME = "volcano"
DEFAULT_QUEUE = "default"
ROOT_QUEUE = "root"

# -- scheduling.volcano.sh/v1beta1 --------------------------------------------------------

KUBE_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
POD_PREEMPTABLE = "volcano.sh/preemptable"
TASK_PRIORITY_ANNOTATION = "volcano.sh/task-priority"

# PodGroup phases
PG_PENDING, PG_RUNNING, PG_UNKNOWN, PG_INQUEUE, PG_COMPLETED = (
    "Pending",
    "Running",
    "Unknown",
    "Inqueue",
    "Completed",
)
# PodGroup condition types and details
PG_UNSCHEDULABLE_TYPE = "Unschedulable"
PG_SCHEDULED = "Scheduled"
PG_READY = "pod group is ready"
PG_NOT_READY = "pod group is not ready"
NOT_ENOUGH_RESOURCES_REASON = "NotEnoughResources"
NOT_ENOUGH_PODS_REASON = "NotEnoughTasks"
NOT_ENOUGH_PODS_OF_TASK_REASON = "NotEnoughPodsOfTask"

# Queue states
QUEUE_OPEN, QUEUE_CLOSED, QUEUE_CLOSING, QUEUE_UNKNOWN = "Open", "Closed", "Closing", "Unknown"

# -- batch.volcano.sh/v1alpha1 ------------------------------------------------------------

TASK_SPEC_KEY = "volcano.sh/task-spec"
TASK_INDEX = "volcano.sh/task-index"
JOB_NAME_KEY = "volcano.sh/job-name"
QUEUE_NAME_KEY = "volcano.sh/queue-name"
JOB_NAMESPACE_KEY = "volcano.sh/job-namespace"
JOB_VERSION = "volcano.sh/job-version"
JOB_RETRY_COUNT_KEY = "volcano.sh/job-retry-count"
POD_TEMPLATE_KEY = "volcano.sh/template-uid"
DEFAULT_TASK_SPEC = "default"
OUT_OF_SYNC_KEY = "volcano.sh/controller-out-of-sync"  # controllers/job/helpers
POD_NAME_FMT = "{job}-{task}-{index}"

# vcjob phases
JOB_PENDING = "Pending"
JOB_ABORTING = "Aborting"
JOB_ABORTED = "Aborted"
JOB_RUNNING = "Running"
JOB_RESTARTING = "Restarting"
JOB_COMPLETING = "Completing"
JOB_COMPLETED = "Completed"
JOB_TERMINATING = "Terminating"
JOB_TERMINATED = "Terminated"
JOB_FAILED = "Failed"
FINISHED_PHASES = (JOB_COMPLETED, JOB_TERMINATED, JOB_FAILED)

# vcjob Event reasons (batch/v1alpha1 JobEvent)
EXECUTE_ACTION = "ExecuteAction"
POD_GROUP_PENDING = "PodGroupPending"
POD_GROUP_ERROR = "PodGroupError"

# -- bus.volcano.sh/v1alpha1 --------------------------------------------------------------

ANY_EVENT = "*"
POD_FAILED_EVENT = "PodFailed"
POD_EVICTED_EVENT = "PodEvicted"
POD_PENDING_EVENT = "PodPending"
POD_RUNNING_EVENT = "PodRunning"
JOB_UNKNOWN_EVENT = "Unknown"
TASK_COMPLETED_EVENT = "TaskCompleted"
OUT_OF_SYNC_EVENT = "OutOfSync"
COMMAND_ISSUED_EVENT = "CommandIssued"
JOB_UPDATED_EVENT = "JobUpdated"
TASK_FAILED_EVENT = "TaskFailed"

ABORT_JOB = "AbortJob"
RESTART_JOB = "RestartJob"
RESTART_TASK = "RestartTask"
RESTART_POD = "RestartPod"
RESTART_PARTITION = "RestartPartition"
TERMINATE_JOB = "TerminateJob"
COMPLETE_JOB = "CompleteJob"
RESUME_JOB = "ResumeJob"
SYNC_JOB = "SyncJob"
ENQUEUE_JOB = "EnqueueJob"
SYNC_QUEUE = "SyncQueue"
OPEN_QUEUE = "OpenQueue"
CLOSE_QUEUE = "CloseQueue"

Obj = Mapping[str, Any]


def pod_name(job: str, task: str, index: int) -> str:
    """``<job>-<task>-<index>`` (controllers/job/helpers MakePodName)."""
    return POD_NAME_FMT.format(job=job, task=task, index=index)


def pod_group_name(job: Obj) -> str:
    """``<job>-<job uid>``: the PodGroup the job controller creates for a vcjob."""
    meta = job.get("metadata") or {}
    return f"{meta.get('name')}-{meta.get('uid')}"


def group_name_of(pod: Obj) -> str:
    """The PodGroup a pod belongs to (its ``scheduling.k8s.io/group-name``), or ""."""
    return str(
        ((pod.get("metadata") or {}).get("annotations") or {}).get(KUBE_GROUP_NAME_ANNOTATION) or ""
    )
