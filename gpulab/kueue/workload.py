"""Workload objects: names, conditions, admission checks, eviction, requeue state.
Pure functions on dicts.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/workload/workload.go (``SetQuotaReservation``,
``UnsetQuotaReservationWithCondition``, ``SetRequeuedCondition``, ``UpdateRequeueState``,
``IsAdmissible``), pkg/workload/admissionchecks.go (``SyncAdmittedCondition``,
``HasAllChecksReady``, the check states a ClusterQueue requires for its flavors),
pkg/workload/evict/evict.go (``SetEvictedCondition``), pkg/workload/finish,
pkg/scheduler/preemption/preemption.go (``preemptionMessage``),
pkg/controller/jobframework/workload_names.go (``GetWorkloadNameForOwnerWithGVK``) and
pkg/cache/queue/unadmitted_workloads.go (``getUnadmittedWorkloadStatus``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, MutableMapping
from typing import Any

from gpulab.kueue import api
from gpulab.kueue.model import condition, condition_true, timestamp

Obj = Mapping[str, Any]

_MAX_PREFIX = 253 - 1 - 5  # name limit minus "-" and the 5-character hash


def workload_name(owner_name: str, owner_uid: str, kind: str, group: str) -> str:
    """``<kind>-<name>-<hash>``: sha1 over Kind, Group, name and UID (the Group is empty
    for core kinds such as Pod)."""
    digest = hashlib.sha1(f"{kind}\n{group}\n{owner_name}\n{owner_uid}".encode()).hexdigest()
    return f"{f'{kind.lower()}-{owner_name}'[:_MAX_PREFIX]}-{digest[:5]}"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- conditions ----------------------------------------------------------------------------


def set_condition(
    obj: MutableMapping[str, Any], ctype: str, status: str, reason: str, message: str, now: str
) -> bool:
    """apimeta.SetStatusCondition: lastTransitionTime only moves when status changes."""
    conds: list[dict[str, Any]] = obj.setdefault("status", {}).setdefault("conditions", [])
    generation = (obj.get("metadata") or {}).get("generation", 0)
    new = {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
        "observedGeneration": generation,
    }
    for i, old in enumerate(conds):
        if old.get("type") != ctype:
            continue
        if old.get("status") == status:
            new["lastTransitionTime"] = old.get("lastTransitionTime", now)
        if all(old.get(k) == v for k, v in new.items()):
            return False
        conds[i] = new
        return True
    conds.append(new)
    return True


def remove_condition(obj: MutableMapping[str, Any], ctype: str) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    kept = [c for c in conds if c.get("type") != ctype]
    if len(kept) == len(conds):
        return False
    obj["status"]["conditions"] = kept
    return True


def _reset_active(obj: MutableMapping[str, Any], ctype: str, reason: str, now: str) -> bool:
    prev = condition(obj, ctype)
    if prev is None or prev.get("status") != "True":
        return False
    return set_condition(obj, ctype, "False", reason, f"Previously: {prev.get('message', '')}", now)


def has_quota_reservation(wl: Obj) -> bool:
    return condition_true(wl, api.QUOTA_RESERVED)


def is_admitted(wl: Obj) -> bool:
    return condition_true(wl, api.ADMITTED)


def is_finished(wl: Obj) -> bool:
    return condition_true(wl, api.FINISHED)


def is_evicted(wl: Obj) -> bool:
    return condition_true(wl, api.EVICTED)


def is_active(wl: Obj) -> bool:
    return (wl.get("spec") or {}).get("active", True) is not False


def is_admissible(wl: Obj) -> bool:
    """IsAdmissible: may wait in a queue."""
    return not is_finished(wl) and is_active(wl) and not has_quota_reservation(wl)


def admission_checks(wl: Obj) -> list[dict[str, Any]]:
    return list((wl.get("status") or {}).get("admissionChecks") or [])


def all_checks_ready(wl: Obj) -> bool:
    return all(c.get("state") == api.CHECK_READY for c in admission_checks(wl))


def has_check_in(wl: Obj, *states: str) -> bool:
    return any(c.get("state") in states for c in admission_checks(wl))


def sync_admitted_condition(wl: MutableMapping[str, Any], now: str, granular: bool) -> bool:
    """SyncAdmittedCondition: Admitted follows QuotaReserved and the check states."""
    reserved = has_quota_reservation(wl)
    checks_ready = all_checks_ready(wl)
    admitted = is_admitted(wl)
    if not granular and admitted == (reserved and checks_ready):
        return False
    if (
        granular
        and condition(wl, api.QUOTA_RESERVED) is None
        and condition(wl, api.ADMITTED) is None
    ):
        return False
    status, reason, message = "True", "Admitted", "The workload is admitted"
    if not reserved and not checks_ready:
        status = "False"
        if granular:
            reason, message = "NoReservation", "The workload has no reservation"
        else:
            reason = "NoReservationUnsatisfiedChecks"
            message = "The workload has no reservation and not all checks ready"
    elif not reserved:
        status, reason, message = "False", "NoReservation", "The workload has no reservation"
    elif not checks_ready:
        status = "False"
        reason = "UnsatisfiedAdmissionChecks" if granular else "UnsatisfiedChecks"
        message = "The workload has not all checks ready"
    if admitted and status == "False":
        old = condition(wl, api.ADMITTED) or {}
        since = timestamp(old.get("lastTransitionTime"))
        if since is not None:
            elapsed = int((timestamp(now) or since) - since)
            st = wl.setdefault("status", {})
            st["accumulatedPastExecutionTimeSeconds"] = (
                st.get("accumulatedPastExecutionTimeSeconds") or 0
            ) + elapsed
    return set_condition(wl, api.ADMITTED, status, reason, message, now)


def set_quota_reservation(
    wl: MutableMapping[str, Any], admission: Obj, now: str, checks_satisfied: bool, granular: bool
) -> None:
    """SetQuotaReservation, then (prepareWorkload) Admitted when every check the
    ClusterQueue requires is there."""
    status = wl.setdefault("status", {})
    status["admission"] = dict(admission)
    cq = admission["clusterQueue"]
    set_condition(
        wl, api.QUOTA_RESERVED, "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cq}", now
    )
    _reset_active(wl, api.EVICTED, "QuotaReserved", now)
    _reset_active(wl, api.PREEMPTED, "QuotaReserved", now)
    if checks_satisfied:
        sync_admitted_condition(wl, now, granular)


def unset_quota_reservation(
    wl: MutableMapping[str, Any], reason: str, message: str, now: str, granular: bool
) -> bool:
    """UnsetQuotaReservationWithCondition."""
    changed = set_condition(wl, api.QUOTA_RESERVED, "False", reason, message, now)
    status = wl.setdefault("status", {})
    if status.get("admission") is not None:
        status["admission"] = None
        changed = True
    return sync_admitted_condition(wl, now, granular) or changed


def set_requeued(
    wl: MutableMapping[str, Any], reason: str, message: str, status: bool, now: str
) -> bool:
    return set_condition(wl, api.REQUEUED, "True" if status else "False", reason, message, now)


def set_evicted(wl: MutableMapping[str, Any], reason: str, message: str, now: str) -> bool:
    return set_condition(wl, api.EVICTED, "True", reason, message, now)


def update_requeue_state(
    wl: MutableMapping[str, Any], base_seconds: int, max_seconds: int, now: float
) -> None:
    """UpdateRequeueState: count + 1 and requeueAt = now + base * 2^(count-1) (capped)."""
    state = wl.setdefault("status", {}).setdefault("requeueState", {}) or {}
    count = int(state.get("count") or 0) + 1
    wait = min(base_seconds * 2 ** (count - 1), max_seconds)
    wl["status"]["requeueState"] = {"count": count, "requeueAt": rfc3339(now + wait)}


def preemption_message(
    preemptor: Obj, reason: str, preemptor_path: str, preemptee_path: str
) -> str:
    """preemption.go preemptionMessage."""
    human = {
        api.IN_CLUSTER_QUEUE: "prioritization in the ClusterQueue",
        api.IN_COHORT_RECLAMATION: "reclamation within the cohort",
        api.IN_COHORT_FAIR_SHARING: "Fair Sharing within the cohort",
        api.IN_COHORT_RECLAIM_WHILE_BORROWING: "reclamation within the cohort while borrowing",
    }.get(reason, "UNKNOWN")
    meta = preemptor.get("metadata") or {}
    uid = meta.get("uid") or "UNKNOWN"
    job_uid = (meta.get("labels") or {}).get(api.JOB_UID_LABEL) or "UNKNOWN"
    return (
        f"Preempted to accommodate a workload (UID: {uid}, JobUID: {job_uid}) due to {human}; "
        f"preemptor path: {preemptor_path or 'UNKNOWN'}; "
        f"preemptee path: {preemptee_path or 'UNKNOWN'}"
    )


def sync_admission_check_states(
    wl: MutableMapping[str, Any], required: list[str], now: str
) -> bool:
    """The check states a Workload must carry: Pending for each one the ClusterQueue
    requires (for its assigned flavors), kept when already there; others dropped."""
    old = {c.get("name"): c for c in admission_checks(wl)}
    new = [
        old.get(name)
        or {"name": name, "state": api.CHECK_PENDING, "lastTransitionTime": now, "message": ""}
        for name in required
    ]
    if [c.get("name") for c in admission_checks(wl)] == required and all(
        old.get(n) is c for n, c in zip(required, new, strict=True)
    ):
        return False
    wl.setdefault("status", {})["admissionChecks"] = new
    return True


def reset_checks_to_pending(wl: MutableMapping[str, Any], now: str) -> bool:
    changed = False
    for c in admission_checks(wl):
        if c.get("state") != api.CHECK_PENDING:
            previously = c.get("state")
            c.update(state=api.CHECK_PENDING, lastTransitionTime=now)
            c["message"] = f"Reset to Pending after eviction. Previously: {previously}"
            changed = True
    if changed:
        wl["status"]["admissionChecks"] = admission_checks(wl)
    return changed


def unadmitted_status(wl: Obj) -> tuple[str, str] | None:
    """getUnadmittedWorkloadStatus: (the Admitted reason, the QuotaReserved reason) of a
    Workload not admitted; None when it is admitted, finished or being deleted."""
    if is_admitted(wl) or is_finished(wl) or (wl.get("metadata") or {}).get("deletionTimestamp"):
        return None
    admitted = condition(wl, api.ADMITTED)
    reason = admitted.get("reason", "") if admitted else "NoReservation"
    reserved = condition(wl, api.QUOTA_RESERVED)
    if reserved is None:
        cause = api.REASON_PENDING_EVALUATION
    else:
        cause = "" if reserved.get("status") == "True" else reserved.get("reason", "")
    return reason, cause


def owned_by_single_pod(wl: Obj) -> bool:
    """OwnedBySinglePod: one owner, a Pod, and not a pod group's Workload."""
    meta = wl.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    if len(refs) != 1 or (meta.get("annotations") or {}).get(api.IS_GROUP_WORKLOAD) == "true":
        return False
    return refs[0].get("kind") == "Pod" and refs[0].get("apiVersion") == "v1"


def owner(wl: Obj) -> Mapping[str, Any] | None:
    for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def flavors_of(wl: Obj) -> set[str]:
    psas = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    return {f for psa in psas for f in (psa.get("flavors") or {}).values()}
