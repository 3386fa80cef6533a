"""Flavor assignment: for every pod set and resource group, the first flavor (in the
ClusterQueue's order) the Workload fits in, borrows in or could preempt in. Pure.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/scheduler/flavorassigner/flavorassigner.go:
``assignFlavors`` → ``findFlavorForPodSets`` (per resource group, from the flavor after
the one the last cycle stopped at) → ``checkFlavorForPodSets`` (taints, nodeSelector and
required node affinity on the flavor's own label keys) → ``fitsResourceQuota``, which
asks the preemption oracle (``SimulatePreemption``) whether a flavor that does not fit
has preemption candidates at all, so a flavor with "no candidates" ranks below one
where preemption is possible (``isPreferred``), and ``shouldTryNextFlavor`` (flavor
fungibility, ``preference``). The borrowing level comes from
classical.FindHeightOfLowestSubtreeThatFits. A ClusterQueue that covers ``pods``
counts each pod set's pods against it. Every flavor tried is recorded as an attempt
(flavor_assigner_attempts.go); when nothing fits, ``resolveNoFitReason`` turns the
attempts into the granular QuotaReserved reason: within a resource group the least
severe reason of its flavors (another flavor may still do), across groups the most
severe, ``NoMatchingFlavor`` when no flavor was tried at all. Messages use upstream's
wording.

Lab difference: a pod set's resources are tried in the order its containers list them
(upstream: Go map order), so the message and reason of a Workload are stable.

Not here: topology-aware scheduling, partial admission (the webhooks reject
``minCount``), the concurrent-admission variants.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpulab.kueue import api
from gpulab.kueue.api import FlavorResource, format_value
from gpulab.kueue.cache import CQNode
from gpulab.kueue.model import ClusterQueue, Flavor, LastAssignment, PodSetSpec, WorkloadInfo


class Mode(enum.IntEnum):
    """FlavorAssignmentMode."""

    NO_FIT = 0
    PREEMPT = 1
    FIT = 3


class PMode(enum.IntEnum):
    """preemptionMode: how a flavor would be had, worst first."""

    NO_FIT = 0
    NO_CANDIDATES = 1
    PREEMPT = 2
    RECLAIM = 3
    FIT = 4

    def assignment_mode(self) -> Mode:
        if self == PMode.NO_FIT:
            return Mode.NO_FIT
        return Mode.FIT if self == PMode.FIT else Mode.PREEMPT


class Possibility(enum.IntEnum):
    """preemptioncommon.PreemptionPossibility, what SimulatePreemption answers."""

    NO_CANDIDATES = 0
    PREEMPT = 1
    RECLAIM = 2


_FROM_POSSIBILITY = {
    Possibility.NO_CANDIDATES: PMode.NO_CANDIDATES,
    Possibility.PREEMPT: PMode.PREEMPT,
    Possibility.RECLAIM: PMode.RECLAIM,
}


class Oracle(Protocol):
    def simulate_preemption(
        self, cq: CQNode, wl: WorkloadInfo, fr: FlavorResource, quantity: int
    ) -> tuple[Possibility, int]: ...


@dataclass(frozen=True)
class Granular:
    pmode: PMode
    borrow: int

    @property
    def preempts(self) -> bool:
        return self.pmode in (PMode.PREEMPT, PMode.RECLAIM)


WORST = Granular(PMode.NO_FIT, 2**31)
BEST = Granular(PMode.FIT, 0)


def is_preferred(a: Granular, b: Granular, preference: str | None) -> bool:
    """isPreferred: never noFit, never "no candidates" over a real option, then by
    preemption mode and borrowing level in the order the ``preference`` asks."""
    if a.pmode == PMode.NO_FIT:
        return False
    if b.pmode == PMode.NO_FIT:
        return True
    a_none, b_none = a.pmode == PMode.NO_CANDIDATES, b.pmode == PMode.NO_CANDIDATES
    if a_none != b_none:
        return not a_none
    if preference == api.PREEMPTION_OVER_BORROWING:
        if a.borrow != b.borrow:
            return a.borrow < b.borrow
        return a.pmode > b.pmode
    if a.pmode != b.pmode:
        return a.pmode > b.pmode
    return a.borrow < b.borrow


def should_try_next_flavor(mode: Granular, when_can_borrow: str, when_can_preempt: str) -> bool:
    if mode.pmode in (PMode.NO_FIT, PMode.NO_CANDIDATES):
        return True
    if mode.preempts and when_can_preempt == api.TRY_NEXT_FLAVOR:
        return True
    return mode.borrow != 0 and when_can_borrow == api.TRY_NEXT_FLAVOR


@dataclass
class FlavorAssignment:
    name: str
    mode: Mode
    borrow: int = 0
    tried_idx: int = 0


@dataclass(frozen=True)
class FlavorAttempt:
    """FlavorAssignmentAttempt: how one flavor did for a pod set (its worst resource)."""

    flavor: str
    mode: Mode
    no_fit_reason: str = ""


@dataclass
class PodSetAssignment:
    name: str
    count: int
    requests: dict[str, int]
    flavors: dict[str, FlavorAssignment] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    attempts: dict[str, FlavorAttempt] = field(default_factory=dict)  # by flavor

    def mode(self) -> Mode:
        if not self.reasons:
            return Mode.FIT
        if not self.flavors:
            return Mode.NO_FIT
        return min(f.mode for f in self.flavors.values())

    def message(self) -> str:
        return ", ".join(sorted(self.reasons))


@dataclass
class Assignment:
    pod_sets: list[PodSetAssignment] = field(default_factory=list)
    borrowing: int = 0
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    last_state: LastAssignment | None = None
    no_fit_reason: str = ""

    def mode(self) -> Mode:
        """RepresentativeMode: the worst pod set's."""
        if not self.pod_sets:
            return Mode.NO_FIT
        return min(ps.mode() for ps in self.pod_sets)

    def borrows(self) -> bool:
        return self.borrowing > 0

    def message(self) -> str:
        return "; ".join(
            f"couldn't assign flavors to pod set {ps.name}: {ps.message()}"
            for ps in self.pod_sets
            if ps.reasons
        )

    def need_preemption(self) -> set[FlavorResource]:
        """flavorResourcesNeedPreemption."""
        return {
            FlavorResource(fa.name, res)
            for ps in self.pod_sets
            for res, fa in ps.flavors.items()
            if fa.mode == Mode.PREEMPT
        }

    def to_admission(self, cq_name: str) -> dict[str, Any]:
        """status.admission for this assignment (Assignment.ToAPI)."""
        return {
            "clusterQueue": cq_name,
            "podSetAssignments": [
                {
                    "name": ps.name,
                    "flavors": {r: fa.name for r, fa in sorted(ps.flavors.items())},
                    "resourceUsage": {
                        r: format_value(r, ps.requests[r]) for r in sorted(ps.flavors)
                    },
                    "count": ps.count,
                }
                for ps in self.pod_sets
            ],
        }


# -- node matching (checkFlavorForPodSets) ------------------------------------------------


def _tolerates(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        op = tol.get("operator") or "Equal"
        if not tol.get("key") and op == "Exists":
            return True
        if tol.get("key") != taint.get("key"):
            continue
        if op == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def flavor_mismatch(flavor: Flavor, ps: PodSetSpec) -> str | None:
    """Why the flavor cannot serve the pod set, or None. Only the selector keys the
    flavor defines count (flavorSelector)."""
    for taint in flavor.node_taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not _tolerates(taint, [*ps.tolerations, *flavor.tolerations]):
            # printed as Go prints the corev1.Taint struct
            desc = f"{taint.get('key')} {taint.get('value', '')} {taint.get('effect')} <nil>"
            return f"untolerated taint {{{desc}}} in flavor {flavor.name}"
    labels = flavor.node_labels
    for key, value in ps.node_selector.items():
        if key in labels and labels[key] != value:
            return f"flavor {flavor.name} doesn't match node affinity"
    terms: list[list[Mapping[str, Any]]] = []
    for term in ps.required_affinity:
        kept = [e for e in term if e.get("key") in labels]
        if not kept:  # a term with none of the flavor's keys matches any flavor
            terms = []
            break
        terms.append(kept)
    if terms and not any(all(_expression_matches(e, labels) for e in t) for t in terms):
        return f"flavor {flavor.name} doesn't match node affinity"
    return None


# -- quota (fitsResourceQuota) --------------------------------------------------------------


def find_height_of_lowest_subtree_that_fits(
    cq: CQNode, fr: FlavorResource, val: int
) -> tuple[int, bool]:
    """The borrowing level: 0 within nominal quota, else the height of the lowest
    cohort in which the request fits; and whether a reclaim higher up is possible."""
    if not cq.borrowing_with(fr, val) or cq.parent is None:
        return 0, cq.parent is not None
    remaining = val - cq.local_available(fr)
    top = cq.parent
    for node in cq.path_to_root():
        if not node.borrowing_with(fr, remaining):
            return node.height(), node.parent is not None
        remaining -= node.local_available(fr)
        top = node
    return top.height(), False


@dataclass
class _Status:
    reasons: list[str] = field(default_factory=list)
    no_fit_reason: str = api.REASON_WAITING_FOR_QUOTA


def fits_resource_quota(
    cq: CQNode,
    wl: WorkloadInfo,
    fr: FlavorResource,
    assumed: int,
    request: int,
    oracle: Oracle,
    fair_sharing: bool,
) -> tuple[PMode, int, _Status | None]:
    available = cq.available(fr)
    max_capacity = cq.potential_available(fr)
    val = assumed + request
    status = _Status()
    if val > max_capacity:
        status.reasons.append(
            f"insufficient quota for {fr.resource} in flavor {fr.flavor}, previously "
            f"considered podsets requests ({format_value(fr.resource, assumed)}) + current "
            f"podset request ({format_value(fr.resource, request)}) > maximum capacity "
            f"({format_value(fr.resource, max_capacity)})"
        )
        status.no_fit_reason = api.REASON_EXCEEDS_MAX_QUOTA
        return PMode.NO_FIT, 0, status
    borrow, may_reclaim_in_hierarchy = find_height_of_lowest_subtree_that_fits(cq, fr, val)
    if val <= available:
        return PMode.FIT, borrow, None
    status.reasons.append(
        f"insufficient unused quota for {fr.resource} in flavor {fr.flavor}, "
        f"{format_value(fr.resource, val - available)} more needed"
    )
    pre = cq.spec.preemption
    can_preempt_while_borrowing = pre.borrow_within_cohort != api.NEVER or (
        fair_sharing and pre.reclaim_within_cohort != api.NEVER
    )
    if cq.quota(fr).nominal >= val or may_reclaim_in_hierarchy or can_preempt_while_borrowing:
        possibility, borrow_after = oracle.simulate_preemption(cq, wl, fr, val)
        mode = _FROM_POSSIBILITY[possibility]
        status.no_fit_reason = ""
        return mode, borrow_after, status
    return PMode.NO_FIT, borrow, status


_SEVERITY = {
    api.REASON_WAITING_FOR_QUOTA: 2,  # TopologyPlacementFailed (1) needs TAS
    api.REASON_EXCEEDS_MAX_QUOTA: 3,
    api.REASON_NO_MATCHING_FLAVOR: 4,
}


def most_severe(a: str, b: str) -> str:
    """mostSevereReason."""
    return a if _SEVERITY.get(a, 0) >= _SEVERITY.get(b, 0) else b


def _merge_attempts(into: dict[str, FlavorAttempt], new: Iterable[FlavorAttempt]) -> None:
    """mergeFlavorAttempts: per flavor, the worst mode and the most severe reason."""
    for att in new:
        old = into.get(att.flavor)
        if old is not None:
            att = FlavorAttempt(
                att.flavor,
                min(old.mode, att.mode),
                most_severe(old.no_fit_reason, att.no_fit_reason),
            )
        into[att.flavor] = att


def resolve_no_fit_reason(out: Assignment, cq: ClusterQueue) -> str:
    """resolveNoFitReason: why a Workload that fits nowhere does not fit."""
    if out.mode() != Mode.NO_FIT:
        return ""
    overall = ""
    for ps in out.pod_sets:
        if ps.mode() != Mode.NO_FIT:
            continue
        if not ps.attempts:
            overall = most_severe(overall, api.REASON_NO_MATCHING_FLAVOR)
            continue
        per_group: dict[int, str] = {}
        for i, att in enumerate(sorted(ps.attempts.values(), key=lambda a: a.flavor)):
            if att.mode != Mode.NO_FIT:
                continue
            groups = [g for g, rg in enumerate(cq.resource_groups) if att.flavor in rg.flavors]
            for g in groups or [-1 - i]:  # a flavor in no group stands alone
                if g not in per_group or _SEVERITY.get(att.no_fit_reason, 0) < _SEVERITY.get(
                    per_group[g], 0
                ):
                    per_group[g] = att.no_fit_reason
        ps_reason = ""
        for reason in per_group.values():
            ps_reason = most_severe(ps_reason, reason)
        overall = most_severe(overall, ps_reason)
    return overall


# -- the assigner ----------------------------------------------------------------------------


def _find_flavor(
    wl: WorkloadInfo,
    ps_index: int,
    ps: PodSetSpec,
    cq: CQNode,
    flavors: Mapping[str, Flavor],
    requests: Mapping[str, int],
    resource: str,
    usage: Mapping[FlavorResource, int],
    oracle: Oracle,
    fair_sharing: bool,
) -> tuple[dict[str, FlavorAssignment], _Status, list[FlavorAttempt]]:
    """findFlavorForPodSets for the resource group covering ``resource``."""
    group = cq.spec.group_for(resource)
    status = _Status()
    if group is None:
        status.reasons.append(f"resource {resource} unavailable in ClusterQueue")
        return {}, status, []
    wanted = {r: v for r, v in requests.items() if r in group.covered_resources}
    fung = cq.spec.fungibility
    best: dict[str, FlavorAssignment] = {}
    best_mode = WORST
    attempted = -1
    attempts: list[FlavorAttempt] = []
    start = wl.last_assignment.next_flavor(ps_index, resource) if wl.last_assignment else 0
    for idx in range(start, len(group.flavors)):
        attempted = idx
        name = group.flavors[idx]
        flavor = flavors.get(name)
        mismatch = f"flavor {name} not found" if flavor is None else flavor_mismatch(flavor, ps)
        if mismatch:
            status.reasons.append(mismatch)
            attempts.append(FlavorAttempt(name, Mode.NO_FIT, api.REASON_NO_MATCHING_FLAVOR))
            continue
        assignments: dict[str, FlavorAssignment] = {}
        mode = BEST
        flavor_no_fit = ""
        for res, val in wanted.items():
            fr = FlavorResource(name, res)
            pmode, borrow, s = fits_resource_quota(
                cq, wl, fr, usage.get(fr, 0), val, oracle, fair_sharing
            )
            if s is not None:
                status.reasons += s.reasons
                flavor_no_fit = most_severe(flavor_no_fit, s.no_fit_reason)
            here = Granular(pmode, borrow)
            if is_preferred(mode, here, fung.preference):
                mode = here
            if mode.pmode == PMode.NO_FIT:
                continue  # the flavor is out, its other resources are still reported
            assignments[res] = FlavorAssignment(name, pmode.assignment_mode(), borrow)
        attempts.append(FlavorAttempt(name, mode.pmode.assignment_mode(), flavor_no_fit))
        if not should_try_next_flavor(mode, fung.when_can_borrow, fung.when_can_preempt):
            best, best_mode = assignments, mode
            break
        if is_preferred(mode, best_mode, fung.preference):
            best, best_mode = assignments, mode
    tried = -1 if attempted == len(group.flavors) - 1 else attempted
    for fa in best.values():
        fa.tried_idx = tried
    if best_mode.pmode == PMode.FIT:
        return best, _Status(no_fit_reason=""), attempts
    return best, status, attempts


def assign_flavors(
    wl: WorkloadInfo,
    cq: CQNode,
    flavors: Mapping[str, Flavor],
    oracle: Oracle,
    fair_sharing: bool = False,
    cycle: int = 0,
) -> Assignment:
    """FlavorAssigner.Assign for the Workload's full counts."""
    out = Assignment(last_state=LastAssignment([], cq.generation, cycle))
    specs: Sequence[PodSetSpec] = wl.pod_sets
    for i, psr in enumerate(wl.total_requests):
        spec = specs[i] if i < len(specs) else PodSetSpec(psr.name, psr.count)
        requests = dict(psr.requests)
        if cq.spec.group_for(api.PODS) is not None:
            requests[api.PODS] = psr.count
        psa = PodSetAssignment(psr.name, psr.count, requests)
        failed = False
        for resource, request in requests.items():
            if resource in psa.flavors:
                continue
            if cq.spec.group_for(resource) is None and request == 0:
                continue
            found, status, attempts = _find_flavor(
                wl, i, spec, cq, flavors, requests, resource, out.usage, oracle, fair_sharing
            )
            _merge_attempts(psa.attempts, attempts)
            if not found:
                psa.flavors, psa.reasons = {}, status.reasons or ["no flavor fits"]
                failed = True
                break
            psa.flavors.update(found)
            psa.reasons += status.reasons
        out.pod_sets.append(psa)
        out.last_state.last_tried.append({r: fa.tried_idx for r, fa in psa.flavors.items()})
        for res, fa in psa.flavors.items():
            out.borrowing = max(out.borrowing, fa.borrow)
            fr = FlavorResource(fa.name, res)
            out.usage[fr] = out.usage.get(fr, 0) + requests.get(res, 0)
        if failed:
            break
    out.no_fit_reason = resolve_no_fit_reason(out, cq.spec)
    return out
