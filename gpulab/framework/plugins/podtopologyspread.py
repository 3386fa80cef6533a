"""PodTopologySpread: spread a pod's kind evenly over nodes and zones.

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins/podtopologyspread/``
(``plugin.go``, ``common.go``, ``filtering.go``, ``scoring.go``) and ``helper/spread.go``
(``DefaultSelector``):

- constraints: the pod's ``topologySpreadConstraints`` (``matchLabelKeys`` merged into
  the selector; ``nodeAffinityPolicy`` Honor and ``nodeTaintsPolicy`` Ignore by default;
  ``minDomains`` 1) - or, for a pod without any, the *system default* constraints
  (``PodTopologySpreadArgs.defaultingType: System``): ``kubernetes.io/hostname`` maxSkew
  3 and ``topology.kubernetes.io/zone`` maxSkew 5, both ``ScheduleAnyway``, whose
  selector is built from the Services, ReplicationControllers, ReplicaSets and
  StatefulSets that select the pod. A pod nothing selects has no default constraints.
- ``PreFilter`` / ``Filter`` (``DoNotSchedule`` constraints): count the matching pods
  per topology value over the nodes that carry every topology key and pass the
  inclusion policies; a node fails when ``count + self - global minimum > maxSkew``
  ("node(s) didn't match pod topology spread constraints"), or lacks a key ("... (missing
  required label)"); fewer domains than ``minDomains`` make the global minimum 0.
- ``PreScore`` / ``Score`` / ``NormalizeScore`` (``ScheduleAnyway`` constraints): each
  node scores ``count * log(domains + 2) + maxSkew - 1`` per constraint (hostname counts
  on the node itself), rounded; normalised so the fewest matching pods scores 100. With
  system defaults a node without the zone label is still scored by hostname.
- ``EventsToRegister``: Pod Add|UpdatePodLabel|UpdatePodToleration|Delete
  (``isSchedulableAfterPodChange``: a scheduled pod in the same namespace that matches, or
  stopped matching, a constraint) and Node Add|Delete|UpdateNodeLabel|UpdateNodeTaint
  (``isSchedulableAfterNodeChange``: a node with every topology key, or whose topology
  labels or taints changed).

Lab difference: nodes are processed one after another (upstream: in parallel).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.framework.events import (
    NODE,
    POD,
    ActionType,
    ClusterEvent,
    ClusterEventWithHint,
    QueueingHint,
)
from gpulab.framework.interface import (
    MAX_NODE_SCORE,
    SUCCESS,
    Code,
    CycleState,
    NodeScore,
    PreFilterResult,
    Status,
    unresolvable,
    unschedulable,
)
from gpulab.framework.predicates import (
    node_affinity_matches,
    requirement_matches,
    untolerated_taint,
)
from gpulab.framework.snapshot import NodeInfo, node_name_of, pod_uid
from gpulab.informer import SERVICES, Resource, Store

NAME = "PodTopologySpread"
ERR_REASON_CONSTRAINTS_NOT_MATCH = "node(s) didn't match pod topology spread constraints"
ERR_REASON_NODE_LABEL_NOT_MATCH = ERR_REASON_CONSTRAINTS_NOT_MATCH + " (missing required label)"
PRE_FILTER_KEY = "PreFilter" + NAME
PRE_SCORE_KEY = "PreScore" + NAME
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
DO_NOT_SCHEDULE, SCHEDULE_ANYWAY = "DoNotSchedule", "ScheduleAnyway"
HONOR, IGNORE = "Honor", "Ignore"
SYSTEM_DEFAULTING, LIST_DEFAULTING = "System", "List"

SYSTEM_DEFAULT_CONSTRAINTS = (
    {"topologyKey": HOSTNAME, "whenUnsatisfiable": SCHEDULE_ANYWAY, "maxSkew": 3},
    {"topologyKey": ZONE, "whenUnsatisfiable": SCHEDULE_ANYWAY, "maxSkew": 5},
)
REPLICATION_CONTROLLERS = Resource("", "v1", "replicationcontrollers", "ReplicationController")
REPLICA_SETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
STATEFUL_SETS = Resource("apps", "v1", "statefulsets", "StatefulSet")

Obj = Mapping[str, Any]


# -- label selectors (k8s.io/apimachinery labels.Selector) ----------------------------------


@dataclass(frozen=True)
class Selector:
    """Requirements that all must hold; ``nothing`` matches no pod (a nil LabelSelector)."""

    requirements: tuple[Obj, ...] = ()
    nothing: bool = False

    def empty(self) -> bool:
        """Selector.Empty(): no requirement (an empty selector counts no pods here)."""
        return not self.nothing and not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return not self.nothing and all(requirement_matches(labels, r) for r in self.requirements)

    def add(self, requirements: Iterable[Obj]) -> Selector:
        return Selector((*self.requirements, *requirements), self.nothing)


def selector_from_set(labels: Mapping[str, str]) -> Selector:
    return Selector(tuple({"key": k, "operator": "In", "values": [v]} for k, v in labels.items()))


def label_selector_as_selector(selector: Obj | None) -> Selector:
    """metav1.LabelSelectorAsSelector: nil selects nothing, {} everything."""
    if selector is None:
        return Selector(nothing=True)
    matched = selector_from_set(selector.get("matchLabels") or {})
    return matched.add(selector.get("matchExpressions") or [])


# -- constraints (common.go) ----------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    max_skew: int
    topology_key: str
    selector: Selector
    min_domains: int = 1
    node_affinity_policy: str = HONOR
    node_taints_policy: str = IGNORE

    def matches_node_inclusion_policies(self, pod: Obj, node: Obj) -> bool:
        if self.node_affinity_policy == HONOR and not node_affinity_matches(pod, node):
            return False
        return not (self.node_taints_policy == HONOR and untolerated_taint(pod, node) is not None)


def _labels(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def filter_constraints(
    constraints: Iterable[Obj], pod_labels: Mapping[str, str], action: str
) -> list[Constraint]:
    """filterTopologySpreadConstraints: the constraints with this ``whenUnsatisfiable``,
    ``matchLabelKeys`` merged into their selectors."""
    out = []
    for c in constraints:
        if c.get("whenUnsatisfiable") != action:
            continue
        selector = label_selector_as_selector(c.get("labelSelector"))
        match = {k: pod_labels[k] for k in c.get("matchLabelKeys") or [] if k in pod_labels}
        if match and not selector.nothing:
            selector = selector_from_set(match).add(selector.requirements)
        out.append(
            Constraint(
                int(c.get("maxSkew") or 0),
                str(c.get("topologyKey") or ""),
                selector,
                int(c.get("minDomains") or 1),
                c.get("nodeAffinityPolicy") or HONOR,
                c.get("nodeTaintsPolicy") or IGNORE,
            )
        )
    return out


def node_labels_match_spread_constraints(node: Obj, constraints: Iterable[Constraint]) -> bool:
    labels = _labels(node)
    return all(c.topology_key in labels for c in constraints)


def count_pods_match_selector(info: NodeInfo, selector: Selector, namespace: str) -> int:
    """countPodsMatchSelector: pods of the namespace the selector matches, leaving out
    terminating ones; an empty selector counts none."""
    if selector.empty():
        return 0
    count = 0
    for p in info.pods:
        meta = p.pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or meta.get("namespace") != namespace:
            continue
        if selector.matches(meta.get("labels") or {}):
            count += 1
    return count


# -- filtering.go ---------------------------------------------------------------------------


@dataclass
class PreFilterState:
    constraints: list[Constraint]
    tp_value_to_match_num: list[dict[str, int]] = field(default_factory=list)

    def min_match_num(self, i: int) -> int:
        """The global minimum over the domains, 0 with fewer than ``minDomains``."""
        counts = self.tp_value_to_match_num[i]
        if len(counts) < self.constraints[i].min_domains:
            return 0
        return min(counts.values(), default=0)


@dataclass
class PreScoreState:
    constraints: list[Constraint]
    ignored_nodes: set[str] = field(default_factory=set)
    topology_value_to_pod_counts: list[dict[str, int]] = field(default_factory=list)
    topology_normalizing_weight: list[float] = field(default_factory=list)


def topology_normalizing_weight(size: int) -> float:
    return math.log(size + 2)


def score_for_count(count: int, max_skew: int, weight: float) -> float:
    return count * weight + (max_skew - 1)


class PodTopologySpread:
    name = NAME

    def __init__(self, args: Mapping[str, Any], handle: Any) -> None:
        self.defaulting_type = args.get("defaultingType") or SYSTEM_DEFAULTING
        self.system_defaulted = self.defaulting_type == SYSTEM_DEFAULTING
        self.default_constraints: list[Obj] = list(args.get("defaultConstraints") or [])
        if self.system_defaulted:
            self.default_constraints = list(SYSTEM_DEFAULT_CONSTRAINTS)
        self.handle = handle
        self.listers: dict[Resource, Store] = {}
        if self.default_constraints:
            for resource in (SERVICES, REPLICATION_CONTROLLERS, REPLICA_SETS, STATEFUL_SETS):
                self.listers[resource] = handle.informer(resource)

    # ------------------------------------------------------------------ constraints

    def default_selector(self, pod: Obj) -> Selector:
        """helper.DefaultSelector: the selectors of the Services selecting the pod, and of
        its controlling ReplicationController, ReplicaSet or StatefulSet."""
        meta = pod.get("metadata") or {}
        ns, labels = meta.get("namespace"), _labels(pod)
        merged: dict[str, str] = {}
        for svc in self.listers[SERVICES].list():
            chosen = (svc.get("spec") or {}).get("selector")
            if (svc.get("metadata") or {}).get("namespace") != ns or chosen is None:
                continue  # services with a nil selector match nothing
            if all(labels.get(k) == v for k, v in chosen.items()):
                merged.update(chosen)
        selector = selector_from_set(merged)
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        if owner is None:
            return selector
        kinds = {
            ("v1", "ReplicationController"): REPLICATION_CONTROLLERS,
            ("apps/v1", "ReplicaSet"): REPLICA_SETS,
            ("apps/v1", "StatefulSet"): STATEFUL_SETS,
        }
        resource = kinds.get((owner.get("apiVersion"), owner.get("kind")))
        if resource is None:
            return selector
        controller = self.listers[resource].get(f"{ns}/{owner.get('name')}")
        if controller is None:
            return selector
        spec_selector = (controller.get("spec") or {}).get("selector")
        if resource is REPLICATION_CONTROLLERS:
            return selector_from_set({**merged, **(spec_selector or {})})
        return selector.add(label_selector_as_selector(spec_selector).requirements)

    def build_default_constraints(self, pod: Obj, action: str) -> list[Constraint]:
        constraints = filter_constraints(self.default_constraints, _labels(pod), action)
        if not constraints:
            return []
        selector = self.default_selector(pod)
        if selector.empty():
            return []
        return [
            Constraint(
                c.max_skew,
                c.topology_key,
                selector,
                c.min_domains,
                c.node_affinity_policy,
                c.node_taints_policy,
            )
            for c in constraints
        ]

    def constraints_of(self, pod: Obj, action: str) -> list[Constraint]:
        """The pod's own constraints with this action, else the default ones."""
        own = (pod.get("spec") or {}).get("topologySpreadConstraints") or []
        if own:
            return filter_constraints(own, _labels(pod), action)
        return self.build_default_constraints(pod, action)

    # ------------------------------------------------------------------ PreFilter / Filter

    def PreFilter(
        self, state: CycleState, pod: Obj, nodes: list[NodeInfo]
    ) -> tuple[PreFilterResult | None, Status]:
        constraints = self.constraints_of(pod, DO_NOT_SCHEDULE)
        if not constraints:
            return None, Status.of(Code.SKIP)
        s = PreFilterState(constraints, [{} for _ in constraints])
        ns = (pod.get("metadata") or {}).get("namespace") or ""
        for info in nodes:
            if not node_labels_match_spread_constraints(info.node, constraints):
                continue
            for i, c in enumerate(constraints):
                if not c.matches_node_inclusion_policies(pod, info.node):
                    continue
                value = _labels(info.node)[c.topology_key]
                counts = s.tp_value_to_match_num[i]
                counts[value] = counts.get(value, 0) + count_pods_match_selector(
                    info, c.selector, ns
                )
        state.write(PRE_FILTER_KEY, s)
        return None, SUCCESS

    def Filter(self, state: CycleState, pod: Obj, node: NodeInfo) -> Status:
        s: PreFilterState = state.read(PRE_FILTER_KEY)
        labels = _labels(node.node)
        for i, c in enumerate(s.constraints):
            value = labels.get(c.topology_key)
            if value is None:
                return unresolvable(ERR_REASON_NODE_LABEL_NOT_MATCH)
            self_match = 1 if c.selector.matches(_labels(pod)) else 0
            skew = s.tp_value_to_match_num[i].get(value, 0) + self_match - s.min_match_num(i)
            if skew > c.max_skew:
                return unschedulable(ERR_REASON_CONSTRAINTS_NOT_MATCH)
        return SUCCESS

    # ------------------------------------------------------------------ PreScore / Score

    def PreScore(self, state: CycleState, pod: Obj, nodes: list[NodeInfo]) -> Status:
        all_nodes = self.handle.snapshot().list()
        if not all_nodes:
            return Status.of(Code.SKIP)
        own = (pod.get("spec") or {}).get("topologySpreadConstraints") or []
        require_all = bool(own) or not self.system_defaulted
        s = PreScoreState(self.constraints_of(pod, SCHEDULE_ANYWAY))
        if not s.constraints:
            return Status.of(Code.SKIP)
        s.topology_value_to_pod_counts = [{} for _ in s.constraints]
        for info in nodes:
            if require_all and not node_labels_match_spread_constraints(info.node, s.constraints):
                s.ignored_nodes.add(info.name)
                continue
            for i, c in enumerate(s.constraints):
                if c.topology_key != HOSTNAME:
                    s.topology_value_to_pod_counts[i].setdefault(
                        _labels(info.node).get(c.topology_key, ""), 0
                    )
        for i, c in enumerate(s.constraints):
            size = len(s.topology_value_to_pod_counts[i])
            if c.topology_key == HOSTNAME:
                size = len(nodes) - len(s.ignored_nodes)
            s.topology_normalizing_weight.append(topology_normalizing_weight(size))
        ns = (pod.get("metadata") or {}).get("namespace") or ""
        for info in all_nodes:
            if require_all and not node_labels_match_spread_constraints(info.node, s.constraints):
                continue
            for i, c in enumerate(s.constraints):
                if not c.matches_node_inclusion_policies(pod, info.node):
                    continue
                value = _labels(info.node).get(c.topology_key, "")
                counts = s.topology_value_to_pod_counts[i]
                if value in counts:  # hostname is counted per node in Score
                    counts[value] += count_pods_match_selector(info, c.selector, ns)
        state.write(PRE_SCORE_KEY, s)
        return SUCCESS

    def Score(self, state: CycleState, pod: Obj, node: NodeInfo) -> tuple[int, Status]:
        s: PreScoreState = state.read(PRE_SCORE_KEY)
        if node.name in s.ignored_nodes:
            return 0, SUCCESS
        ns = (pod.get("metadata") or {}).get("namespace") or ""
        labels = _labels(node.node)
        score = 0.0
        for i, c in enumerate(s.constraints):
            value = labels.get(c.topology_key)
            if value is None:
                continue
            if c.topology_key == HOSTNAME:
                count = count_pods_match_selector(node, c.selector, ns)
            else:
                count = s.topology_value_to_pod_counts[i][value]
            score += score_for_count(count, c.max_skew, s.topology_normalizing_weight[i])
        return math.floor(score + 0.5), SUCCESS  # Go's math.Round: half away from zero

    def NormalizeScore(self, state: CycleState, pod: Obj, scores: list[NodeScore]) -> Status:
        """Fewest matching pods -> 100; ignored nodes -> 0."""
        s: PreScoreState = state.read(PRE_SCORE_KEY)
        counted = [x.score for x in scores if x.name not in s.ignored_nodes]
        low, high = min(counted, default=0), max(counted, default=0)
        for x in scores:
            if x.name in s.ignored_nodes:
                x.score = 0
            elif high == 0:
                x.score = MAX_NODE_SCORE
            else:
                x.score = MAX_NODE_SCORE * (high + low - x.score) // high
        return SUCCESS

    # ------------------------------------------------------------------ queueing hints

    def EventsToRegister(self) -> list[ClusterEventWithHint]:
        pod_actions = (
            ActionType.ADD
            | ActionType.UPDATE_POD_LABEL
            | ActionType.UPDATE_POD_TOLERATION
            | ActionType.DELETE
        )
        node_actions = (
            ActionType.ADD
            | ActionType.DELETE
            | ActionType.UPDATE_NODE_LABEL
            | ActionType.UPDATE_NODE_TAINT
        )
        return [
            ClusterEventWithHint(
                ClusterEvent(POD, pod_actions), self.is_schedulable_after_pod_change
            ),
            ClusterEventWithHint(
                ClusterEvent(NODE, node_actions), self.is_schedulable_after_node_change
            ),
        ]

    def is_schedulable_after_pod_change(
        self, pod: Obj, old: Obj | None, new: Obj | None
    ) -> QueueingHint:
        for changed in (new, old):
            if changed is not None and not _involved_in_spreading(changed, pod):
                return QueueingHint.QUEUE_SKIP
        constraints = self.constraints_of(pod, DO_NOT_SCHEDULE)
        if old is not None and new is not None:
            tolerations_changed = _tolerations(new) != _tolerations(old)
            if (
                pod_uid(new) == pod_uid(pod)
                and tolerations_changed
                and any(c.node_taints_policy == HONOR for c in constraints)
            ):
                return QueueingHint.QUEUE
            if _labels(new) == _labels(old):
                return QueueingHint.QUEUE_SKIP
            for c in constraints:
                if c.selector.matches(_labels(old)) != c.selector.matches(_labels(new)):
                    return QueueingHint.QUEUE
            return QueueingHint.QUEUE_SKIP
        changed = new if new is not None else old
        assert changed is not None
        if any(c.selector.matches(_labels(changed)) for c in constraints):
            return QueueingHint.QUEUE
        return QueueingHint.QUEUE_SKIP

    def is_schedulable_after_node_change(
        self, pod: Obj, old: Obj | None, new: Obj | None
    ) -> QueueingHint:
        constraints = self.constraints_of(pod, DO_NOT_SCHEDULE)
        old_matching = old is not None and node_labels_match_spread_constraints(old, constraints)
        new_matching = new is not None and node_labels_match_spread_constraints(new, constraints)
        if old is not None and new is not None:
            if old_matching != new_matching:
                return QueueingHint.QUEUE
            keys_changed = any(
                _labels(old).get(c.topology_key) != _labels(new).get(c.topology_key)
                for c in constraints
            )
            taints_changed = _taints(old) != _taints(new)
            if new_matching and (keys_changed or taints_changed):
                return QueueingHint.QUEUE
            return QueueingHint.QUEUE_SKIP
        matching = new_matching if new is not None else old_matching
        return QueueingHint.QUEUE if matching else QueueingHint.QUEUE_SKIP


def _tolerations(pod: Obj) -> list[Obj]:
    return list((pod.get("spec") or {}).get("tolerations") or [])


def _taints(node: Obj) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def _involved_in_spreading(incoming: Obj, pod_with_spreading: Obj) -> bool:
    """involvedInTopologySpreading: the pod itself, or a scheduled (or nominated) pod of
    its namespace."""
    if pod_uid(incoming) == pod_uid(pod_with_spreading):
        return True
    if not node_name_of(incoming) and not (incoming.get("status") or {}).get("nominatedNodeName"):
        return False
    ns = (incoming.get("metadata") or {}).get("namespace")
    return ns == (pod_with_spreading.get("metadata") or {}).get("namespace")


def new(args: Mapping[str, Any], handle: Any) -> PodTopologySpread:
    return PodTopologySpread(args, handle)
