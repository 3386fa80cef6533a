"""Admission of PodGroups: only into a queue that is Open.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/webhooks/admission/podgroups/validate/
validate_podgroup.go`` (``/podgroups/validate``, CREATE): ``checkQueueState`` (the
PodGroup's queue must exist and be Open - the same rule ``/jobs/validate`` applies to
vcjobs, here for PodGroups a user or a controller writes directly) and
``validateNetworkTopology`` (``highestTierAllowed`` and ``highestTierName`` are
exclusive, on the PodGroup and in each ``subGroupPolicy``). Messages word for word.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpulab.volcano import apis
from gpulab.volcano.webhooks.queues import not_found

_BOTH = (
    "must not specify 'highestTierAllowed' and 'highestTierName' in networkTopology simultaneously."
)


def check_queue_state(name: str, get_queue: Callable[[str], Mapping[str, Any] | None]) -> str:
    if not name:
        return ""
    queue = get_queue(name)
    if queue is None:
        return f"unable to find queue: {not_found(name)}"
    state = (queue.get("status") or {}).get("state") or ""
    if state != apis.QUEUE_OPEN:
        return (
            f"can only submit PodGroup to queue with state `Open`, queue `{name}` status is "
            f"`{state}`. "
        )
    return ""


def _both_tiers(topology: Mapping[str, Any] | None) -> bool:
    topology = topology or {}
    return topology.get("highestTierAllowed") is not None and bool(topology.get("highestTierName"))


def validate_network_topology(spec: Mapping[str, Any]) -> str:
    errors = []
    if _both_tiers(spec.get("networkTopology")):
        errors.append(_BOTH)
    for policy in spec.get("subGroupPolicy") or []:
        if _both_tiers(policy.get("networkTopology")):
            errors.append(f"in subGroupPolicy '{policy.get('name') or ''}': {_BOTH}")
            break
    return " ".join(errors)


def validate_create(
    pg: Mapping[str, Any], get_queue: Callable[[str], Mapping[str, Any] | None]
) -> str:
    """validatePodGroup: "" when admitted, else the message."""
    spec = pg.get("spec") or {}
    return check_queue_state(str(spec.get("queue") or ""), get_queue) + validate_network_topology(
        spec
    )
