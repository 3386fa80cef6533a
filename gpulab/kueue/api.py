"""Names and constants of the kueue.x-k8s.io API, as upstream spells them.

Mirrors apis/kueue/v1beta2/{clusterqueue,workload,localqueue}_types.go and
pkg/controller/constants/constants.go.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"  # the storage version; v1beta1 is served through the conversion webhook
OLD_VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"

# (kind, plural, namespaced)
RESOURCE_FLAVOR = ("ResourceFlavor", "resourceflavors", False)
CLUSTER_QUEUE = ("ClusterQueue", "clusterqueues", False)
LOCAL_QUEUE = ("LocalQueue", "localqueues", True)
WORKLOAD = ("Workload", "workloads", True)

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
DEFAULT_POD_SET = "main"

# Workload condition types.
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
FINISHED = "Finished"
EVICTED = "Evicted"
PREEMPTED = "Preempted"
REQUEUED = "Requeued"

# QuotaReserved=False reasons (UnadmittedWorkloadsObservability, on by default upstream).
REASON_NO_MATCHING_FLAVOR = "NoMatchingFlavor"
REASON_WAITING_FOR_QUOTA = "WaitingForQuota"
REASON_EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
REASON_WAITING_FOR_PREEMPTED = "WaitingForPreemptedWorkloads"
REASON_MISCONFIGURED = "Misconfigured"
REASON_SUSPENDED = "Suspended"
REASON_PENDING_EVALUATION = "PendingEvaluation"

# Evicted / Preempted reasons.
EVICTED_BY_PREEMPTION = "Preempted"
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"

FINISHED_SUCCEEDED = "Succeeded"
FINISHED_FAILED = "Failed"

# ClusterQueue Active condition.
CQ_ACTIVE = "Active"
CQ_REASON_READY = "Ready"
CQ_REASON_FLAVOR_NOT_FOUND = "FlavorNotFound"

STRICT_FIFO = "StrictFIFO"
BEST_EFFORT_FIFO = "BestEffortFIFO"

NEVER = "Never"
LOWER_PRIORITY = "LowerPriority"
LOWER_OR_NEWER_EQUAL_PRIORITY = "LowerOrNewerEqualPriority"
ANY = "Any"


@dataclass(frozen=True, order=True)
class FlavorResource:
    """One (flavor, resource) pair: the unit quota is kept in (resources.FlavorResource)."""

    flavor: str
    resource: str

    def __str__(self) -> str:
        return f"{self.resource} in flavor {self.flavor}"


def quantity(value: object) -> Decimal:
    """A Kubernetes quantity ("500m", "36Gi", 9) as an exact Decimal."""
    return parse_quantity(value)


_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


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
