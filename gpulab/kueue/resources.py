"""A Workload's resources as the scheduler counts and checks them: LimitRange defaults
and limits standing in for missing requests (``AdjustResources``), then the checks that
make a Workload ``Misconfigured`` instead of admitted. Pure functions on dicts.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/workload/resources.go (``AdjustResources``:
``handlePodLimitRange``, ``handleLimitsToRequests``; ``ValidateResources``: no request
above its limit; ``ValidateLimitRange``) and pkg/util/limitrange/limitrange.go
(``Summarize`` across the namespace's LimitRanges, ``ValidatePodSpec``: a container's
requests and limits within the Container range, the pod's total within the Pod range).
Messages as upstream's field errors.

Lab difference: a pod's RuntimeClass overhead is not added (``handlePodOverhead``).
A LimitRange change requeues nothing, as upstream: the Workload is tried again on its
next event.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpulab.kueue.model import pod_requests
from gpulab.kueue.validation import aggregate, invalid

Obj = Mapping[str, Any]
Quantities = dict[str, Decimal]

ABOVE_LIMIT = "requests must not exceed its limits"
ABOVE_MAX = "requests must not be above the limitRange max"
BELOW_MIN = "requests must not be below the limitRange min"
INVALID_RESOURCES = "resources validation failed"
LIMIT_RANGE_UNSATISFIED = "resources didn't satisfy LimitRange constraints"


def _quantities(values: Any) -> Quantities:
    return {k: parse_quantity(v) for k, v in (values or {}).items()}


def _merge(a: Quantities, b: Quantities, keep: Callable[[Decimal, Decimal], Decimal]) -> Quantities:
    """mergeResourceList: every key of both, ``keep`` deciding between two values."""
    out = dict(a)
    for k, v in b.items():
        out[k] = keep(out[k], v) if k in out else v
    return out


def _keep_first(a: Quantities, b: Quantities) -> Quantities:
    return _merge(a, b, lambda x, _y: x)


def _greater_keys(a: Quantities, b: Quantities) -> list[str]:
    """GreaterKeys: the resources of both where ``a`` is larger, sorted."""
    return sorted(k for k, v in a.items() if k in b and v > b[k])


# -- LimitRange summary (limitrange.go) ------------------------------------------------------


Summary = dict[str, dict[str, Quantities]]  # limit type -> max|min|default|defaultRequest


def summarize(limit_ranges: Iterable[Obj]) -> Summary:
    """Summarize: the tightest max and min, the first default and defaultRequest."""
    out: Summary = {}
    for lr in limit_ranges:
        for item in (lr.get("spec") or {}).get("limits") or []:
            s = out.setdefault(item.get("type", ""), {})
            s["max"] = _merge(s.get("max", {}), _quantities(item.get("max")), min)
            s["min"] = _merge(s.get("min", {}), _quantities(item.get("min")), max)
            for key in ("default", "defaultRequest"):
                s[key] = _keep_first(s.get(key, {}), _quantities(item.get(key)))
    return out


def _pod_specs(wl: Obj) -> list[tuple[str, Obj]]:
    return [
        (f"spec.podSets[{i}].template.spec", (ps.get("template") or {}).get("spec") or {})
        for i, ps in enumerate((wl.get("spec") or {}).get("podSets") or [])
    ]


def _containers(spec: Obj) -> list[tuple[str, int, Obj]]:
    return [
        (kind, i, c)
        for kind in ("initContainers", "containers")
        for i, c in enumerate(spec.get(kind) or [])
    ]


# -- AdjustResources ---------------------------------------------------------------------------


def _serialized(values: Quantities) -> dict[str, str]:
    return {k: f"{v.normalize():f}" for k, v in values.items()}


def _adjust(res: dict[str, Any], limit_range: Mapping[str, Quantities] | None) -> None:
    """One container's (or the pod's) resources: the range's defaults where unset, then
    the limits as requests where those are unset."""
    limits, requests = _quantities(res.get("limits")), _quantities(res.get("requests"))
    if limit_range is not None:
        limits = _keep_first(limits, limit_range["default"])
        requests = _keep_first(requests, limit_range["defaultRequest"])
    requests = _keep_first(requests, limits)
    if limits:
        res["limits"] = _serialized(limits)
    if requests:
        res["requests"] = _serialized(requests)


def adjust_resources(wl: Obj, limit_ranges: Sequence[Obj]) -> dict[str, Any]:
    """A copy of the Workload with the LimitRange defaults filled in and limits used as
    missing requests, as the scheduler sees it (without a LimitRange the Workload itself:
    model.pod_requests already counts a missing request as its limit)."""
    if not limit_ranges:
        return dict(wl)
    out = copy.deepcopy(dict(wl))
    summary = summarize(limit_ranges)
    for _path, spec in _pod_specs(out):
        for _kind, _i, c in _containers(spec):
            _adjust(c.setdefault("resources", {}), summary.get("Container"))
        if isinstance(spec.get("resources"), dict):
            _adjust(spec["resources"], summary.get("Pod"))
    return out


# -- the checks (ValidateAdmissibility after the namespace) -------------------------------------


def validate_resources(wl: Obj) -> list[str]:
    """ValidateResources: no container (or pod) requests more than its limit."""
    errs = []
    for path, spec in _pod_specs(wl):
        for kind, i, c in _containers(spec):
            res = c.get("resources") or {}
            names = _greater_keys(_quantities(res.get("requests")), _quantities(res.get("limits")))
            if names:
                errs.append(invalid(f"{path}.{kind}[{i}]", names, ABOVE_LIMIT))
        pod_res = spec.get("resources") or {}
        names = _greater_keys(
            _quantities(pod_res.get("requests")), _quantities(pod_res.get("limits"))
        )
        if names:
            errs.append(invalid(f"{path}.resources", names, ABOVE_LIMIT))
    return errs


def validate_limit_range(wl: Obj, limit_ranges: Sequence[Obj]) -> list[str]:
    """ValidateLimitRange: containers within the Container range, the pod within the
    Pod range."""
    if not limit_ranges:
        return []
    summary = summarize(limit_ranges)
    errs = []
    for path, spec in _pod_specs(wl):
        container_range = summary.get("Container")
        for kind, i, c in _containers(spec) if container_range is not None else ():
            res = c.get("resources") or {}
            requests, limits = _quantities(res.get("requests")), _quantities(res.get("limits"))
            c_min, c_max = _merge(requests, limits, min), _merge(requests, limits, max)
            if names := _greater_keys(c_max, container_range["max"]):
                errs.append(invalid(f"{path}.{kind}[{i}]", names, ABOVE_MAX))
            if names := _greater_keys(container_range["min"], c_min):
                errs.append(invalid(f"{path}.{kind}[{i}]", names, BELOW_MIN))
        pod_range = summary.get("Pod")
        if pod_range is not None:
            total = pod_requests(spec)
            if names := _greater_keys(total, pod_range["max"]):
                errs.append(invalid(path, names, ABOVE_MAX))
            if names := _greater_keys(pod_range["min"], total):
                errs.append(invalid(path, names, BELOW_MIN))
    return errs


def admissibility_error(wl: Obj, limit_ranges: Sequence[Obj]) -> str | None:
    """The Misconfigured message of ``ValidateAdmissibility``'s resource checks, or None."""
    if errs := validate_resources(wl):
        return f"{INVALID_RESOURCES}: {aggregate(errs)}"
    if errs := validate_limit_range(wl, limit_ranges):
        return f"{LIMIT_RANGE_UNSATISFIED}: {aggregate(errs)}"
    return None
