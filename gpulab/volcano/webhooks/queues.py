"""Admission of Queues: defaults on create, validation on create, update and delete.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/webhooks/admission/queues``:
- ``mutate/mutate_queue.go`` (``/queues/mutate``, CREATE): ``spec.reclaimable`` defaults
  to true, ``spec.weight`` to 1;
- ``validate/validate_queue.go`` (``/queues/validate``): on CREATE and UPDATE
  ``validateQueue`` - quantities not negative (integers for extended resources),
  ``guarantee <= deserved <= capability`` per resource, ``status.state`` Open or Closed,
  the ``volcano.sh/hierarchy`` / ``volcano.sh/hierarchy-weights`` annotations (same
  length, positive weights, not under another queue's path) - then
  ``validateHierarchicalQueue`` (a parent that exists, is not the queue itself, is at most
  ``--max-queue-depth`` (5) deep, and holds no pods if it has no children yet), the root
  queue's protection (``--enable-root-queue-protection``, on) and
  ``validateHierarchicalQueueResources`` (a child's capability within its ancestors',
  the siblings' guarantee and deserved within the parent's, a parent's capability at
  least its descendants'); on DELETE ``validateQueueDeleting`` (not ``default`` or
  ``root``, no child queues). The messages are upstream's, word for word; field errors
  are aggregated as apimachinery's ``ToAggregate`` prints them.

Lab differences: the map iteration of Go (several bad resources of one queue) is sorted
here, so a message repeats; ``--enable-queue-allocated-pods-check`` (off upstream) is not
offered.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Protocol

from gpulab.framework.resources import is_extended_resource_name
from gpulab.kueue.api import format_quantity, quantity
from gpulab.volcano import apis
from gpulab.volcano.scheduler.api.resource_info import ZERO, Resource

Obj = dict[str, Any]
HIERARCHY = "volcano.sh/hierarchy"
HIERARCHY_WEIGHTS = "volcano.sh/hierarchy-weights"
MAX_QUEUE_DEPTH = 5  # --max-queue-depth
VALID_STATES = (apis.QUEUE_OPEN, apis.QUEUE_CLOSED)
# k8s core helper.IsIntegerResourceName: besides extended resources, the standard counts
_INTEGER_RESOURCES = frozenset(
    {
        "pods",
        "services",
        "replicationcontrollers",
        "resourcequotas",
        "secrets",
        "configmaps",
        "persistentvolumeclaims",
        "services.nodeports",
        "services.loadbalancers",
    }
)


class Queues(Protocol):
    """The webhook's QueueLister (an informer's store)."""

    def get(self, key: str) -> Obj | None: ...

    def list(self) -> list[Obj]: ...


def mutate_patch(queue: Mapping[str, Any]) -> list[Obj]:
    spec = queue.get("spec") or {}
    patch: list[Obj] = []
    if spec.get("reclaimable") is None:
        patch.append({"op": "add", "path": "/spec/reclaimable", "value": True})
    if not spec.get("weight"):
        patch.append({"op": "add", "path": "/spec/weight", "value": 1})
    return patch


# -- small readers ----------------------------------------------------------------------------


def _name(queue: Mapping[str, Any]) -> str:
    return str((queue.get("metadata") or {}).get("name") or "")


def _spec(queue: Mapping[str, Any]) -> Mapping[str, Any]:
    return queue.get("spec") or {}


def _parent(queue: Mapping[str, Any] | None) -> str:
    return str(_spec(queue or {}).get("parent") or "")


def _guarantee(queue: Mapping[str, Any]) -> Mapping[str, Any]:
    return (_spec(queue).get("guarantee") or {}).get("resource") or {}


def not_found(name: str) -> str:
    """The lister's NotFound error text."""
    return f'queue.scheduling.volcano.sh "{name}" not found'


def children_of(name: str, queues: Queues) -> list[Obj]:
    """GetQueuesByParent (the informer's queueParent index), by name."""
    return sorted((q for q in queues.list() if _parent(q) == name), key=_name)


def _invalid(path: str, value: str, detail: str) -> str:
    """field.Invalid(...).Error(): a string value is printed quoted (%q)."""
    return f"{path}: Invalid value: {json.dumps(value, ensure_ascii=False)}: {detail}"


def aggregate(errors: list[str]) -> str:
    """utilerrors.NewAggregate(errs).Error(): one error as is, several deduplicated in
    brackets."""
    unique = list(dict.fromkeys(errors))
    if len(unique) == 1:
        return unique[0]
    return "[" + ", ".join(unique) + "]" if unique else ""


# -- validateQueue ----------------------------------------------------------------------------


def _quantity_value(name: str, raw: Any, path: str) -> list[str]:
    """k8s ValidateResourceQuantityValue."""
    errors = []
    value = quantity(raw)
    if value < 0:
        errors.append(_invalid(path, str(raw), "must be greater than or equal to 0"))
    integer = name in _INTEGER_RESOURCES or is_extended_resource_name(name)
    if integer and (value * 1000) % 1000 != 0:
        errors.append(_invalid(path, str(raw), "must be an integer"))
    return errors


def _resource_quantities(spec: Mapping[str, Any], path: str) -> list[str]:
    """validateResourceQuantityOfQueue: guarantee <= deserved <= capability."""
    errors: list[str] = []
    capability, deserved = spec.get("capability") or {}, spec.get("deserved") or {}
    for kind, resources in (("capability", capability), ("deserved", deserved)):
        for name in sorted(resources):
            errors += _quantity_value(name, resources[name], f"{path}.{kind}.{name}")
    guarantee = (spec.get("guarantee") or {}).get("resource") or {}
    for name in sorted(guarantee):
        g = guarantee[name]
        errors += _quantity_value(name, g, f"{path}.guarantee.resource.{name}")
        if name not in deserved:
            errors.append(
                _invalid(
                    f"{path}.deserved.{name}",
                    "<nil>",
                    f"deserved[{name}] must be >= guarantee[{name}]={g}",
                )
            )
        elif quantity(deserved[name]) < quantity(g):
            d = deserved[name]
            errors.append(
                _invalid(
                    f"{path}.deserved.{name}",
                    str(d),
                    f"deserved[{name}]={d} must be >= guarantee[{name}]={g}",
                )
            )
    if deserved and capability:
        for name in sorted(deserved):
            if name in capability and quantity(deserved[name]) > quantity(capability[name]):
                d, c = deserved[name], capability[name]
                errors.append(
                    _invalid(
                        f"{path}.deserved.{name}",
                        str(d),
                        f"deserved[{name}]={d} must be <= capability[{name}]={c}",
                    )
                )
    return errors


def _hierarchy_attributes(queue: Mapping[str, Any], queues: Queues) -> list[str]:
    """validateHierarchicalAttributes: the hierarchy annotations."""
    annotations = (queue.get("metadata") or {}).get("annotations") or {}
    hierarchy = str(annotations.get(HIERARCHY) or "")
    weights = str(annotations.get(HIERARCHY_WEIGHTS) or "")
    if not hierarchy and not weights:
        return []
    path = "requestBody.metadata.annotations"
    if len(hierarchy.split("/")) != len(weights.split("/")):
        detail = f"{HIERARCHY} must have the same length with {HIERARCHY_WEIGHTS}"
        return [_invalid(path, hierarchy, detail)]
    for weight in weights.split("/"):
        try:
            value = float(weight)
        except ValueError:
            reason = f'strconv.ParseFloat: parsing "{weight}": invalid syntax'
            detail = f"{weight} in the {weights} is invalid number: {reason}"
            return [_invalid(path, weights, detail)]
        if value <= 0:
            return [_invalid(path, weights, f"{weight} in the {weights} must be larger than 0")]
    for other in queues.list():
        theirs = str(((other.get("metadata") or {}).get("annotations") or {}).get(HIERARCHY) or "")
        if theirs and _name(other) != _name(queue) and theirs.startswith(hierarchy + "/"):
            detail = (
                f"{hierarchy} is not allowed to be in the sub path of {theirs} of queue "
                f"{_name(other)}"
            )
            return [_invalid(path, hierarchy, detail)]
    return []


def validate_queue(queue: Mapping[str, Any], queues: Queues) -> str:
    """validateQueue: "" when fine, else the aggregated field errors."""
    errors = _resource_quantities(_spec(queue), "requestBody.spec")
    state = str((queue.get("status") or {}).get("state") or "")
    if state and state not in VALID_STATES:
        detail = f"queue state must be in [{' '.join(VALID_STATES)}]"
        errors.append(_invalid("requestBody.spec.state", state, detail))
    errors += _hierarchy_attributes(queue, queues)
    return aggregate(errors)


# -- hierarchy --------------------------------------------------------------------------------


def _allocated_pods(queue: Mapping[str, Any]) -> int:
    raw = ((queue.get("status") or {}).get("allocated") or {}).get("pods")
    return int(quantity(raw)) if raw is not None else 0


def validate_hierarchical_queue(queue: Mapping[str, Any], queues: Queues) -> str:
    """validateHierarchicalQueue (+ validateQueueDepth)."""
    name, parent = _name(queue), _parent(queue)
    if parent in ("", apis.ROOT_QUEUE):
        return ""
    if parent == name:
        return f"queue {name} cannot use itself as parent"
    depth, up = 1, parent
    while up not in ("", apis.ROOT_QUEUE):
        depth += 1
        if depth > MAX_QUEUE_DEPTH:
            return f"queue {name} exceeds the maximum allowed depth of {MAX_QUEUE_DEPTH}"
        above = queues.get(up)
        if above is None:
            return f"failed to get parent queue {up} of queue {name}: {not_found(up)}"
        up = _parent(above)
    parent_queue = queues.get(parent)
    if parent_queue is None:
        return f"failed to get parent queue of queue {name}: {not_found(parent)}"
    pods = _allocated_pods(parent_queue)
    if not children_of(parent, queues) and pods:
        return (
            f"queue {parent} cannot be the parent queue of queue {name} because it has "
            f"allocated Pods: {pods}"
        )
    return ""


def needs_hierarchical_resources(
    queue: Mapping[str, Any], old: Mapping[str, Any] | None, operation: str
) -> bool:
    """needsValidateHierarchicalQueue."""
    if _name(queue) == apis.ROOT_QUEUE:
        return False
    if operation == "CREATE":
        return True
    if operation != "UPDATE" or old is None:
        return False
    new_spec, old_spec = _spec(queue), _spec(old)
    return (
        _parent(queue) != _parent(old)
        or (new_spec.get("capability") or {}) != (old_spec.get("capability") or {})
        or (new_spec.get("deserved") or {}) != (old_spec.get("deserved") or {})
        or _guarantee(queue) != _guarantee(old)
    )


def _formatted(name: str, value: float) -> str:
    """formatResourceWithType: cpu as millicores' quantity, memory in binary units."""
    if name == "cpu":
        return format_quantity(Decimal(int(value)) / 1000)
    if name == "memory":
        return format_quantity(Decimal(int(value)))
    return f"{value:.2f}"


def _capability(queue: Mapping[str, Any]) -> Resource | None:
    cap = _spec(queue).get("capability")
    return Resource.from_list(cap) if cap is not None else None


def _ancestor_capability(queue: Mapping[str, Any], name: str, queues: Queues) -> float | None:
    """findNearestAncestorCapability."""
    seen: set[str] = set()
    up = _parent(queue)
    while up not in ("", apis.ROOT_QUEUE) and up not in seen:
        seen.add(up)
        above = queues.get(up)
        if above is None:
            return None
        cap = _capability(above)
        if cap is not None and cap.get(name) > 0:
            return cap.get(name)
        up = _parent(above)
    return None


def _subtree_max_capability(
    queue: Mapping[str, Any], name: str, queues: Queues, seen: frozenset[str] = frozenset()
) -> float:
    """findSubtreeMaxCapability."""
    cap = _capability(queue)
    if cap is not None and cap.get(name) > 0:
        return cap.get(name)
    best = 0.0
    for child in children_of(_name(queue), queues):
        if _name(child) not in seen:
            below = _subtree_max_capability(child, name, queues, seen | {_name(queue)})
            best = max(best, below)
    return best


def _sum_within(parent: Mapping[str, Any], members: Iterable[Mapping[str, Any]], label: str) -> str:
    """The running sums of the members' guarantee and deserved against the parent's."""
    parent_guarantee = Resource.from_list(_guarantee(parent))
    parent_deserved = Resource.from_list(_spec(parent).get("deserved"))
    total_guarantee, total_deserved = Resource(), Resource()
    for member in members:
        total_guarantee.add(Resource.from_list(_guarantee(member)))
        if parent_guarantee.less_partly(total_guarantee, ZERO):
            return (
                f"{label} validation failed: sum of children's guarantee "
                f"({total_guarantee.go_string()}) exceeds parent's guarantee limit "
                f"({parent_guarantee.go_string()})"
            )
        total_deserved.add(Resource.from_list(_spec(member).get("deserved")))
        if parent_deserved.less_partly(total_deserved, ZERO):
            return (
                f"{label} validation failed: sum of children's deserved "
                f"({total_deserved.go_string()}) exceeds parent's deserved limit "
                f"({parent_deserved.go_string()})"
            )
    return ""


def validate_hierarchical_resources(queue: Mapping[str, Any], queues: Queues) -> str:
    """validateHierarchicalQueueResources."""
    name, parent = _name(queue), _parent(queue)
    cap = _capability(queue) or Resource()
    if parent not in ("", apis.ROOT_QUEUE):
        parent_queue = queues.get(parent)
        if parent_queue is None:
            return f"parent queue {parent} not found: {not_found(parent)}"
        for r in cap.resource_names():
            limit = _ancestor_capability(queue, r, queues)
            if limit is not None and cap.get(r) > limit:
                return (
                    f"queue {name} capability[{r}]={_formatted(r, cap.get(r))} exceeds its "
                    f"ancestor's capability={_formatted(r, limit)}"
                )
        siblings = [q for q in children_of(parent, queues) if _name(q) != name]
        message = _sum_within(parent_queue, [*siblings, queue], f"parent queue {parent}")
        if message:
            return message
    children = children_of(name, queues)
    if not children:
        return ""
    for r in cap.resource_names():
        most = max(_subtree_max_capability(c, r, queues, frozenset({name})) for c in children)
        if cap.get(r) < most:
            return (
                f"queue {name} capability[{r}]={_formatted(r, cap.get(r))} is smaller than "
                f"its descendants' max capability={_formatted(r, most)}"
            )
    return _sum_within(queue, children, f"queue {name}")


# -- AdmitQueues ------------------------------------------------------------------------------


def validate_create_update(
    queue: Mapping[str, Any], old: Mapping[str, Any] | None, operation: str, queues: Queues
) -> str:
    """AdmitQueues for CREATE and UPDATE: "" when admitted, else the error."""
    message = validate_queue(queue, queues)
    if message:
        return message
    if operation == "CREATE" or _parent(old) != _parent(queue):
        message = validate_hierarchical_queue(queue, queues)
        if message:
            return message
    if operation == "UPDATE" and _name(queue) == apis.ROOT_QUEUE and old is not None:
        spec, old_spec = _spec(queue), _spec(old)
        if (
            spec.get("capability") != old_spec.get("capability")
            or spec.get("deserved") != old_spec.get("deserved")
            or _guarantee(queue) != _guarantee(old)
        ):
            return (
                "root queue's resource attributes (capability, deserved, guarantee) "
                "cannot be modified"
            )
    if needs_hierarchical_resources(queue, old, operation):
        return validate_hierarchical_resources(queue, queues)
    return ""


def validate_delete(name: str, queues: Queues) -> str:
    """validateQueueDeleting."""
    if name in (apis.DEFAULT_QUEUE, apis.ROOT_QUEUE):
        return f"`{name}` queue can not be deleted"
    if queues.get(name) is None:
        return not_found(name)
    children = [_name(q) for q in children_of(name, queues)]
    if children:
        return (
            f"queue {name} can not be deleted because it has {len(children)} child queues: "
            f"{', '.join(children)}"
        )
    return ""
