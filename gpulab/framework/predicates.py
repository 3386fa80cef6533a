"""The fit functions behind the in-tree Filter plugins, pure, over pod and node dicts.

Mirrors kubernetes v1.36.3:
- ``pkg/scheduler/framework/plugins/noderesources/fit.go`` ``fitsRequest`` (pod count,
  cpu, memory, ephemeral-storage, then every scalar/extended resource such as
  ``nvidia.com/gpu``; a request larger than the node's allocatable is *unresolvable*);
- ``plugins/nodename/node_name.go`` ``Fits``;
- ``plugins/nodeunschedulable`` (``spec.unschedulable`` unless the pod tolerates the
  ``node.kubernetes.io/unschedulable:NoSchedule`` taint);
- k8s.io/component-helpers v0.36.3 ``scheduling/corev1/nodeaffinity`` (nodeSelector AND
  any one required nodeSelectorTerm; In/NotIn/Exists/DoesNotExist/Gt/Lt on labels,
  In/NotIn on ``metadata.name``; preferred terms add their weight) and
  ``scheduling/corev1/helpers.go`` ``FindMatchingUntoleratedTaint``, with k8s.io/api
  ``core/v1/toleration.go`` ``ToleratesTaint``.

A stable, reusable part: the Volcano chapter's ``predicates`` and ``nodeorder`` plugins
call these, as upstream Volcano calls the in-tree plugins.

Lab difference: the alpha toleration operators Lt/Gt (feature gate
TaintTolerationComparisonOperators, off by default in 1.36) are not supported, as with
the gate off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulab.framework.resources import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    PODS,
    Resource,
    is_extended_resource_name,
)
from gpulab.framework.snapshot import NodeInfo

Obj = Mapping[str, Any]

TAINT_NODE_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NO_SCHEDULE, NO_EXECUTE, PREFER_NO_SCHEDULE = "NoSchedule", "NoExecute", "PreferNoSchedule"


# -- NodeResourcesFit -------------------------------------------------------------------


@dataclass(frozen=True)
class InsufficientResource:
    """What a node lacks for a pod (noderesources.InsufficientResource)."""

    resource: str
    reason: str
    requested: int
    used: int
    capacity: int
    unresolvable: bool = False


def fits_request(
    request: Resource,
    node: NodeInfo,
    ignored_resources: frozenset[str] = frozenset(),
    ignored_groups: frozenset[str] = frozenset(),
) -> list[InsufficientResource]:
    """Every resource ``node`` cannot give ``request``; empty when the pod fits."""
    out: list[InsufficientResource] = []
    alloc, used = node.allocatable, node.requested
    if len(node.pods) + 1 > alloc.allowed_pod_number:
        out.append(
            InsufficientResource(PODS, "Too many pods", 1, len(node.pods), alloc.allowed_pod_number)
        )
    if request.is_zero():
        return out
    for name, reason in (
        (CPU, "Insufficient cpu"),
        (MEMORY, "Insufficient memory"),
        (EPHEMERAL_STORAGE, "Insufficient ephemeral-storage"),
    ):
        want = request.get(name)
        if want > 0 and want > alloc.get(name) - used.get(name):
            out.append(
                InsufficientResource(
                    name, reason, want, used.get(name), alloc.get(name), want > alloc.get(name)
                )
            )
    for name, want in request.scalar.items():
        if want == 0:
            continue
        if is_extended_resource_name(name) and (
            name in ignored_resources or name.split("/")[0] in ignored_groups
        ):
            continue
        have = alloc.scalar.get(name, 0)
        if want > have - used.scalar.get(name, 0):
            out.append(
                InsufficientResource(
                    name,
                    f"Insufficient {name}",
                    want,
                    used.scalar.get(name, 0),
                    have,
                    want > have,
                )
            )
    return out


# -- NodeName ---------------------------------------------------------------------------


def node_name_fits(pod: Obj, node: Obj) -> bool:
    wanted = (pod.get("spec") or {}).get("nodeName")
    return not wanted or wanted == (node.get("metadata") or {}).get("name")


# -- taints and tolerations ---------------------------------------------------------------


def toleration_tolerates_taint(toleration: Obj, taint: Obj) -> bool:
    """core/v1 Toleration.ToleratesTaint (empty effect/key match any; Exists ignores
    the value)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def tolerations_tolerate_taint(tolerations: Iterable[Obj], taint: Obj) -> bool:
    return any(toleration_tolerates_taint(t, taint) for t in tolerations)


def find_untolerated_taint(
    taints: Iterable[Obj],
    tolerations: Sequence[Obj],
    effects: tuple[str, ...] = (NO_SCHEDULE, NO_EXECUTE),
) -> Obj | None:
    """The first taint with one of ``effects`` that no toleration tolerates, or None."""
    for taint in taints:
        if taint.get("effect") in effects and not tolerations_tolerate_taint(tolerations, taint):
            return taint
    return None


def pod_tolerations(pod: Obj) -> list[Obj]:
    return list((pod.get("spec") or {}).get("tolerations") or [])


def node_taints(node: Obj) -> list[Obj]:
    return list((node.get("spec") or {}).get("taints") or [])


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    """TaintToleration's Filter: a NoSchedule/NoExecute taint the pod does not tolerate."""
    return find_untolerated_taint(node_taints(node), pod_tolerations(pod))


def count_intolerable_prefer_no_schedule(pod: Obj, node: Obj) -> int:
    """TaintToleration's Score: PreferNoSchedule taints the pod's (empty-effect or
    PreferNoSchedule) tolerations do not cover."""
    tolerations = [
        t for t in pod_tolerations(pod) if (t.get("effect") or "") in ("", PREFER_NO_SCHEDULE)
    ]
    return sum(
        1
        for taint in node_taints(node)
        if taint.get("effect") == PREFER_NO_SCHEDULE
        and not tolerations_tolerate_taint(tolerations, taint)
    )


# -- NodeUnschedulable --------------------------------------------------------------------


def node_unschedulable_fits(pod: Obj, node: Obj) -> bool:
    if not (node.get("spec") or {}).get("unschedulable"):
        return True
    taint = {"key": TAINT_NODE_UNSCHEDULABLE, "effect": NO_SCHEDULE}
    return tolerations_tolerate_taint(pod_tolerations(pod), taint)


# -- NodeAffinity -------------------------------------------------------------------------


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def requirement_matches(labels: Mapping[str, str], req: Obj) -> bool:
    """One NodeSelectorRequirement against a node's labels (labels.Requirement.Matches)."""
    key, op, values = req.get("key"), req.get("operator"), list(req.get("values") or [])
    has = key in labels
    if op == "In":
        return has and labels[key] in values
    if op == "NotIn":
        return not has or labels[key] not in values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt"):
        if not has or len(values) != 1:
            return False
        mine, theirs = _as_int(labels[key]), _as_int(values[0])
        if mine is None or theirs is None:
            return False
        return mine > theirs if op == "Gt" else mine < theirs
    return False  # an unknown operator never matches (the API server rejects it anyway)


def _field_matches(node_name: str, req: Obj) -> bool:
    values = list(req.get("values") or [])
    if req.get("key") != "metadata.name" or len(values) != 1:
        return False
    if req.get("operator") == "In":
        return node_name == values[0]
    if req.get("operator") == "NotIn":
        return node_name != values[0]
    return False


def term_matches(node: Obj, term: Obj) -> bool:
    """One NodeSelectorTerm: all its label expressions and field expressions hold."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
    if exprs and not all(requirement_matches(labels, r) for r in exprs):
        return False
    return not (fields and not all(_field_matches(str(meta.get("name")), r) for r in fields))


def _non_empty_terms(selector: Obj) -> list[Obj]:
    return [
        t
        for t in selector.get("nodeSelectorTerms") or []
        if t.get("matchExpressions") or t.get("matchFields")
    ]


def node_selector_matches(node: Obj, selector: Obj) -> bool:
    """A NodeSelector: any one of its (non-empty) terms matches; none means no match."""
    return any(term_matches(node, t) for t in _non_empty_terms(selector))


def required_node_affinity(pod: Obj) -> Obj | None:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return affinity.get("requiredDuringSchedulingIgnoredDuringExecution")


def preferred_node_affinity(pod: Obj) -> list[Obj]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return list(affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])


def node_affinity_matches(pod: Obj, node: Obj) -> bool:
    """GetRequiredNodeAffinity(pod).Match(node): ``spec.nodeSelector`` and the required
    node affinity both hold."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = required_node_affinity(pod)
    return required is None or node_selector_matches(node, required)


def preferred_affinity_score(pod: Obj, node: Obj) -> int:
    """NodeAffinity's Score: the sum of the weights of preferred terms that match
    (terms with weight 0 or no expressions are skipped)."""
    score = 0
    for term in preferred_node_affinity(pod):
        pref = term.get("preference") or {}
        if not term.get("weight") or not (pref.get("matchExpressions") or pref.get("matchFields")):
            continue
        if term_matches(node, pref):
            score += int(term["weight"])
    return score
