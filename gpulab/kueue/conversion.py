"""CRD conversion between kueue.x-k8s.io/v1beta1 and v1beta2 (the hub, stored).

Mirrors kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta1/{clusterqueue,localqueue,
workload}_conversion.go; Cohort, AdmissionCheck, ResourceFlavor and
WorkloadPriorityClass have the same schema in both versions. Every function takes and
returns plain dicts and does not change its input; a malformed request is answered with
``result.status: Failure`` and a message, never an exception.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from gpulab.kueue import api

Obj = dict[str, Any]

V1BETA1 = f"{api.GROUP}/{api.OLD_VERSION}"
V1BETA2 = api.API_VERSION

# v1beta1 spells this status field with a typo upstream.
_OLD_EXEC_TIME = "accumulatedPastExexcutionTimeSeconds"
_EXEC_TIME = "accumulatedPastExecutionTimeSeconds"
_WPC_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
_POD_PC_SOURCE = "scheduling.k8s.io/priorityclass"


class ConversionError(ValueError):
    pass


def _rename(d: dict[str, Any], old: str, new: str) -> None:
    if old in d:
        value = d.pop(old)
        if value not in (None, ""):
            d[new] = value


# -- ClusterQueue ------------------------------------------------------------------------


def _cq_to_v1beta2(obj: Obj) -> None:
    spec = obj.get("spec")
    if spec:
        _rename(spec, "cohort", "cohortName")
        checks = spec.pop("admissionChecks", None)
        if checks:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": n} for n in checks]}
        fung = spec.get("flavorFungibility")
        if fung:
            # v1beta1's deprecated names for MayStopSearch.
            if fung.get("whenCanBorrow") == "Borrow":
                fung["whenCanBorrow"] = "MayStopSearch"
            if fung.get("whenCanPreempt") == "Preempt":
                fung["whenCanPreempt"] = "MayStopSearch"
    (obj.get("status") or {}).pop("pendingWorkloadsStatus", None)


def _cq_to_v1beta1(obj: Obj) -> None:
    spec = obj.get("spec")
    if spec:
        _rename(spec, "cohortName", "cohort")
        spec.pop("concurrentAdmissionPolicy", None)


# -- LocalQueue ----------------------------------------------------------------------------


def _lq_to_v1beta2(obj: Obj) -> None:
    status = obj.get("status")
    if status:
        _rename(status, "flavorUsage", "flavorsUsage")
        status.pop("flavors", None)


def _lq_to_v1beta1(obj: Obj) -> None:
    status = obj.get("status")
    if status:
        _rename(status, "flavorsUsage", "flavorUsage")


# -- Workload ------------------------------------------------------------------------------


def _wl_to_v1beta2(obj: Obj) -> None:
    spec = obj.get("spec")
    if spec:
        name = spec.pop("priorityClassName", None)
        source = spec.pop("priorityClassSource", None)
        if name and source == _WPC_SOURCE:
            spec["priorityClassRef"] = {
                "group": api.GROUP,
                "kind": "WorkloadPriorityClass",
                "name": name,
            }
        elif name and source == _POD_PC_SOURCE:
            spec["priorityClassRef"] = {
                "group": "scheduling.k8s.io",
                "kind": "PriorityClass",
                "name": name,
            }
    status = obj.get("status")
    if status:
        # v1beta1 spells it with a typo upstream.
        _rename(
            status, "accumulatedPastExexcutionTimeSeconds", "accumulatedPastExecutionTimeSeconds"
        )


def _wl_to_v1beta1(obj: Obj) -> None:
    spec = obj.get("spec")
    if spec:
        ref = spec.pop("priorityClassRef", None)
        if ref:
            if ref.get("group") == api.GROUP and ref.get("kind") == "WorkloadPriorityClass":
                spec["priorityClassSource"] = _WPC_SOURCE
                spec["priorityClassName"] = ref.get("name", "")
            elif ref.get("group") == "scheduling.k8s.io" and ref.get("kind") == "PriorityClass":
                spec["priorityClassSource"] = _POD_PC_SOURCE
                spec["priorityClassName"] = ref.get("name", "")
        spec.pop("preemptionGates", None)
    status = obj.get("status")
    if status:
        _rename(
            status, "accumulatedPastExecutionTimeSeconds", "accumulatedPastExexcutionTimeSeconds"
        )
        status.pop("preemptionGates", None)


def _same(obj: Obj) -> None:
    """Kinds whose v1beta1 and v1beta2 schemas are the same for this lab."""


_TO_V1BETA2: Mapping[str, Callable[[Obj], None]] = {
    "ClusterQueue": _cq_to_v1beta2,
    "LocalQueue": _lq_to_v1beta2,
    "Workload": _wl_to_v1beta2,
    "ResourceFlavor": _same,
    "Cohort": _same,
    "AdmissionCheck": _same,
    "WorkloadPriorityClass": _same,
}
_TO_V1BETA1: Mapping[str, Callable[[Obj], None]] = {
    "ClusterQueue": _cq_to_v1beta1,
    "LocalQueue": _lq_to_v1beta1,
    "Workload": _wl_to_v1beta1,
    "ResourceFlavor": _same,
    "Cohort": _same,
    "AdmissionCheck": _same,
    "WorkloadPriorityClass": _same,
}


def convert(obj: Any, desired_api_version: str) -> Obj:
    """One object converted to ``desired_api_version`` (v1beta1 <-> v1beta2)."""
    if not isinstance(obj, Mapping):
        raise ConversionError("every object must be a JSON object")
    kind = obj.get("kind", "")
    source = obj.get("apiVersion", "")
    if not isinstance(kind, str) or not isinstance(source, str):
        raise ConversionError("apiVersion and kind must be strings")
    out = copy.deepcopy(dict(obj))
    if source == desired_api_version:
        return out
    if kind not in _TO_V1BETA2:
        raise ConversionError(f"unsupported kind {kind!r}")
    try:
        if (source, desired_api_version) == (V1BETA1, V1BETA2):
            _TO_V1BETA2[kind](out)
        elif (source, desired_api_version) == (V1BETA2, V1BETA1):
            _TO_V1BETA1[kind](out)
        else:
            raise ConversionError(
                f"cannot convert {kind} from {source!r} to {desired_api_version!r}"
            )
    except (AttributeError, TypeError) as exc:
        raise ConversionError(f"malformed {kind}: {exc}") from exc
    out["apiVersion"] = desired_api_version
    return out


def review(body: Mapping[str, Any]) -> dict[str, Any]:
    """Answer a ConversionReview (apiextensions.k8s.io/v1)."""
    request = body.get("request")
    uid = request.get("uid") if isinstance(request, Mapping) else None
    response: dict[str, Any] = {"uid": uid if isinstance(uid, str) else ""}
    try:
        if not isinstance(request, Mapping):
            raise ConversionError("request is missing")
        desired = request.get("desiredAPIVersion")
        if not desired or not isinstance(desired, str):
            raise ConversionError("request.desiredAPIVersion is required")
        objects = request.get("objects") or []
        if not isinstance(objects, list):
            raise ConversionError("request.objects must be a list")
        response["convertedObjects"] = [convert(o, desired) for o in objects]
        response["result"] = {"status": "Success"}
    except ConversionError as exc:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": str(exc)}
    except RecursionError:
        response["convertedObjects"] = []
        response["result"] = {"status": "Failure", "message": "an object nests too deeply"}
    version = body.get("apiVersion")
    return {
        "apiVersion": version if isinstance(version, str) else "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": response,
    }
