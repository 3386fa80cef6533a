"""What the validating webhooks reject, with upstream's field errors. Pure functions.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/webhooks/clusterqueue_webhook.go
(``validateClusterQueueSpec``: resource names, no resource or flavor twice across
resource groups, resources in the order of ``coveredResources``, quotas not negative,
``borrowingLimit``/``lendingLimit`` only with a cohort, ``lendingLimit`` <= nominal,
``preemption``, ``flavorFungibility.preference``, fair-sharing weight, the 256/512
limits), cohort_webhook.go, resourceflavor_webhook.go, workload_webhook.go
(``ValidateWorkload``, ``ValidateWorkloadUpdate``: pod sets immutable while quota is
reserved, the admission immutable, reserved resource "pods"), and
pkg/controller/jobframework/validation.go with job_webhook.go (queue-name a DNS
subdomain and immutable while running, WorkloadPriorityClass label rules) and the pod
webhook's pod-group metadata. Messages are formatted as k8s.io/apimachinery
``field.Error`` prints them; several are joined as ``utilerrors.Aggregate`` does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpulab.kueue import api

Obj = Mapping[str, Any]

_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
IS_NEGATIVE = "must be greater than or equal to 0"
DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
IMMUTABLE = "field is immutable"
RESERVED_FOR_KUEUE = "the key is reserved for internal kueue use"


def _fmt(value: Any) -> str:
    if isinstance(value, Mapping | list):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)[:200]
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {_fmt(value)}: {detail}"


def duplicate(path: str, value: Any) -> str:
    return f"{path}: Duplicate value: {_fmt(value)}"


def required(path: str, detail: str) -> str:
    return f"{path}: Required value: {detail}"


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def not_supported(path: str, value: Any, allowed: Sequence[str]) -> str:
    choices = ", ".join(_fmt(a) for a in allowed)
    return f"{path}: Unsupported value: {_fmt(value)}: supported values: {choices}"


def aggregate(errors: Sequence[str]) -> str:
    return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"


def _label_key_errors(name: str) -> list[str]:
    """content.IsLabelKey: an optional DNS-subdomain prefix and a qualified name."""
    prefix, _, rest = name.rpartition("/")
    errs = []
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        errs.append(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case "
            "alphanumeric characters, '-' or '.', and must start and end with an "
            "alphanumeric character (e.g. 'example.com', regex used for validation is "
            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    if not rest or len(rest) > 63 or not _QUALIFIED.match(rest):
        errs.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character (e.g. 'MyName',  or "
            "'my.name',  or '123-abc', regex used for validation is "
            "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return errs


def _quantity(value: Any) -> Decimal | None:
    """The quantity, or None for what is not one (the CRD schema refuses those first);
    "NaN" and "Infinity" parse as Decimals but are not quantities either."""
    try:
        q = parse_quantity(value)
    except (ValueError, TypeError):
        return None
    return q if q.is_finite() else None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _as_map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# -- ClusterQueue, Cohort ------------------------------------------------------------------


def _resource_groups(
    groups: Any, has_parent: bool, is_cohort: bool, nominal_ge_lending: bool
) -> list[str]:
    errs: list[str] = []
    seen_res: set[str] = set()
    seen_flv: set[str] = set()
    for i, rg in enumerate(_as_list(groups)):
        rg = _as_map(rg)
        path = f"spec.resourceGroups[{i}]"
        covered = [str(r) for r in _as_list(rg.get("coveredResources"))]
        for j, name in enumerate(covered):
            p = f"{path}.coveredResources[{j}]"
            errs += [invalid(p, name, m) for m in _label_key_errors(name)]
            if name in seen_res:
                errs.append(duplicate(p, name))
            seen_res.add(name)
        for j, fq in enumerate(_as_list(rg.get("flavors"))):
            fq = _as_map(fq)
            p = f"{path}.flavors[{j}]"
            for k, rq in enumerate(_as_list(fq.get("resources"))[: len(covered)]):
                rq = _as_map(rq)
                rp = f"{p}.resources[{k}]"
                if rq.get("name") != covered[k]:
                    errs.append(
                        invalid(
                            f"{rp}.name", rq.get("name"), "must match the name in coveredResources"
                        )
                    )
                nominal = _quantity(rq.get("nominalQuota", 0))
                if nominal is not None and nominal < 0:
                    errs.append(
                        invalid(f"{rp}.nominalQuota", str(rq.get("nominalQuota")), IS_NEGATIVE)
                    )
                for limit in ("borrowingLimit", "lendingLimit"):
                    if rq.get(limit) is None:
                        continue
                    q = _quantity(rq[limit])
                    if not has_parent:
                        parent = "parent" if is_cohort else "cohort"
                        errs.append(
                            invalid(
                                f"{rp}.{limit}",
                                str(rq[limit]),
                                f"must be nil when {parent} is empty",
                            )
                        )
                    if q is not None and q < 0:
                        errs.append(invalid(f"{rp}.{limit}", str(rq[limit]), IS_NEGATIVE))
                    if (
                        limit == "lendingLimit"
                        and nominal_ge_lending
                        and q is not None
                        and nominal is not None
                        and q > nominal
                    ):
                        errs.append(
                            invalid(
                                f"{rp}.{limit}",
                                str(rq[limit]),
                                "must be less than or equal to the nominalQuota",
                            )
                        )
            name = fq.get("name")
            if not isinstance(name, str):
                errs.append(invalid(f"{p}.name", name, "must be a string"))
            elif name in seen_flv:
                errs.append(duplicate(f"{p}.name", name))
            else:
                seen_flv.add(name)
    return errs


def _fair_sharing(spec: Obj) -> list[str]:
    weight = _as_map(spec.get("fairSharing")).get("weight")
    if weight is None:
        return []
    q = _quantity(weight)
    if q is None:
        return []
    if q < 0:
        return [invalid("spec.fairSharing", str(weight), IS_NEGATIVE)]
    if 0 < q <= Decimal("1e-9"):
        return [invalid("spec.fairSharing", str(weight), "When not 0, weight must be > 10e-9")]
    return []


def _selector(selector: Any) -> list[str]:
    errs = []
    for i, expr in enumerate(_as_list(_as_map(selector).get("matchExpressions"))):
        expr = _as_map(expr)
        op = expr.get("operator")
        path = f"spec.namespaceSelector.matchExpressions[{i}]"
        if op in ("In", "NotIn") and not expr.get("values"):
            errs.append(
                required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
        if op in ("Exists", "DoesNotExist") and expr.get("values"):
            errs.append(
                forbidden(
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    return errs


def validate_cluster_queue(cq: Obj, old: Obj | None = None) -> list[str]:
    spec = _as_map(cq.get("spec"))
    groups = _as_list(spec.get("resourceGroups"))
    errs = _resource_groups(groups, bool(spec.get("cohortName")), False, True)
    errs += _selector(spec.get("namespaceSelector"))
    preemption = _as_map(spec.get("preemption"))
    bwc = _as_map(preemption.get("borrowWithinCohort"))
    if (
        preemption.get("reclaimWithinCohort", api.NEVER) == api.NEVER
        and bwc.get("policy", api.NEVER) != api.NEVER
    ):
        errs.append(
            invalid(
                "spec.preemption",
                dict(preemption),
                "reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never",
            )
        )
    fung = _as_map(spec.get("flavorFungibility"))
    pref = fung.get("preference")
    if pref is not None and (
        fung.get("whenCanBorrow", api.MAY_STOP_SEARCH) != api.TRY_NEXT_FLAVOR
        or fung.get("whenCanPreempt", api.TRY_NEXT_FLAVOR) != api.TRY_NEXT_FLAVOR
    ):
        errs.append(
            invalid(
                "spec.flavorFungibility.preference",
                pref,
                f'preference "{pref}" requires both whenCanBorrow and whenCanPreempt '
                "to be TryNextFlavor",
            )
        )
    errs += _fair_sharing(spec)
    flavors = sum(len(_as_list(_as_map(rg).get("flavors"))) for rg in groups)
    if flavors > 256:
        errs.append(
            invalid(
                "spec.resourceGroups",
                flavors,
                f"total number of flavors across all resourceGroups must be ≤ 256, got {flavors}",
            )
        )
    covered = sum(len(_as_list(_as_map(rg).get("coveredResources"))) for rg in groups)
    if covered > 256:
        errs.append(
            invalid(
                "spec.resourceGroups",
                covered,
                "total number of covered resources across all resourceGroups must be "
                f"≤ 256, got {covered}",
            )
        )
    all_flavors = [
        _as_map(f).get("name") for rg in groups for f in _as_list(_as_map(rg).get("flavors"))
    ]
    for i, rule in enumerate(
        _as_list(_as_map(spec.get("admissionChecksStrategy")).get("admissionChecks"))
    ):
        for j, flavor in enumerate(_as_list(_as_map(rule).get("onFlavors"))):
            if flavor not in all_flavors:
                path = f"spec.admissionChecksStrategy.admissionChecks[{i}].onFlavors[{j}]"
                errs.append(not_supported(path, flavor, [str(f) for f in all_flavors]))
    return errs


def validate_cohort(cohort: Obj, old: Obj | None = None) -> list[str]:
    spec = _as_map(cohort.get("spec"))
    errs = _fair_sharing(spec)
    return errs + _resource_groups(
        spec.get("resourceGroups"), bool(spec.get("parentName")), True, False
    )


def validate_resource_flavor(rf: Obj, old: Obj | None = None) -> list[str]:
    spec = _as_map(rf.get("spec"))
    errs = []
    for key in _as_map(spec.get("nodeLabels")):
        errs += [invalid("spec.nodeLabels", key, m) for m in _label_key_errors(str(key))]
    seen: dict[str, set[str]] = {}
    for i, taint in enumerate(_as_list(spec.get("nodeTaints"))):
        taint = _as_map(taint)
        key, effect = str(taint.get("key", "")), str(taint.get("effect", ""))
        errs += [invalid(f"spec.nodeTaints[{i}].key", key, m) for m in _label_key_errors(key)]
        if key in seen.get(effect, set()):
            errs.append(
                duplicate(f"spec.nodeTaints[{i}]", f"{key}={taint.get('value', '')}:{effect}")
                + ": taints must be unique by key and effect pair"
            )
        seen.setdefault(effect, set()).add(key)
    return errs


# -- Workload -----------------------------------------------------------------------------------


def _containers_reserve_pods(ps: Obj, path: str) -> list[str]:
    spec = _as_map(_as_map(ps.get("template")).get("spec"))
    errs = []
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(_as_list(spec.get(kind))):
            res = _as_map(_as_map(c).get("resources"))
            for which in ("requests", "limits"):
                values = _as_map(res.get(which))
                p = f"{path}.template.spec.{kind}[{i}].resources.{which}"
                if api.PODS in values:
                    errs.append(invalid(f"{p}[{api.PODS}]", api.PODS, RESERVED_FOR_KUEUE))
                for name, value in values.items():
                    q = _quantity(value)
                    if q is not None and q < 0:
                        errs.append(invalid(f"{p}[{name}]", str(value), IS_NEGATIVE))
    return errs


def _has_reservation(wl: Obj) -> bool:
    return any(
        _as_map(c).get("type") == api.QUOTA_RESERVED and _as_map(c).get("status") == "True"
        for c in _as_list(_as_map(wl.get("status")).get("conditions"))
    )


def validate_workload(wl: Obj, old: Obj | None = None) -> list[str]:
    spec = _as_map(wl.get("spec"))
    status = _as_map(wl.get("status"))
    pod_sets = _as_list(spec.get("podSets"))
    errs: list[str] = []
    for i, ps in enumerate(pod_sets):
        errs += _containers_reserve_pods(_as_map(ps), f"spec.podSets[{i}]")
    names = [_as_map(ps).get("name", api.DEFAULT_POD_SET) for ps in pod_sets]
    if _has_reservation(wl):
        admission = status.get("admission")
        if admission is None:
            errs.append(
                required(
                    "status.admission", "must be set while the QuotaReserved condition is true"
                )
            )
        for i, psa in enumerate(_as_list(_as_map(admission).get("podSetAssignments"))):
            psa = _as_map(psa)
            if psa.get("name") not in names:
                errs.append(
                    f"status.admission.podSetAssignments[{i}].name: "
                    f"Not found: {_fmt(psa.get('name'))}"
                )
    for i, name in enumerate(names):
        if not isinstance(name, str):
            errs.append(invalid(f"spec.podSets[{i}].name", name, "must be a string"))
    counts = {
        name: _as_map(ps).get("count", 1)
        for name, ps in zip(names, pod_sets, strict=True)
        if isinstance(name, str)
    }
    for rp in _as_list(status.get("reclaimablePods")):
        rp = _as_map(rp)
        path = f"status.reclaimablePods[{rp.get('name')}]"
        if rp.get("name") not in counts:
            errs.append(not_supported(f"{path}.name", rp.get("name"), [str(n) for n in names]))
        elif (
            isinstance(rp.get("count"), int)
            and isinstance(counts[rp.get("name")], int)
            and rp["count"] > counts[rp["name"]]
        ):
            errs.append(
                invalid(
                    f"{path}.count", rp["count"], f"should be less or equal to {counts[rp['name']]}"
                )
            )
    if old is not None:
        if _has_reservation(old) and _as_list(_as_map(old.get("spec")).get("podSets")) != pod_sets:
            errs.append(invalid("spec.podSets", pod_sets, IMMUTABLE))
        old_admission = _as_map(old.get("status")).get("admission")
        if old_admission and status.get("admission") and old_admission != status.get("admission"):
            errs.append(invalid("status.admission", status.get("admission"), IMMUTABLE))
    return errs


# -- jobs (jobframework/validation.go) ------------------------------------------------------------


def _labels(obj: Obj) -> Mapping[str, Any]:
    return _as_map(_as_map(obj.get("metadata")).get("labels"))


def _annotations(obj: Obj) -> Mapping[str, Any]:
    return _as_map(_as_map(obj.get("metadata")).get("annotations"))


def validate_queue_name(obj: Obj) -> list[str]:
    value = _labels(obj).get(api.QUEUE_LABEL)
    if value is None:
        return []
    if not isinstance(value, str) or len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        return [
            invalid(
                f"metadata.labels[{api.QUEUE_LABEL}]",
                value,
                DNS1123_SUBDOMAIN_MESSAGE,
            )
        ]
    return []


UNSUPPORTED_LABELS = {
    "kueue.x-k8s.io/max-exec-time-seconds": "maximum execution time",
    "kueue.x-k8s.io/prebuilt-workload-name": "prebuilt Workloads",
}
UNSUPPORTED_ANNOTATIONS = {
    api.JOB_MIN_PARALLELISM: "partial admission",
    "kueue.x-k8s.io/elastic-job": "elastic jobs",
    "kueue.x-k8s.io/podset-required-topology": "topology-aware scheduling",
    "kueue.x-k8s.io/podset-preferred-topology": "topology-aware scheduling",
}


def validate_job_create(job: Obj) -> list[str]:
    errs = validate_queue_name(job)
    for key, what in UNSUPPORTED_LABELS.items():
        if key in _labels(job):
            errs.append(
                forbidden(f"metadata.labels[{key}]", f"{what} is not supported by the lab's Kueue")
            )
    for key, what in UNSUPPORTED_ANNOTATIONS.items():
        if key in _annotations(job):
            errs.append(
                forbidden(
                    f"metadata.annotations[{key}]", f"{what} is not supported by the lab's Kueue"
                )
            )
    return errs


def _suspended(job: Obj) -> bool:
    return bool(_as_map(job.get("spec")).get("suspend"))


def validate_job_update(
    old: Obj, new: Obj, default_queue_exists: bool, suspended: bool | None = None
) -> list[str]:
    errs = validate_job_create(new)
    running = not (_suspended(new) if suspended is None else suspended)
    path = f"metadata.labels[{api.QUEUE_LABEL}]"
    old_q, new_q = _labels(old).get(api.QUEUE_LABEL, ""), _labels(new).get(api.QUEUE_LABEL, "")
    if running and old_q != new_q:
        errs.append(invalid(path, new_q, IMMUTABLE))
    if not new_q and old_q and default_queue_exists:
        errs.append(
            invalid(path, "", "queue-name must not be empty in namespace with default queue")
        )
    wpc_path = f"metadata.labels[{api.PRIORITY_CLASS_LABEL}]"
    old_p, new_p = (
        _labels(old).get(api.PRIORITY_CLASS_LABEL, ""),
        _labels(new).get(api.PRIORITY_CLASS_LABEL, ""),
    )
    if running and not old_p and new_p:
        errs.append(
            invalid(
                wpc_path, new_p, "WorkloadPriorityClass cannot be added to a non-suspended workload"
            )
        )
    if not new_p and old_p:
        errs.append(
            invalid(wpc_path, new_p, "WorkloadPriorityClass cannot be removed from a workload")
        )
    return errs


def validate_pod(pod: Obj, old: Obj | None = None) -> list[str]:
    errs = validate_job_create(pod) if old is None else []
    managed = _labels(pod).get(api.MANAGED_LABEL)
    if managed is not None and managed != "true":
        errs.append(
            forbidden(
                f"metadata.labels[{api.MANAGED_LABEL}]", "managed label value can only be 'true'"
            )
        )
    group = _labels(pod).get(api.POD_GROUP_NAME_LABEL, "")
    total = _annotations(pod).get(api.POD_GROUP_TOTAL_COUNT)
    detail = (
        f"both the '{api.POD_GROUP_TOTAL_COUNT}' annotation and the "
        f"'{api.POD_GROUP_NAME_LABEL}' label should be set"
    )
    if not group and total is not None:
        errs.append(required(f"metadata.labels[{api.POD_GROUP_NAME_LABEL}]", detail))
    elif group and total is None:
        errs.append(required(f"metadata.annotations[{api.POD_GROUP_TOTAL_COUNT}]", detail))
    elif (
        group
        and total is not None
        and not (isinstance(total, str) and total.isdigit() and int(total) > 0)
    ):
        errs.append(
            invalid(
                f"metadata.annotations[{api.POD_GROUP_TOTAL_COUNT}]",
                total,
                "must be a positive integer",
            )
        )
    if group and (len(group) > 253 or not _DNS1123_SUBDOMAIN.match(group)):
        errs.append(
            invalid(
                f"metadata.labels[{api.POD_GROUP_NAME_LABEL}]",
                group,
                "a lowercase RFC 1123 subdomain",
            )
        )
    if old is not None:
        old_group = _labels(old).get(api.POD_GROUP_NAME_LABEL, "")
        if old_group and old_group != group:
            errs.append(invalid(f"metadata.labels[{api.POD_GROUP_NAME_LABEL}]", group, IMMUTABLE))
    return errs
