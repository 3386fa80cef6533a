"""The scheduler cache: ClusterQueues and Cohorts as a tree of resource nodes, the quota
admitted Workloads hold, and the snapshot a scheduling cycle works on. Pure (no I/O).

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/cache/scheduler: resource_node.go (every node
keeps ``Quotas``, ``SubtreeQuota`` and ``Usage``; ``available``, ``potentialAvailable``,
``addUsage`` / ``removeUsage`` walk up the tree, a lendingLimit keeps
``subtreeQuota - lendingLimit`` local), cohort.go / clusterqueue.go (hierarchical
Cohorts: a ClusterQueue's ``cohortName`` and a Cohort's ``parentName``; a cohort named
but not created exists implicitly with no quota of its own), snapshot.go
(``AddWorkload``, ``RemoveWorkload``, ``SimulateWorkloadRemoval``), fair_sharing.go
(``dominantResourceShare``) and clusterqueue.go (``inactiveReason``; with
waitForPodsReady.blockAdmission, ``WorkloadsNotReady``: a Workload is not ready from the
moment it is assumed or added until its PodsReady condition is true).

The cache keeps one live tree whose usage moves as Workloads are added and removed;
a ``Snapshot`` is a copy of it whose usage the scheduler may change freely.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource, format_value
from gpulab.kueue.model import ClusterQueue, Cohort, Flavor, Quota, WorkloadInfo, condition_true

_NO_QUOTA = Quota(nominal=0)


# -- resource nodes (resource_node.go) ----------------------------------------------------


@dataclass(eq=False)
class Node:
    """A ClusterQueue or a Cohort in the quota tree."""

    name: str
    quotas: Mapping[FlavorResource, Quota]
    fair_weight: float = 1.0
    subtree_quota: dict[FlavorResource, int] = field(default_factory=dict)
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    parent: CohortNode | None = None

    def quota(self, fr: FlavorResource) -> Quota:
        return self.quotas.get(fr, _NO_QUOTA)

    def local_quota(self, fr: FlavorResource) -> int:
        """What a lendingLimit keeps for this node alone."""
        lending = self.quota(fr).lending_limit
        if lending is None:
            return 0
        return max(0, self.subtree_quota.get(fr, 0) - lending)

    def local_available(self, fr: FlavorResource) -> int:
        return max(0, self.local_quota(fr) - self.usage.get(fr, 0))

    def path_to_root(self) -> Iterator[CohortNode]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def root(self) -> Node:
        node: Node = self
        while node.parent is not None:
            node = node.parent
        return node


@dataclass(eq=False)
class CQNode(Node):
    """ClusterQueueSnapshot: the spec, its admitted Workloads and its place in the tree."""

    spec: ClusterQueue = field(default_factory=lambda: ClusterQueue(name=""))
    workloads: dict[str, WorkloadInfo] = field(default_factory=dict)
    # Bumped whenever what the queue can admit changes (AllocatableResourceGeneration).
    generation: int = 0

    def borrowing_with(self, fr: FlavorResource, val: int) -> bool:
        return self.quota(fr).nominal < self.usage.get(fr, 0) + val

    def borrowing(self, fr: FlavorResource) -> bool:
        return self.borrowing_with(fr, 0)

    def available(self, fr: FlavorResource) -> int:
        return max(0, available(self, fr))

    def potential_available(self, fr: FlavorResource) -> int:
        return potential_available(self, fr)

    def fits(self, usage: Mapping[FlavorResource, int]) -> bool:
        return all(self.available(fr) >= v for fr, v in usage.items())

    def add_usage(self, usage: Mapping[FlavorResource, int]) -> None:
        for fr, v in usage.items():
            add_usage(self, fr, v)

    def remove_usage(self, usage: Mapping[FlavorResource, int]) -> None:
        for fr, v in usage.items():
            remove_usage(self, fr, v)


@dataclass(eq=False)
class CohortNode(Node):
    child_cqs: list[CQNode] = field(default_factory=list)
    child_cohorts: list[CohortNode] = field(default_factory=list)

    def borrowing_with(self, fr: FlavorResource, val: int) -> bool:
        return self.subtree_quota.get(fr, 0) < self.usage.get(fr, 0) + val

    def subtree_cluster_queues(self) -> list[CQNode]:
        out = list(self.child_cqs)
        for child in self.child_cohorts:
            out += child.subtree_cluster_queues()
        return out

    def height(self) -> int:
        """getNodeHeight: 1 for a cohort of ClusterQueues, +1 per level of cohorts."""
        h = min(len(self.child_cqs) + len(self.child_cohorts), 1)
        for child in self.child_cohorts:
            h = max(h, child.height() + 1)
        return h


def available(node: Node, fr: FlavorResource) -> int:
    """What the node may still take: its local quota plus what its parent can give,
    capped by its borrowingLimit (may be negative)."""
    if node.parent is None:
        return node.subtree_quota.get(fr, 0) - node.usage.get(fr, 0)
    parent_available = available(node.parent, fr)
    borrowing = node.quota(fr).borrowing_limit
    if borrowing is not None:
        lq = node.local_quota(fr)
        stored_in_parent = node.subtree_quota.get(fr, 0) - lq
        used_in_parent = max(0, node.usage.get(fr, 0) - lq)
        parent_available = min(stored_in_parent - used_in_parent + borrowing, parent_available)
    return node.local_available(fr) + parent_available


def potential_available(node: Node, fr: FlavorResource) -> int:
    """The most the node could ever use if nothing else ran."""
    if node.parent is None:
        return node.subtree_quota.get(fr, 0)
    avail = node.local_quota(fr) + potential_available(node.parent, fr)
    borrowing = node.quota(fr).borrowing_limit
    if borrowing is not None:
        avail = min(node.subtree_quota.get(fr, 0) + borrowing, avail)
    return avail


def add_usage(node: Node, fr: FlavorResource, val: int) -> None:
    local = node.local_available(fr)
    node.usage[fr] = node.usage.get(fr, 0) + val
    if node.parent is not None and val > local:
        add_usage(node.parent, fr, val - local)


def remove_usage(node: Node, fr: FlavorResource, val: int) -> None:
    stored_in_parent = node.usage.get(fr, 0) - node.local_quota(fr)
    node.usage[fr] = node.usage.get(fr, 0) - val
    if stored_in_parent <= 0 or node.parent is None:
        return
    remove_usage(node.parent, fr, min(val, stored_in_parent))


def quantities_fit_in_quota(
    node: Node, requests: Mapping[FlavorResource, int]
) -> tuple[bool, dict[FlavorResource, int]]:
    fits = True
    remaining: dict[FlavorResource, int] = {}
    for fr, v in requests.items():
        if node.subtree_quota.get(fr, 0) < node.usage.get(fr, 0) + v:
            fits = False
        remaining[fr] = max(0, v - node.local_available(fr))
    return fits, remaining


def is_within_nominal(node: Node, frs: set[FlavorResource]) -> bool:
    return all(node.subtree_quota.get(fr, 0) >= node.usage.get(fr, 0) for fr in frs)


def _accumulate(cohort: CohortNode) -> None:
    """updateCohortResourceNode: subtree quota and usage from the children."""
    cohort.subtree_quota = {fr: q.nominal for fr, q in cohort.quotas.items()}
    cohort.usage = {}
    children: list[Node] = [*cohort.child_cohorts, *cohort.child_cqs]
    for child in cohort.child_cohorts:
        _accumulate(child)
    for child in children:
        for fr, q in child.subtree_quota.items():
            cohort.subtree_quota[fr] = cohort.subtree_quota.get(fr, 0) + q - child.local_quota(fr)
        for fr, u in child.usage.items():
            delta = max(0, u - child.local_quota(fr))
            cohort.usage[fr] = cohort.usage.get(fr, 0) + delta


# -- dominant resource share (fair_sharing.go) ------------------------------------------


@dataclass(frozen=True)
class DRS:
    """DominantResourceShare: the most a node borrows of any resource, per 1000 of what
    the cohort tree could lend, divided by the node's fair-sharing weight."""

    fair_weight: float = 1.0
    unweighted_ratio: float = 0.0
    dominant_resource: str = ""
    borrowing: bool = False
    borrowed: tuple[FlavorResource, ...] = ()

    def is_zero(self) -> bool:
        return self.unweighted_ratio == 0

    def weighted_share(self) -> float:
        if self.is_zero():
            return 0.0
        if self.fair_weight == 0:
            return math.inf
        return self.unweighted_ratio / self.fair_weight

    def rounded(self) -> int:
        """What ClusterQueue status.fairSharing.weightedShare reports."""
        if self.fair_weight == 0 and not self.is_zero():
            return 2**63 - 1
        return math.ceil(self.weighted_share())

    def borrowing_on(self, requests: Mapping[FlavorResource, int]) -> bool:
        return any(requests.get(fr, 0) > 0 for fr in self.borrowed)


NEGATIVE_DRS = DRS(unweighted_ratio=-1)


def compare_drs(a: DRS, b: DRS) -> int:
    a_zw = a.fair_weight == 0 and not a.is_zero()
    b_zw = b.fair_weight == 0 and not b.is_zero()
    if a_zw and b_zw:
        x, y = a.unweighted_ratio, b.unweighted_ratio
    elif a_zw:
        return 1
    elif b_zw:
        return -1
    else:
        x, y = a.weighted_share(), b.weighted_share()
    return (x > y) - (x < y)


def dominant_resource_share(node: Node, extra: Mapping[FlavorResource, int] | None = None) -> DRS:
    if node.parent is None:
        return DRS(fair_weight=node.fair_weight)
    extra = extra or {}
    borrowed: dict[str, int] = {}
    frs: list[FlavorResource] = []
    for fr, quota in node.subtree_quota.items():
        amount = extra.get(fr, 0) + node.usage.get(fr, 0) - quota
        if amount > 0:
            borrowed[fr.resource] = borrowed.get(fr.resource, 0) + amount
            frs.append(fr)
    if not borrowed:
        return DRS(fair_weight=node.fair_weight)
    root = node.root()
    lendable: dict[str, int] = {}
    for fr in root.subtree_quota:
        lendable[fr.resource] = lendable.get(fr.resource, 0) + potential_available(node.parent, fr)
    ratio, dominant = 0.0, ""
    for name, amount in borrowed.items():
        lend = lendable.get(name, 0)
        if lend > 0:
            r = amount * 1000.0 / lend
            if r > ratio or (r == ratio and name < dominant):
                ratio, dominant = r, name
    return DRS(node.fair_weight, ratio, dominant, True, tuple(frs))


# -- snapshot (snapshot.go) ---------------------------------------------------------------


@dataclass
class Snapshot:
    cluster_queues: dict[str, CQNode]
    cohorts: dict[str, CohortNode]
    flavors: Mapping[str, Flavor]
    # ClusterQueue -> (reason, message) of why it cannot admit (InactiveClusterQueueSets).
    inactive: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def add_workload(self, wl: WorkloadInfo) -> None:
        cq = self.cluster_queues[wl.cluster_queue or ""]
        cq.workloads[wl.key] = wl
        cq.add_usage(wl.usage())

    def remove_workload(self, wl: WorkloadInfo) -> None:
        cq = self.cluster_queues[wl.cluster_queue or ""]
        cq.workloads.pop(wl.key, None)
        cq.remove_usage(wl.usage())

    def remove_usage_of(self, workloads: list[WorkloadInfo]) -> None:
        for wl in workloads:
            self.cluster_queues[wl.cluster_queue or ""].remove_usage(wl.usage())

    def add_usage_of(self, workloads: list[WorkloadInfo]) -> None:
        for wl in workloads:
            self.cluster_queues[wl.cluster_queue or ""].add_usage(wl.usage())


def _copy_tree(
    cqs: Mapping[str, CQNode], cohorts: Mapping[str, CohortNode]
) -> tuple[dict[str, CQNode], dict[str, CohortNode]]:
    new_cohorts = {
        name: CohortNode(c.name, c.quotas, c.fair_weight, c.subtree_quota, dict(c.usage))
        for name, c in cohorts.items()
    }
    for name, c in cohorts.items():
        if c.parent is not None:
            new_cohorts[name].parent = new_cohorts[c.parent.name]
    new_cqs: dict[str, CQNode] = {}
    for name, q in cqs.items():
        parent = new_cohorts[q.parent.name] if q.parent is not None else None
        new_cqs[name] = CQNode(
            q.name,
            q.quotas,
            q.fair_weight,
            q.subtree_quota,
            dict(q.usage),
            parent,
            spec=q.spec,
            workloads=dict(q.workloads),
            generation=q.generation,
        )
    for name, c in cohorts.items():
        new_cohorts[name].child_cqs = [new_cqs[x.name] for x in c.child_cqs]
        new_cohorts[name].child_cohorts = [new_cohorts[x.name] for x in c.child_cohorts]
    return new_cqs, new_cohorts


# -- the cache ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionCheckInfo:
    controller: str
    active: bool


@dataclass
class Cache:
    """The truth the scheduler decides from (pkg/cache/scheduler.Cache)."""

    flavors: dict[str, Flavor] = field(default_factory=dict)
    cluster_queues: dict[str, ClusterQueue] = field(default_factory=dict)
    cohorts: dict[str, Cohort] = field(default_factory=dict)
    admission_checks: dict[str, AdmissionCheckInfo] = field(default_factory=dict)
    # Workloads holding quota (assumed or admitted), by namespace/name.
    workloads: dict[str, WorkloadInfo] = field(default_factory=dict)
    # podsReadyTracking (waitForPodsReady with blockAdmission): Workloads holding quota
    # whose PodsReady condition is not true yet, assumed ones included.
    pods_ready_tracking: bool = False
    not_ready: set[str] = field(default_factory=set)
    _cqs: dict[str, CQNode] = field(default_factory=dict)
    _cohorts: dict[str, CohortNode] = field(default_factory=dict)
    _cycles: set[str] = field(default_factory=set)
    _dirty: bool = True
    _generation: int = 0

    # -- objects ------------------------------------------------------------------------

    def add_or_update_flavor(self, flavor: Flavor) -> None:
        self.flavors[flavor.name] = flavor
        self._dirty = True

    def delete_flavor(self, name: str) -> None:
        self.flavors.pop(name, None)
        self._dirty = True

    def add_or_update_cluster_queue(self, cq: ClusterQueue) -> None:
        self.cluster_queues[cq.name] = cq
        self._dirty = True

    def delete_cluster_queue(self, name: str) -> None:
        self.cluster_queues.pop(name, None)
        self._dirty = True

    def add_or_update_cohort(self, cohort: Cohort) -> None:
        self.cohorts[cohort.name] = cohort
        self._dirty = True

    def delete_cohort(self, name: str) -> None:
        self.cohorts.pop(name, None)
        self._dirty = True

    def add_or_update_admission_check(self, name: str, info: AdmissionCheckInfo) -> None:
        self.admission_checks[name] = info
        self._dirty = True

    def delete_admission_check(self, name: str) -> None:
        self.admission_checks.pop(name, None)
        self._dirty = True

    def add_or_update_workload(self, wl: WorkloadInfo) -> bool:
        """Account for a Workload holding quota; False if its ClusterQueue is unknown."""
        if wl.admission is None or wl.cluster_queue is None:
            raise ValueError(f"workload {wl.key} has no admission")
        self.delete_workload(wl.key)
        node = self._tree()[0].get(wl.cluster_queue)
        self.workloads[wl.key] = wl
        if node is None:
            return False
        node.workloads[wl.key] = wl
        node.add_usage(wl.usage())
        if self.pods_ready_tracking and not condition_true(wl.obj, api.PODS_READY):
            self.not_ready.add(wl.key)
        return True

    def delete_workload(self, key: str) -> WorkloadInfo | None:
        """Release the quota of a Workload; returns it if it was accounted."""
        wl = self.workloads.pop(key, None)
        self.not_ready.discard(key)
        if wl is None:
            return None
        node = self._tree()[0].get(wl.cluster_queue or "")
        if node is not None and node.workloads.pop(key, None) is not None:
            node.remove_usage(wl.usage())
            # only a release can make more fit (clusterqueue.go deleteWorkload)
            node.generation += 1
        return wl

    def is_added(self, key: str) -> bool:
        return key in self.workloads

    def workloads_in(self, cq_name: str) -> list[WorkloadInfo]:
        node = self._tree()[0].get(cq_name)
        return list(node.workloads.values()) if node is not None else []

    # -- the tree -------------------------------------------------------------------------

    def _tree(self) -> tuple[dict[str, CQNode], dict[str, CohortNode]]:
        if self._dirty:
            self._rebuild()
        return self._cqs, self._cohorts

    def _rebuild(self) -> None:
        """Build the tree from the specs (updateCohortTreeResources), then put back the
        usage of every Workload holding quota."""
        self._cycles = set()
        for spec in self.cohorts.values():
            seen, walk = {spec.name}, spec.parent
            while walk:
                if walk in seen:
                    self._cycles.add(spec.name)
                    break
                seen.add(walk)
                walk = (self.cohorts.get(walk) or Cohort(name=walk)).parent
        cohorts: dict[str, CohortNode] = {}

        def cohort_node(name: str) -> CohortNode:
            if name not in cohorts:
                spec = self.cohorts.get(name) or Cohort(name=name)
                cohorts[name] = CohortNode(name, spec.quotas, spec.fair_weight)
            return cohorts[name]

        for spec in list(self.cohorts.values()):
            child = cohort_node(spec.name)
            # a cohort in a cycle has no root: its ClusterQueues are inactive
            if spec.parent and spec.name not in self._cycles:
                parent = cohort_node(spec.parent)
                child.parent = parent
                parent.child_cohorts.append(child)
        self._generation += 1
        cqs: dict[str, CQNode] = {}
        for spec in self.cluster_queues.values():
            node = CQNode(spec.name, spec.quotas, spec.fair_weight, spec=spec)
            node.subtree_quota = {fr: q.nominal for fr, q in spec.quotas.items()}
            node.generation = self._generation
            if spec.cohort:
                parent = cohort_node(spec.cohort)
                node.parent = parent
                parent.child_cqs.append(node)
            cqs[spec.name] = node
        for wl in self.workloads.values():
            node = cqs.get(wl.cluster_queue or "")
            if node is not None:
                node.workloads[wl.key] = wl
                for fr, v in wl.usage().items():
                    node.usage[fr] = node.usage.get(fr, 0) + v
        for node in cohorts.values():
            if node.parent is None:
                _accumulate(node)
        self._cqs, self._cohorts, self._dirty = cqs, cohorts, False

    def cq_node(self, name: str) -> CQNode | None:
        return self._tree()[0].get(name)

    def cohort_node(self, name: str) -> CohortNode | None:
        return self._tree()[1].get(name)

    def snapshot(self) -> Snapshot:
        cqs, cohorts = self._tree()
        new_cqs, new_cohorts = _copy_tree(cqs, cohorts)
        inactive = {}
        for name, spec in self.cluster_queues.items():
            active, reason, message = self.active_condition(spec)
            if not active:
                inactive[name] = (reason, message)
        return Snapshot(new_cqs, new_cohorts, dict(self.flavors), inactive)

    # -- activity (clusterqueue.go inactiveReason) ----------------------------------------

    def active_condition(self, cq: ClusterQueue) -> tuple[bool, str, str]:
        """(active, reason, message) of the ClusterQueue's Active condition."""
        self._tree()
        reasons: list[tuple[str, str]] = []
        if cq.stop_policy not in (api.STOP_NONE, ""):
            reasons.append(("Stopped", "is stopped"))
        missing = [name for name in cq.flavor_names() if name not in self.flavors]
        if missing:
            reasons.append(
                (
                    api.CQ_REASON_FLAVOR_NOT_FOUND,
                    f"references missing ResourceFlavor(s): {','.join(missing)}",
                )
            )
        missing_checks = [c for c in cq.admission_checks if c not in self.admission_checks]
        if missing_checks:
            reasons.append(
                (
                    "AdmissionCheckNotFound",
                    f"references missing AdmissionCheck(s): {','.join(missing_checks)}",
                )
            )
        inactive_checks = [
            c
            for c in cq.admission_checks
            if c in self.admission_checks and not self.admission_checks[c].active
        ]
        if inactive_checks:
            reasons.append(
                (
                    "AdmissionCheckInactive",
                    f"references inactive AdmissionCheck(s): {','.join(inactive_checks)}",
                )
            )
        if cq.cohort and cq.cohort in self._cycles:
            reasons.append(("CohortHasCycle", f"cohort {cq.cohort} is part of a cycle"))
        if not reasons:
            return True, api.CQ_REASON_READY, "Can admit new workloads"
        text = ", ".join(m for _r, m in reasons)
        return False, reasons[0][0], f"Can't admit new workloads: {text}."

    def is_active(self, cq_name: str) -> bool:
        cq = self.cluster_queues.get(cq_name)
        return cq is not None and self.active_condition(cq)[0]

    def pods_ready_for_all_admitted(self) -> bool:
        return not self.not_ready

    # -- status -------------------------------------------------------------------------------

    def flavors_usage(self, cq: ClusterQueue) -> list[dict[str, object]]:
        """status.flavorsUsage / flavorsReservation: total and borrowed per flavor."""
        node = self.cq_node(cq.name)
        out: list[dict[str, object]] = []
        for group in cq.resource_groups:
            for flavor in group.flavors:
                resources = []
                for resource in group.covered_resources:
                    fr = FlavorResource(flavor, resource)
                    total = node.usage.get(fr, 0) if node else 0
                    borrowed = max(0, total - cq.quotas.get(fr, _NO_QUOTA).nominal)
                    resources.append(
                        {
                            "name": resource,
                            "total": format_value(resource, total),
                            "borrowed": format_value(resource, borrowed),
                        }
                    )
                out.append({"name": flavor, "resources": resources})
        return out

    def weighted_share(self, name: str) -> int | None:
        node = self.cq_node(name) or self.cohort_node(name)
        if node is None:
            return None
        return dominant_resource_share(node).rounded()
