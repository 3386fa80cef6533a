"""The quota cache: ClusterQueues, their cohorts and the quota admitted Workloads hold.

Pure (no API calls). Mirrors pkg/cache/scheduler/{cache,clusterqueue,cohort}.go and the
quota arithmetic of pkg/cache/scheduler/resource_node.go for one level of cohort (a
cohort is only a name linking ClusterQueues, as in the seed chapter):

- a ClusterQueue's quota for a (flavor, resource) is its nominalQuota; with a
  lendingLimit, ``nominal - lendingLimit`` stays local (never lent to the cohort);
- the cohort's quota is the sum of what its members lend, its usage the sum of
  members' usage beyond their local quota;
- what a ClusterQueue may still use is its unused local quota plus what the cohort has
  left, capped by its borrowingLimit.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource, format_quantity
from gpulab.kueue.model import ClusterQueue, Flavor, Quota, WorkloadInfo

ZERO = Decimal(0)
_NO_QUOTA = Quota(nominal=ZERO)


@dataclass
class Cache:
    flavors: dict[str, Flavor] = field(default_factory=dict)
    cluster_queues: dict[str, ClusterQueue] = field(default_factory=dict)
    # Workloads holding quota (status.admission set), by namespace/name.
    workloads: dict[str, WorkloadInfo] = field(default_factory=dict)
    # Usage per ClusterQueue per (flavor, resource).
    usage: dict[str, dict[FlavorResource, Decimal]] = field(default_factory=dict)

    # -- objects -------------------------------------------------------------

    def add_or_update_flavor(self, flavor: Flavor) -> None:
        self.flavors[flavor.name] = flavor

    def delete_flavor(self, name: str) -> None:
        self.flavors.pop(name, None)

    def add_or_update_cluster_queue(self, cq: ClusterQueue) -> None:
        self.cluster_queues[cq.name] = cq
        self.usage.setdefault(cq.name, {})

    def delete_cluster_queue(self, name: str) -> None:
        self.cluster_queues.pop(name, None)

    def add_workload(self, wl: WorkloadInfo) -> None:
        """Account for an admitted Workload (replacing an older copy of it)."""
        if wl.admission is None or wl.cluster_queue is None:
            raise ValueError(f"workload {wl.key} has no admission")
        self.remove_workload(wl.key)
        self.workloads[wl.key] = wl
        used = self.usage.setdefault(wl.cluster_queue, {})
        for fr, v in wl.usage().items():
            used[fr] = used.get(fr, ZERO) + v

    def remove_workload(self, key: str) -> WorkloadInfo | None:
        """Release the quota of a Workload; returns it if it was accounted."""
        wl = self.workloads.pop(key, None)
        if wl is None or wl.cluster_queue is None:
            return wl
        used = self.usage.setdefault(wl.cluster_queue, {})
        for fr, v in wl.usage().items():
            used[fr] = used.get(fr, ZERO) - v
        return wl

    def clone(self) -> Cache:
        """A copy whose usage can be changed freely (a scheduling snapshot)."""
        return Cache(
            flavors=dict(self.flavors),
            cluster_queues=dict(self.cluster_queues),
            workloads=dict(self.workloads),
            usage=copy.deepcopy(self.usage),
        )

    def workloads_in(self, cq_name: str) -> list[WorkloadInfo]:
        return [w for w in self.workloads.values() if w.cluster_queue == cq_name]

    # -- activity ------------------------------------------------------------

    def missing_flavors(self, cq: ClusterQueue) -> list[str]:
        return [name for name in cq.flavor_names() if name not in self.flavors]

    def active_condition(self, cq: ClusterQueue) -> tuple[bool, str, str]:
        """(active, reason, message) of the ClusterQueue's Active condition."""
        missing = self.missing_flavors(cq)
        if missing:
            return (
                False,
                api.CQ_REASON_FLAVOR_NOT_FOUND,
                "Can't admit new workloads: references missing ResourceFlavor(s): "
                f"{','.join(missing)}.",
            )
        if cq.stop_policy not in ("None", ""):
            return False, "Stopped", "Can't admit new workloads: clusterQueue is stopped."
        return True, api.CQ_REASON_READY, "Can admit new workloads"

    def is_active(self, cq_name: str) -> bool:
        cq = self.cluster_queues.get(cq_name)
        return cq is not None and self.active_condition(cq)[0]

    # -- quota arithmetic (resource_node.go) -----------------------------------

    def members(self, cohort: str) -> list[ClusterQueue]:
        return [cq for cq in self.cluster_queues.values() if cq.cohort == cohort]

    def quota(self, cq: ClusterQueue, fr: FlavorResource) -> Quota:
        return cq.quotas.get(fr, _NO_QUOTA)

    def used(self, cq_name: str, fr: FlavorResource) -> Decimal:
        return self.usage.get(cq_name, {}).get(fr, ZERO)

    def local_quota(self, cq: ClusterQueue, fr: FlavorResource) -> Decimal:
        """Quota kept for the ClusterQueue alone because of its lendingLimit."""
        q = self.quota(cq, fr)
        if q.lending_limit is None or cq.cohort is None:
            return ZERO
        return max(ZERO, q.nominal - q.lending_limit)

    def cohort_quota(self, cohort: str, fr: FlavorResource) -> Decimal:
        return sum(
            (self.quota(m, fr).nominal - self.local_quota(m, fr) for m in self.members(cohort)),
            ZERO,
        )

    def cohort_usage(self, cohort: str, fr: FlavorResource) -> Decimal:
        return sum(
            (
                max(ZERO, self.used(m.name, fr) - self.local_quota(m, fr))
                for m in self.members(cohort)
            ),
            ZERO,
        )

    def available(self, cq: ClusterQueue, fr: FlavorResource) -> Decimal:
        """Unused quota the ClusterQueue can take now, borrowing included (may be < 0)."""
        q = self.quota(cq, fr)
        used = self.used(cq.name, fr)
        if cq.cohort is None:
            return q.nominal - used
        parent = self.cohort_quota(cq.cohort, fr) - self.cohort_usage(cq.cohort, fr)
        lq = self.local_quota(cq, fr)
        if q.borrowing_limit is not None:
            stored_in_parent = q.nominal - lq
            used_in_parent = max(ZERO, used - lq)
            parent = min(stored_in_parent - used_in_parent + q.borrowing_limit, parent)
        return max(ZERO, lq - used) + parent

    def potential_available(self, cq: ClusterQueue, fr: FlavorResource) -> Decimal:
        """The most the ClusterQueue could ever use if nothing else ran."""
        q = self.quota(cq, fr)
        if cq.cohort is None:
            return q.nominal
        avail = self.local_quota(cq, fr) + self.cohort_quota(cq.cohort, fr)
        if q.borrowing_limit is not None:
            avail = min(q.nominal + q.borrowing_limit, avail)
        return avail

    def borrowing_with(self, cq: ClusterQueue, fr: FlavorResource, extra: Decimal) -> bool:
        return self.used(cq.name, fr) + extra > self.quota(cq, fr).nominal

    def borrowing(self, cq: ClusterQueue, fr: FlavorResource) -> bool:
        return self.borrowing_with(cq, fr, ZERO)

    def fits(
        self, cq: ClusterQueue, usage: Mapping[FlavorResource, Decimal], allow_borrowing: bool
    ) -> bool:
        for fr, v in usage.items():
            if not allow_borrowing and self.borrowing_with(cq, fr, v):
                return False
            if v > self.available(cq, fr):
                return False
        return True

    # -- status ----------------------------------------------------------------

    def flavors_usage(self, cq: ClusterQueue) -> list[dict[str, object]]:
        """status.flavorsUsage / flavorsReservation: total and borrowed per flavor."""
        out: list[dict[str, object]] = []
        for group in cq.resource_groups:
            for flavor in group.flavors:
                resources = []
                for resource in group.covered_resources:
                    fr = FlavorResource(flavor, resource)
                    total = self.used(cq.name, fr)
                    borrowed = max(ZERO, total - self.quota(cq, fr).nominal)
                    resources.append(
                        {
                            "name": resource,
                            "total": format_quantity(total),
                            "borrowed": format_quantity(borrowed),
                        }
                    )
                out.append({"name": flavor, "resources": resources})
        return out
