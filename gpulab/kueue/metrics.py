"""Prometheus metrics with the release's names, labels and buckets.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/metrics/metrics.go (subsystem ``kueue``,
label ``replica_role`` = "standalone" for a single replica): admission attempts,
pending Workloads per ClusterQueue (active / inadmissible), quota reservations and
admissions with their wait-time histograms (``generateExponentialBuckets``),
evictions, preemptions, finished Workloads, active Workloads, ClusterQueue status,
and, with ``metrics.enableClusterQueueResources``, the per-flavor resource gauges;
with the UnadmittedWorkloadsObservability gate, ``kueue_unadmitted_workloads`` kept by
``UnadmittedWorkloads`` (pkg/cache/queue/unadmitted_workloads.go; the LocalQueue
variant needs LocalQueue metrics, which the lab does not serve). Served on their own
port (``--metrics-bind``; upstream :8443 behind auth, here plain HTTP for the lab).
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

ROLE = "standalone"


def exponential_buckets(count: int) -> list[float]:
    """generateExponentialBuckets: 1, then 2.5 doubling (count buckets)."""
    return [1.0] + [2.5 * 2**i for i in range(count - 1)]


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        cq = ["cluster_queue", "priority_class", "replica_role"]
        self.admission_attempts = Counter(
            "kueue_admission_attempts_total",
            "The total number of attempts to admit workloads.",
            ["result", "replica_role"],
            registry=r,
        )
        self.admission_attempt_duration = Histogram(
            "kueue_admission_attempt_duration_seconds",
            "The latency of an admission attempt.",
            ["result", "replica_role"],
            registry=r,
        )
        self.pending = Gauge(
            "kueue_pending_workloads",
            "The number of pending workloads, per 'cluster_queue' and 'status'.",
            ["cluster_queue", "status", "replica_role"],
            registry=r,
        )
        self.quota_reserved = Counter(
            "kueue_quota_reserved_workloads_total",
            "The total number of quota reserved workloads per 'cluster_queue'",
            cq,
            registry=r,
        )
        self.quota_reserved_wait = Histogram(
            "kueue_quota_reserved_wait_time_seconds",
            "The time between a workload was created or requeued until it got quota "
            "reservation, per 'cluster_queue'",
            cq,
            buckets=exponential_buckets(14),
            registry=r,
        )
        self.admitted = Counter(
            "kueue_admitted_workloads_total",
            "The total number of admitted workloads per 'cluster_queue'",
            cq,
            registry=r,
        )
        self.admission_wait = Histogram(
            "kueue_admission_wait_time_seconds",
            "The time between a workload was created or requeued until admission, "
            "per 'cluster_queue'",
            cq,
            buckets=exponential_buckets(16),
            registry=r,
        )
        self.evicted = Counter(
            "kueue_evicted_workloads_total",
            "The number of evicted workloads per 'cluster_queue'",
            ["cluster_queue", "reason", "underlying_cause", "priority_class", "replica_role"],
            registry=r,
        )
        self.preempted = Counter(
            "kueue_preempted_workloads_total",
            "The number of preempted workloads per 'preempting_cluster_queue'",
            ["preempting_cluster_queue", "reason", "replica_role"],
            registry=r,
        )
        self.finished = Counter(
            "kueue_finished_workloads_total",
            "The total number of finished workloads per 'cluster_queue'",
            cq,
            registry=r,
        )
        self.reserving_active = Gauge(
            "kueue_reserving_active_workloads",
            "The number of Workloads that are reserving quota, per 'cluster_queue'",
            ["cluster_queue", "replica_role"],
            registry=r,
        )
        self.admitted_active = Gauge(
            "kueue_admitted_active_workloads",
            "The number of admitted Workloads that are active, per 'cluster_queue'",
            ["cluster_queue", "replica_role"],
            registry=r,
        )
        self.cq_status = Gauge(
            "kueue_cluster_queue_status",
            "Reports 'cluster_queue' with its 'status' (pending, active or terminating).",
            ["cluster_queue", "status", "replica_role"],
            registry=r,
        )
        flavor = ["cohort", "cluster_queue", "flavor", "resource", "replica_role"]
        self.resource_usage = Gauge(
            "kueue_cluster_queue_resource_usage",
            "Reports the cluster_queue's total resource usage within all the flavors",
            flavor,
            registry=r,
        )
        self.resource_reservation = Gauge(
            "kueue_cluster_queue_resource_reservation",
            "Reports the cluster_queue's total resource reservation within all the flavors",
            flavor,
            registry=r,
        )
        self.nominal_quota = Gauge(
            "kueue_cluster_queue_nominal_quota",
            "Reports the cluster_queue's resource nominal quota within all the flavors",
            flavor,
            registry=r,
        )
        self.weighted_share = Gauge(
            "kueue_cluster_queue_weighted_share",
            "The maximum ratio of usage above nominal quota to the lendable resources in "
            "the cohort, divided by the weight.",
            ["cluster_queue", "cohort", "replica_role"],
            registry=r,
        )

        self.unadmitted = Gauge(
            "kueue_unadmitted_workloads",
            "The number of unadmitted workloads, per 'cluster_queue', 'reason', and "
            "'underlying_cause'. This metric is only emitted when "
            "UnadmittedWorkloadsObservability feature gate is enabled.",
            ["cluster_queue", "reason", "underlying_cause", "replica_role"],
            registry=r,
        )

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)


# (cluster queue, Admitted reason, QuotaReserved reason) of one unadmitted Workload
UnadmittedStatus = tuple[str, str, str]


class UnadmittedWorkloads:
    """unadmittedWorkloads: each unadmitted Workload's status and the count per
    ClusterQueue, reason and underlying cause behind ``kueue_unadmitted_workloads``."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._statuses: dict[str, UnadmittedStatus] = {}
        self._counts: Tally[UnadmittedStatus] = Tally()

    def update(self, key: str, status: UnadmittedStatus | None) -> None:
        """Track the Workload's new status (None: admitted, finished or going)."""
        old = self._statuses.pop(key, None)
        if old == status:
            if status is not None:
                self._statuses[key] = status
            return
        if old is not None:
            self._count(old, -1)
        if status is not None:
            self._statuses[key] = status
            self._count(status, 1)

    def remove(self, key: str) -> None:
        self.update(key, None)

    def _count(self, status: UnadmittedStatus, diff: int) -> None:
        self._counts[status] += diff
        count = self._counts[status]
        if count <= 0:
            del self._counts[status]
        if not status[0]:
            return  # no ClusterQueue to report it under
        labels = (*status, ROLE)
        if count <= 0:
            self._gauge.remove(*labels)
        else:
            self._gauge.labels(*labels).set(count)
