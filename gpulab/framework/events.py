"""Cluster events: what changed in the cluster, and whether it may help a rejected pod.

Mirrors kubernetes v1.36.3 ``staging/src/k8s.io/kube-scheduler/framework/types.go``
(``ActionType`` with its bits in upstream's order, ``EventResource``, ``ClusterEvent`` and
its ``Label``, ``ClusterEventWithHint``, ``QueueingHint``, ``QueueingHintFn``) and
``pkg/scheduler/framework/events.go`` + ``types.go`` (``EventAssignedPodAdd`` ...,
``EventUnschedulableTimeout``, ``EventForceActivate``, ``PodSchedulingPropertiesChange``,
``NodeSchedulingPropertiesChange``, ``MatchClusterEvents``, ``UnrollWildCardResource``).

A plugin's ``EventsToRegister`` returns :class:`ClusterEventWithHint` s. When a pod the
plugin rejected sits in unschedulablePods and a matching event arrives, the scheduling
queue calls the hint with ``(pod, old, new)`` (``old`` is None for an add, ``new`` None
for a delete): ``QUEUE`` moves the pod on, ``QUEUE_SKIP`` leaves it where it is. A
registration without a hint function behaves as one that always says ``QUEUE``.

Lab differences: objects are the API's JSON dicts; pod requests are read from ``spec``
(upstream reads the resized ``status`` resources of in-place scaled pods).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.framework.resources import milli_value_of, pod_requests, quantity

Obj = Mapping[str, Any]


class ActionType(enum.IntFlag):
    """What happened to an object; the bits are upstream's, in upstream's order (the
    order matters: an incoming event matches a registered one only if it is not broader)."""

    NONE = 0
    ADD = 1 << 0
    DELETE = 1 << 1
    UPDATE_NODE_ALLOCATABLE = 1 << 2
    UPDATE_NODE_LABEL = 1 << 3
    UPDATE_NODE_TAINT = 1 << 4  # taints, or spec.unschedulable
    UPDATE_NODE_CONDITION = 1 << 5
    UPDATE_NODE_ANNOTATION = 1 << 6
    UPDATE_NODE_DECLARED_FEATURE = 1 << 7
    UPDATE_POD_LABEL = 1 << 8
    UPDATE_POD_SCALE_DOWN = 1 << 9
    UPDATE_POD_TOLERATION = 1 << 10
    UPDATE_POD_SCHEDULING_GATES_ELIMINATED = 1 << 11
    UPDATE_POD_GENERATED_RESOURCE_CLAIM = 1 << 12
    ALL = (1 << 13) - 1
    UPDATE = ALL & ~(ADD | DELETE)

    def __str__(self) -> str:
        # upstream's ActionType.String(): "" for a combination without a name
        return _ACTION_NAMES.get(self, "")


_ACTION_NAMES = {
    ActionType.ADD: "Add",
    ActionType.DELETE: "Delete",
    ActionType.UPDATE_NODE_ALLOCATABLE: "UpdateNodeAllocatable",
    ActionType.UPDATE_NODE_LABEL: "UpdateNodeLabel",
    ActionType.UPDATE_NODE_TAINT: "UpdateNodeTaint",
    ActionType.UPDATE_NODE_CONDITION: "UpdateNodeCondition",
    ActionType.UPDATE_NODE_ANNOTATION: "UpdateNodeAnnotation",
    ActionType.UPDATE_NODE_DECLARED_FEATURE: "UpdateNodeDeclaredFeature",
    ActionType.UPDATE_POD_LABEL: "UpdatePodLabel",
    ActionType.UPDATE_POD_SCALE_DOWN: "UpdatePodScaleDown",
    ActionType.UPDATE_POD_TOLERATION: "UpdatePodToleration",
    ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED: "UpdatePodSchedulingGatesEliminated",
    ActionType.UPDATE_POD_GENERATED_RESOURCE_CLAIM: "UpdatePodGeneratedResourceClaim",
    ActionType.ALL: "All",
    ActionType.UPDATE: "Update",
}

# EventResource names as upstream spells them; a custom resource is
# "<plural>.<version>.<group>", e.g. "podgroups.v1alpha1.scheduling.x-k8s.io".
POD = "Pod"
NODE = "Node"
WILDCARD = "*"
# internal to the scheduler (never in EventsToRegister): a registered Pod covers both
ASSIGNED_POD = "AssignedPod"
UNSCHEDULED_POD = "UnschedulablePod"


@dataclass(frozen=True)
class ClusterEvent:
    resource: str
    action_type: ActionType
    custom_label: str = ""

    @property
    def label(self) -> str:
        """Label(): "NodeAdd", "AssignedPodDelete", "NodeUpdateNodeLabel" ..."""
        return self.custom_label or f"{self.resource}{self.action_type}"

    def __str__(self) -> str:
        return self.label


def is_wildcard(event: ClusterEvent) -> bool:
    """ClusterEventIsWildCard."""
    return event.resource == WILDCARD and event.action_type == ActionType.ALL


def _match_resources(registered: str, incoming: str) -> bool:
    return registered in (WILDCARD, incoming) or (
        registered == POD and incoming in (ASSIGNED_POD, UNSCHEDULED_POD)
    )


def match_cluster_events(registered: ClusterEvent, incoming: ClusterEvent) -> bool:
    """MatchClusterEvents: ``incoming`` is the same as ``registered`` or more specific
    (a registered Node/Update matches an incoming Node/UpdateNodeLabel, not the other way
    round); an incoming wildcard event matches only a registered wildcard."""
    return is_wildcard(registered) or (
        _match_resources(registered.resource, incoming.resource)
        and bool(registered.action_type & incoming.action_type)
        and incoming.action_type <= registered.action_type
    )


def match_any_cluster_event(event: ClusterEvent, registered: Iterable[ClusterEvent]) -> bool:
    return any(match_cluster_events(r, event) for r in registered)


# special labels (events.go)
SCHEDULE_ATTEMPT_FAILURE = "ScheduleAttemptFailure"
BACKOFF_COMPLETE = "BackoffComplete"
POP_FROM_BACKOFF_Q = "PopFromBackoffQ"
FORCE_ACTIVATE = "ForceActivate"
UNSCHEDULABLE_TIMEOUT = "UnschedulableTimeout"

EVENT_ASSIGNED_POD_ADD = ClusterEvent(ASSIGNED_POD, ActionType.ADD)
EVENT_ASSIGNED_POD_UPDATE = ClusterEvent(ASSIGNED_POD, ActionType.UPDATE)
EVENT_ASSIGNED_POD_DELETE = ClusterEvent(ASSIGNED_POD, ActionType.DELETE)
EVENT_UNSCHEDULED_POD_ADD = ClusterEvent(UNSCHEDULED_POD, ActionType.ADD)
EVENT_UNSCHEDULED_POD_UPDATE = ClusterEvent(UNSCHEDULED_POD, ActionType.UPDATE)
EVENT_UNSCHEDULED_POD_DELETE = ClusterEvent(UNSCHEDULED_POD, ActionType.DELETE)
EVENT_UNSCHEDULABLE_TIMEOUT = ClusterEvent(WILDCARD, ActionType.ALL, UNSCHEDULABLE_TIMEOUT)
EVENT_FORCE_ACTIVATE = ClusterEvent(WILDCARD, ActionType.ALL, FORCE_ACTIVATE)
EVENT_NODE_ADD = ClusterEvent(NODE, ActionType.ADD)
EVENT_NODE_DELETE = ClusterEvent(NODE, ActionType.DELETE)


class QueueingHint(enum.IntEnum):
    QUEUE_SKIP = 0  # the event does not help the pod
    QUEUE = 1  # the event may make the pod schedulable

    def __str__(self) -> str:
        return "QueueSkip" if self is QueueingHint.QUEUE_SKIP else "Queue"


QueueingHintFn = Callable[[Obj, Any, Any], QueueingHint]
"""(the rejected pod, the object before the event, the object after it) -> hint"""


@dataclass(frozen=True)
class ClusterEventWithHint:
    event: ClusterEvent
    queueing_hint_fn: QueueingHintFn | None = None


def unroll_wildcard_resource() -> list[ClusterEventWithHint]:
    """What a plugin without EnqueueExtensions is taken to register: everything (of the
    resources the lab watches)."""
    return [
        ClusterEventWithHint(ClusterEvent(POD, ActionType.ALL)),
        ClusterEventWithHint(ClusterEvent(NODE, ActionType.ALL)),
    ]


# -- what an update changed (PodSchedulingPropertiesChange, NodeSchedulingPropertiesChange) -


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def _spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def _status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def _pod_scaled_down(new: Obj, old: Obj) -> bool:
    """extractPodScaleDown: a request removed or made smaller."""
    new_reqs, old_reqs = pod_requests(new), pod_requests(old)
    for name, q in old_reqs.items():
        if name not in new_reqs or milli_value_of(q) > milli_value_of(new_reqs[name]):
            return True
    return False


def pod_scheduling_properties_change(new: Obj, old: Obj) -> list[ClusterEvent]:
    """PodSchedulingPropertiesChange: the UpdatePodXYZ events an update of a pod is, or
    the general Update when it is none of them."""
    resource = ASSIGNED_POD if _spec(new).get("nodeName") else UNSCHEDULED_POD
    actions = []
    if (_meta(new).get("labels") or {}) != (_meta(old).get("labels") or {}):
        actions.append(ActionType.UPDATE_POD_LABEL)
    if _pod_scaled_down(new, old):
        actions.append(ActionType.UPDATE_POD_SCALE_DOWN)
    if not _spec(new).get("schedulingGates") and _spec(old).get("schedulingGates"):
        actions.append(ActionType.UPDATE_POD_SCHEDULING_GATES_ELIMINATED)
    if len(_spec(new).get("tolerations") or []) != len(_spec(old).get("tolerations") or []):
        actions.append(ActionType.UPDATE_POD_TOLERATION)
    claims = ("resourceClaimStatuses", "extendedResourceClaimStatus")
    if any(_status(new).get(k) != _status(old).get(k) for k in claims):
        actions.append(ActionType.UPDATE_POD_GENERATED_RESOURCE_CLAIM)
    return [ClusterEvent(resource, a) for a in actions] or [
        ClusterEvent(resource, ActionType.UPDATE)
    ]


def _quantities(resources: Obj | None) -> dict[str, int]:
    """A ResourceList compared semantically ("1" == "1000m")."""
    return {name: milli_value_of(quantity(v)) for name, v in (resources or {}).items()}


def _condition_statuses(node: Obj) -> dict[str, str]:
    return {c.get("type"): c.get("status") for c in _status(node).get("conditions") or []}


def node_scheduling_properties_change(new: Obj, old: Obj) -> list[ClusterEvent]:
    """NodeSchedulingPropertiesChange: the UpdateNodeXYZ events an update of a node is
    (none for a heartbeat: conditions count by type and status only)."""
    checks = (
        # extractNodeSpecUnschedulableChange: only a node that became schedulable
        bool(_spec(new).get("unschedulable")) != bool(_spec(old).get("unschedulable"))
        and not _spec(new).get("unschedulable"),
        _quantities(_status(new).get("allocatable"))
        != _quantities(_status(old).get("allocatable")),
        (_meta(new).get("labels") or {}) != (_meta(old).get("labels") or {}),
        (_spec(new).get("taints") or []) != (_spec(old).get("taints") or []),
        _condition_statuses(new) != _condition_statuses(old),
        (_meta(new).get("annotations") or {}) != (_meta(old).get("annotations") or {}),
        (_status(new).get("declaredFeatures") or [])
        != (_status(old).get("declaredFeatures") or []),
    )
    actions = (
        ActionType.UPDATE_NODE_TAINT,
        ActionType.UPDATE_NODE_ALLOCATABLE,
        ActionType.UPDATE_NODE_LABEL,
        ActionType.UPDATE_NODE_TAINT,
        ActionType.UPDATE_NODE_CONDITION,
        ActionType.UPDATE_NODE_ANNOTATION,
        ActionType.UPDATE_NODE_DECLARED_FEATURE,
    )
    return [ClusterEvent(NODE, a) for changed, a in zip(checks, actions, strict=True) if changed]
