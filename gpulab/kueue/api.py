"""Names and constants of the kueue.x-k8s.io API, as upstream spells them.

Mirrors kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta2/{clusterqueue,workload,
localqueue,cohort,admissioncheck,workloadpriorityclass}_types.go,
pkg/controller/constants/constants.go, pkg/constants/constants.go and
pkg/controller/jobs/pod/constants/constants.go; resource quantities as
pkg/resources/requests.go ``ResourceValue`` (int64, CPU in millicores) and
resource_formatter.go ``ResourceQuantityString``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

RELEASE = "kubernetes-sigs/kueue v0.19.2"

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"  # the storage version; v1beta1 is served through the conversion webhook
OLD_VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

# (kind, plural, namespaced)
RESOURCE_FLAVOR = ("ResourceFlavor", "resourceflavors", False)
CLUSTER_QUEUE = ("ClusterQueue", "clusterqueues", False)
LOCAL_QUEUE = ("LocalQueue", "localqueues", True)
WORKLOAD = ("Workload", "workloads", True)
COHORT = ("Cohort", "cohorts", False)
ADMISSION_CHECK = ("AdmissionCheck", "admissionchecks", False)
WORKLOAD_PRIORITY_CLASS = ("WorkloadPriorityClass", "workloadpriorityclasses", False)
KINDS = (
    RESOURCE_FLAVOR,
    CLUSTER_QUEUE,
    LOCAL_QUEUE,
    WORKLOAD,
    COHORT,
    ADMISSION_CHECK,
    WORKLOAD_PRIORITY_CLASS,
)

# Labels and annotations (pkg/controller/constants, pkg/constants, pod/constants).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_LABEL = "kueue.x-k8s.io/managed"  # value "true"; also the pod finalizer's name
POD_FINALIZER = MANAGED_LABEL
RESOURCE_IN_USE_FINALIZER = "kueue.x-k8s.io/resource-in-use"
ADMISSION_GATE = "kueue.x-k8s.io/admission"  # the pods' scheduling gate
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
POD_GROUP_SERVING = "kueue.x-k8s.io/pod-group-serving"
IS_GROUP_WORKLOAD = "kueue.x-k8s.io/is-group-workload"
ROLE_HASH = "kueue.x-k8s.io/role-hash"
SUSPENDED_BY_PARENT = "kueue.x-k8s.io/pod-suspending-parent"
JOB_MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
DEFAULT_LOCAL_QUEUE = "default"
DEFAULT_PRIORITY_CLASS = "default"
DEFAULT_POD_SET = "main"
PODS = "pods"  # a ClusterQueue covering it limits the number of pods
# What startJob puts on the pods (pkg/constants; the queue names: AssignQueueLabelsForPods)
PODSET_LABEL = "kueue.x-k8s.io/podset"
LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name"
CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/cluster-queue-name"

# Workload condition types.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
FINISHED = "Finished"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"
PODS_READY = "PodsReady"
DEACTIVATION_TARGET = "DeactivationTarget"

# QuotaReserved=False reasons. Granular ones only with the UnadmittedWorkloadsObservability
# feature gate (Beta, off by default in v0.19); otherwise "Pending" / "Inadmissible".
REASON_NO_MATCHING_FLAVOR = "NoMatchingFlavor"
REASON_WAITING_FOR_QUOTA = "WaitingForQuota"
REASON_EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
REASON_WAITING_FOR_PREEMPTED = "WaitingForPreemptedWorkloads"
REASON_WAITING_FOR_PODS_READY = "WaitingForPodsReady"
REASON_MISCONFIGURED = "Misconfigured"
REASON_SUSPENDED = "Suspended"
REASON_PENDING_EVALUATION = "PendingEvaluation"
PENDING = "Pending"
INADMISSIBLE = "Inadmissible"
WAITING = "Waiting"

# Evicted / Preempted / Requeued reasons.
EVICTED_BY_PREEMPTION = "Preempted"
EVICTED_BY_PODS_READY_TIMEOUT = "PodsReadyTimeout"
EVICTED_BY_ADMISSION_CHECK = "AdmissionCheck"
EVICTED_BY_CQ_STOPPED = "ClusterQueueStopped"
EVICTED_BY_LQ_STOPPED = "LocalQueueStopped"
DEACTIVATED = "Deactivated"
BACKOFF_FINISHED = "BackoffFinished"
REQUEUING_LIMIT_EXCEEDED = "RequeuingLimitExceeded"
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"

# PodsReady reasons (jobframework generatePodsReadyCondition).
WAIT_FOR_START = "WaitForStart"
WAIT_FOR_RECOVERY = "WaitForRecovery"
STARTED = "Started"
RECOVERED = "Recovered"

FINISHED_SUCCEEDED = "Succeeded"
FINISHED_FAILED = "Failed"
FINISHED_FAILED_TO_START = "FailedToStart"  # the pod template cannot take the admission

# ClusterQueue / LocalQueue / AdmissionCheck Active condition.
CQ_ACTIVE = "Active"
CQ_REASON_READY = "Ready"
CQ_REASON_FLAVOR_NOT_FOUND = "FlavorNotFound"

# AdmissionCheck states (workload.status.admissionChecks[].state).
CHECK_PENDING = "Pending"
CHECK_READY = "Ready"
CHECK_RETRY = "Retry"
CHECK_REJECTED = "Rejected"

STRICT_FIFO = "StrictFIFO"
BEST_EFFORT_FIFO = "BestEffortFIFO"

NEVER = "Never"
LOWER_PRIORITY = "LowerPriority"
LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"
ANY = "Any"

MAY_STOP_SEARCH = "MayStopSearch"
TRY_NEXT_FLAVOR = "TryNextFlavor"
BORROWING_OVER_PREEMPTION = "BorrowingOverPreemption"
PREEMPTION_OVER_BORROWING = "PreemptionOverBorrowing"

STOP_NONE = "None"
HOLD = "Hold"
HOLD_AND_DRAIN = "HoldAndDrain"


@dataclass(frozen=True, order=True)
class FlavorResource:
    """One (flavor, resource) pair: the unit quota is kept in (resources.FlavorResource)."""

    flavor: str
    resource: str

    def __str__(self) -> str:
        return f"{self.resource} in flavor {self.flavor}"


def resource_value(name: str, value: object) -> int:
    """A quantity as upstream counts it: CPU in millicores, anything else in units
    (rounded up), e.g. ("cpu", "500m") -> 500, ("memory", "1Gi") -> 1073741824."""
    q = parse_quantity(value)
    if name == "cpu":
        q = q * 1000
    n = int(q)
    return n if n == q else n + (1 if q > 0 else 0)


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


# Exact Decimal quantities, shared with the scheduling framework and Volcano.
def quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("500m", "36Gi", 9) as an exact Decimal."""
    return parse_quantity(value)


def format_quantity(value: Decimal) -> str:
    """An exact, short quantity string: 3 -> "3", 0.5 -> "500m", 1887436800 -> "1800Mi"."""
    if value == value.to_integral_value():
        n = int(value)
        # Byte counts read best in binary units (what memory requests are written in).
        for suffix, unit in _BINARY:
            if n >= unit and n % unit == 0:
                return f"{n // unit}{suffix}"
        return str(n)
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return format(value.normalize(), "f")


def format_value(name: str, v: int) -> str:
    """The quantity string for a value counted as ``resource_value`` counts it."""
    if name == "cpu":
        return str(v // 1000) if v % 1000 == 0 else f"{v}m"
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        for suffix, unit in _BINARY:
            if v >= unit and v % unit == 0:
                return f"{v // unit}{suffix}"
    return str(v)
