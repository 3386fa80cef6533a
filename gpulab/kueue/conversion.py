"""CRD conversion between kueue.x-k8s.io/v1beta1 and v1beta2 (the hub, stored).

Mirrors kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta1/{clusterqueue,localqueue,
workload}_conversion.go; Cohort, AdmissionCheck, ResourceFlavor and
WorkloadPriorityClass have the same schema in both versions. Every function takes and
returns plain dicts and does not change its input. The converters check the type of each
field they read (``spec.flavorFungibility: must be an object``), as upstream's decoder
refuses a field of the wrong type; a malformed request is answered with
``result.status: Failure`` and that one line. An exception escaping a converter is a bug:
the webhook answers it "could not answer", which the fuzz test counts.
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


def _object(parent: Obj, key: str, path: str) -> Obj | None:
    """``parent[key]`` when it is an object, None when absent or null (Go decodes null
    to the zero value); anything else is refused with its field path."""
    value = parent.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConversionError(f"{path}: must be an object")
    return value


def _string(parent: Obj, key: str, path: str) -> str | None:
    value = parent.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ConversionError(f"{path}: must be a string")


def _rename(d: dict[str, Any], old: str, new: str) -> None:
    if old in d:
        value = d.pop(old)
        if value not in (None, ""):
            d[new] = value


# -- ClusterQueue ------------------------------------------------------------------------


def _cq_to_v1beta2(obj: Obj) -> None:
    spec = _object(obj, "spec", "spec")
    if spec:
        _rename(spec, "cohort", "cohortName")
        checks = spec.pop("admissionChecks", None)
        if checks is not None and (
            not isinstance(checks, list) or not all(isinstance(n, str) for n in checks)
        ):
            raise ConversionError("spec.admissionChecks: must be a list of names")
        if checks:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": n} for n in checks]}
        fung = _object(spec, "flavorFungibility", "spec.flavorFungibility")
        if fung:
            # v1beta1's deprecated names for MayStopSearch.
            if fung.get("whenCanBorrow") == "Borrow":
                fung["whenCanBorrow"] = "MayStopSearch"
            if fung.get("whenCanPreempt") == "Preempt":
                fung["whenCanPreempt"] = "MayStopSearch"
    status = _object(obj, "status", "status")
    if status:
        status.pop("pendingWorkloadsStatus", None)


def _cq_to_v1beta1(obj: Obj) -> None:
    spec = _object(obj, "spec", "spec")
    if spec:
        _rename(spec, "cohortName", "cohort")
        spec.pop("concurrentAdmissionPolicy", None)


# -- LocalQueue ----------------------------------------------------------------------------


def _lq_to_v1beta2(obj: Obj) -> None:
    status = _object(obj, "status", "status")
    if status:
        _rename(status, "flavorUsage", "flavorsUsage")
        status.pop("flavors", None)


def _lq_to_v1beta1(obj: Obj) -> None:
    status = _object(obj, "status", "status")
    if status:
        _rename(status, "flavorsUsage", "flavorUsage")


# -- Workload ------------------------------------------------------------------------------


def _wl_to_v1beta2(obj: Obj) -> None:
    spec = _object(obj, "spec", "spec")
    if spec:
        name = _string(spec, "priorityClassName", "spec.priorityClassName")
        source = _string(spec, "priorityClassSource", "spec.priorityClassSource")
        spec.pop("priorityClassName", None)
        spec.pop("priorityClassSource", None)
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
    status = _object(obj, "status", "status")
    if status:
        # v1beta1 spells it with a typo upstream.
        _rename(
            status, "accumulatedPastExexcutionTimeSeconds", "accumulatedPastExecutionTimeSeconds"
        )


def _wl_to_v1beta1(obj: Obj) -> None:
    spec = _object(obj, "spec", "spec")
    if spec:
        ref = _object(spec, "priorityClassRef", "spec.priorityClassRef")
        spec.pop("priorityClassRef", None)
        if ref:
            name = _string(ref, "name", "spec.priorityClassRef.name") or ""
            if ref.get("group") == api.GROUP and ref.get("kind") == "WorkloadPriorityClass":
                spec["priorityClassSource"] = _WPC_SOURCE
                spec["priorityClassName"] = name
            elif ref.get("group") == "scheduling.k8s.io" and ref.get("kind") == "PriorityClass":
                spec["priorityClassSource"] = _POD_PC_SOURCE
                spec["priorityClassName"] = name
        spec.pop("preemptionGates", None)
    status = _object(obj, "status", "status")
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


def _name(obj: Obj) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        return "(no name)"
    namespace = meta.get("namespace") if isinstance(meta, dict) else None
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


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
    if (source, desired_api_version) == (V1BETA1, V1BETA2):
        converter = _TO_V1BETA2[kind]
    elif (source, desired_api_version) == (V1BETA2, V1BETA1):
        converter = _TO_V1BETA1[kind]
    else:
        raise ConversionError(f"cannot convert {kind} from {source!r} to {desired_api_version!r}")
    try:
        converter(out)
    except ConversionError as exc:
        raise ConversionError(f"{kind} {_name(out)}: {exc}") from None
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
