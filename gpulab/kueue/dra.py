"""Pods that ask for devices through Dynamic Resource Allocation (``resourceClaims``):
why such a Workload is refused. Pure, given a way to read a ResourceClaimTemplate.

Mirrors kubernetes-sigs/kueue v0.19.2 with ``KueueDRAIntegration`` on (its default) and
no ``resources.deviceClassMappings`` in the Configuration (the lab's Configuration
rejects that field): pkg/controller/core/workload_controller.go refuses a pending
Workload that names a ResourceClaim ("KueueDRAIntegration feature does not support use
of resource claims"), and pkg/dra/claims.go ``GetResourceRequestsForResourceClaimTemplates``
reads each ResourceClaimTemplate, ``countDevicesPerClass`` rejects the request forms it
does not count, and the first DeviceClass is "not mapped in DRA configuration". Either
way QuotaReserved=False ``Misconfigured`` (``Inadmissible`` without the
UnadmittedWorkloadsObservability gate) and Requeued=False ``Inadmissible``: the
Workload is never admitted, so its devices are never used uncounted.

Lab difference: no device is ever counted against quota (upstream counts it once a
mapping names a resource); CEL selectors are not compiled or checked against
ResourceSlices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.kueue.validation import invalid

Obj = Mapping[str, Any]
CLAIMS_NOT_SUPPORTED = "KueueDRAIntegration feature does not support use of resource claims"
CLAIMS_NOT_SUPPORTED_REQUEUED = "DRA resource claims not supported"


class TemplateMissing(Exception):
    """The ResourceClaimTemplate could not be read: upstream's internal error, retried."""


@dataclass(frozen=True)
class Refusal:
    """What the Workload's QuotaReserved and Requeued conditions say."""

    message: str
    requeued_message: str
    retry: bool = False  # an internal error: the reconcile is retried


def _pod_sets(wl: Obj) -> list[Obj]:
    return list((wl.get("spec") or {}).get("podSets") or [])


def _claims(ps: Obj) -> list[Obj]:
    return list(((ps.get("template") or {}).get("spec") or {}).get("resourceClaims") or [])


def has_dra(wl: Obj) -> bool:
    """HasDRA: a pod set names a ResourceClaim or a ResourceClaimTemplate."""
    return any(
        c.get("resourceClaimName") or c.get("resourceClaimTemplateName")
        for ps in _pod_sets(wl)
        for c in _claims(ps)
    )


def _device_classes(spec: Obj, path: str, template: str) -> tuple[list[str], str | None]:
    """countDevicesPerClass: the DeviceClasses asked for, or the first unsupported form."""
    classes: list[str] = []
    for i, req in enumerate(((spec.get("devices") or {}).get("requests")) or []):
        at = f"{path}.devices.requests[{i}]"

        def refuse(where: str, value: Any, detail: str) -> tuple[list[str], str]:
            return [], invalid(where, value, f"ResourceClaimTemplate {template}: {detail}")

        if req.get("firstAvailable"):
            return refuse(at, None, "FirstAvailable device selection is not supported")
        exactly = req.get("exactly")
        if not exactly:
            return refuse(at, None, "Exactly must be set if FirstAvailable is nil")
        mode = exactly.get("allocationMode") or "ExactCount"
        if exactly.get("adminAccess"):
            return refuse(f"{at}.exactly.adminAccess", None, "AdminAccess is not supported")
        if mode == "All":
            return refuse(
                f"{at}.exactly.allocationMode", mode, "AllocationMode 'All' is not supported"
            )
        if mode != "ExactCount":
            return refuse(
                f"{at}.exactly.allocationMode", mode, f"unsupported allocation mode: {mode}"
            )
        if exactly.get("deviceClassName"):
            classes.append(exactly["deviceClassName"])
    return classes, None


def refusal(wl: Obj, template: Callable[[str, str], Obj]) -> Refusal | None:
    """Why the Workload cannot be admitted, or None when it asks for no DRA device.
    ``template(namespace, name)`` reads a ResourceClaimTemplate and raises
    TemplateMissing when it cannot."""
    pod_sets = _pod_sets(wl)
    if any(c.get("resourceClaimName") for ps in pod_sets for c in _claims(ps)):
        return Refusal(CLAIMS_NOT_SUPPORTED, CLAIMS_NOT_SUPPORTED_REQUEUED)
    namespace = (wl.get("metadata") or {}).get("namespace", "")
    for i, ps in enumerate(pod_sets):
        ps_name = ps.get("name", "")
        for j, claim in enumerate(_claims(ps)):
            name = claim.get("resourceClaimTemplateName")
            if not name:
                continue
            path = f"spec.podSets[{i}].template.spec.resourceClaims[{j}]"
            try:
                spec = (template(namespace, name).get("spec") or {}).get("spec") or {}
            except TemplateMissing as exc:
                message = (
                    f"{path}: Internal error: failed to get claim spec for "
                    f"ResourceClaimTemplate {name} in podset {ps_name}: {exc}"
                )
                return Refusal(message, message, retry=True)
            classes, problem = _device_classes(spec, path, name)
            if problem is None and classes:
                mapped = f"DeviceClass {classes[0]} is not mapped in DRA configuration for podset"
                problem = f'{path}.resourceClaimTemplateName: Not found: "{mapped} {ps_name}"'
            if problem is not None:
                return Refusal(problem, problem)
    return None
