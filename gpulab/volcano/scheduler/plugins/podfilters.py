"""The two in-tree filters that look at the other pods on a node: NodePorts and
InterPodAffinity, as Volcano's predicates plugin runs them (PreFilter once per task,
then Filter per node).

Mirrors kubernetes v1.36.3 ``pkg/scheduler/framework/plugins`` (volcano-sh/volcano
v1.15.1 vendors v1.35.3 of them):
- ``nodeports/node_ports.go``: the pod's host ports (containers, and init containers
  that keep running - ``restartPolicy: Always``) against the ones the node's pods hold
  (``HostPortInfo.CheckConflict``: ``0.0.0.0`` conflicts with every address, an empty
  address is ``0.0.0.0``, an empty protocol TCP); a conflict is Unschedulable "node(s)
  didn't have free ports for the requested pod ports"; a pod without host ports skips it;
- ``interpodaffinity/filtering.go``: PreFilter counts, per topology pair (label key and
  value of a node), the existing pods whose required anti-affinity terms match the pod,
  the existing pods matching all of the pod's required affinity terms, and those
  matching each of its anti-affinity terms; Filter then refuses a node whose topology
  lacks a pod the pod needs (UnschedulableAndUnresolvable "node(s) didn't match pod
  affinity rules" - unless no pod matches anywhere and the pod matches its own terms, the
  first of a group), holds one it must avoid (Unschedulable "node(s) didn't match pod
  anti-affinity rules") or holds one that must avoid it (Unschedulable "node(s) didn't
  satisfy existing pods anti-affinity rules"). A term's namespaces default to its pod's.

Pure: pods and nodes as dicts, the node's pods from the session's k8s NodeInfos.

Lab difference: vc-scheduler here watches no Namespaces, so a term's
``namespaceSelector`` is matched against the one label every namespace carries,
``kubernetes.io/metadata.name`` (an empty selector still matches every namespace).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.framework.predicates import requirement_matches

Obj = Mapping[str, Any]
Pair = tuple[str, str]  # (topology key, value)

ERR_REASON_PORTS = "node(s) didn't have free ports for the requested pod ports"
ERR_REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
ERR_REASON_AFFINITY = "node(s) didn't match pod affinity rules"
ERR_REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
BIND_ALL = "0.0.0.0"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


# -- NodePorts ------------------------------------------------------------------------------


def host_ports(pod: Obj) -> list[tuple[str, str, int]]:
    """util.GetHostPorts as (ip, protocol, port), sanitized as HostPortInfo keeps them."""
    spec = pod.get("spec") or {}
    containers = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    containers += list(spec.get("containers") or [])
    out = []
    for c in containers:
        for p in c.get("ports") or []:
            port = int(p.get("hostPort") or 0)
            if port > 0:
                out.append((p.get("hostIP") or BIND_ALL, p.get("protocol") or "TCP", port))
    return out


def ports_conflict(wanted: Iterable[tuple[str, str, int]], pods: Iterable[Obj]) -> bool:
    """fitsPorts negated: does any wanted host port clash with one of ``pods``'?"""
    used = [p for pod in pods for p in host_ports(pod)]
    for ip, protocol, port in wanted:
        for uip, uprotocol, uport in used:
            if (uprotocol, uport) != (protocol, port):
                continue
            if ip == BIND_ALL or uip in (BIND_ALL, ip):
                return True
    return False


# -- InterPodAffinity -----------------------------------------------------------------------


def selector_matches(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelectorAsSelector(selector).Matches: nil selects nothing, {} all."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(requirement_matches(labels, r) for r in selector.get("matchExpressions") or [])


@dataclass(frozen=True)
class AffinityTerm:
    """framework.AffinityTerm: the term of a pod, its namespaces resolved."""

    namespaces: frozenset[str]
    namespace_selector: Obj | None
    selector: Obj | None
    topology_key: str

    @classmethod
    def of(cls, pod: Obj, term: Obj) -> AffinityTerm:
        names = list(term.get("namespaces") or [])
        ns_selector = term.get("namespaceSelector")
        if not names and ns_selector is None:
            names = [str((pod.get("metadata") or {}).get("namespace") or "")]
        return cls(
            frozenset(names), ns_selector, term.get("labelSelector"), str(term.get("topologyKey"))
        )

    def matches(self, pod: Obj) -> bool:
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "")
        in_namespace = ns in self.namespaces or selector_matches(
            self.namespace_selector, {NAMESPACE_NAME_LABEL: ns}
        )
        return in_namespace and selector_matches(self.selector, meta.get("labels") or {})


def required_terms(pod: Obj, kind: str) -> list[AffinityTerm]:
    """The pod's requiredDuringSchedulingIgnoredDuringExecution terms of ``kind``
    (podAffinity or podAntiAffinity)."""
    section = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return [
        AffinityTerm.of(pod, t)
        for t in section.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    ]


def _all_match(terms: list[AffinityTerm], pod: Obj) -> bool:
    """podMatchesAllAffinityTerms."""
    return bool(terms) and all(t.matches(pod) for t in terms)


def _pair(node: Obj, key: str) -> Pair | None:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return (key, labels[key]) if key in labels else None


@dataclass
class AffinityState:
    """interpodaffinity's preFilterState."""

    pod: Obj
    affinity: list[AffinityTerm]
    anti_affinity: list[AffinityTerm]
    existing_anti_affinity_counts: Counter[Pair]
    affinity_counts: Counter[Pair]
    anti_affinity_counts: Counter[Pair]

    def skip(self) -> bool:
        return not (self.existing_anti_affinity_counts or self.affinity or self.anti_affinity)


NodePods = Iterable[tuple[Obj, list[Obj]]]  # (node, the pods on it)


def pre_filter(
    pod: Obj, with_anti_affinity: NodePods, every_node: Callable[[], NodePods]
) -> AffinityState:
    """PreFilter: ``with_anti_affinity`` are the nodes' pods that have required
    anti-affinity terms (HavePodsWithRequiredAntiAffinityList); every node's pods are
    looked at only when the pod has terms of its own."""
    affinity = required_terms(pod, "podAffinity")
    anti = required_terms(pod, "podAntiAffinity")
    existing, aff, anti_counts = Counter[Pair](), Counter[Pair](), Counter[Pair]()
    for node, pods in with_anti_affinity:
        for other in pods:
            for term in required_terms(other, "podAntiAffinity"):
                pair = _pair(node, term.topology_key)
                if pair is not None and term.matches(pod):
                    existing[pair] += 1
    if not affinity and not anti:
        return AffinityState(pod, affinity, anti, existing, aff, anti_counts)
    for node, pods in every_node():
        for other in pods:
            if _all_match(affinity, other):
                for term in affinity:
                    pair = _pair(node, term.topology_key)
                    if pair is not None:
                        aff[pair] += 1
            for term in anti:
                pair = _pair(node, term.topology_key)
                if pair is not None and term.matches(other):
                    anti_counts[pair] += 1
    return AffinityState(pod, affinity, anti, existing, aff, anti_counts)


def affinity_filter(state: AffinityState, node: Obj) -> tuple[str, bool] | None:
    """Filter: None when the node fits, else (reason, unresolvable)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    pods_exist = True
    for term in state.affinity:
        if term.topology_key not in labels:
            return ERR_REASON_AFFINITY, True
        if state.affinity_counts[(term.topology_key, labels[term.topology_key])] <= 0:
            pods_exist = False
    if not pods_exist and not (not state.affinity_counts and _all_match(state.affinity, state.pod)):
        return ERR_REASON_AFFINITY, True
    if state.anti_affinity_counts:
        for term in state.anti_affinity:
            pair = _pair(node, term.topology_key)
            if pair is not None and state.anti_affinity_counts[pair] > 0:
                return ERR_REASON_ANTI_AFFINITY, False
    if any(state.existing_anti_affinity_counts[(k, v)] > 0 for k, v in labels.items()):
        return ERR_REASON_EXISTING_ANTI_AFFINITY, False
    return None
