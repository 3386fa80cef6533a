"""Workload objects: built from a batch/v1 Job, their conditions, and what admission
injects into the Job's pod template.

Mirrors pkg/controller/jobs/job/job_controller.go (PodSets, podsCount, Finished,
RunWithPodSetsInfo / RestorePodSetsInfo), pkg/controller/jobframework/workload_names.go
(GetWorkloadNameForOwnerWithGVK) and pkg/workload/workload.go (SetQuotaReservation,
UnsetQuotaReservationWithCondition, SyncAdmittedCondition) and evict/evict.go.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
from collections.abc import Mapping, MutableMapping
from typing import Any

from gpulab.kueue import api
from gpulab.kueue.model import Flavor, condition, condition_true

Obj = Mapping[str, Any]

_MAX_PREFIX = 253 - 1 - 5  # name limit minus "-" and the 5-character hash


def workload_name_for_job(job_name: str, job_uid: str) -> str:
    """``job-<name>-<hash>``: the hash is sha1 over Kind, Group, name and UID."""
    digest = hashlib.sha1(f"Job\nbatch\n{job_name}\n{job_uid}".encode()).hexdigest()
    return f"{f'job-{job_name}'[:_MAX_PREFIX]}-{digest[:5]}"


def pods_count(job: Obj) -> int:
    """parallelism, capped by completions (the API server defaults parallelism to 1)."""
    spec = job.get("spec") or {}
    count = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    if completions is not None and int(completions) < count:
        count = int(completions)
    return count


def queue_name(job: Obj) -> str:
    return ((job.get("metadata") or {}).get("labels") or {}).get(api.QUEUE_LABEL, "")


def workload_for_job(job: Obj, priority: int = 0, priority_class: str = "") -> dict[str, Any]:
    """The Workload the Job integration creates for a Job, owned by the Job."""
    meta = job["metadata"]
    template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    tmeta = template.setdefault("metadata", {})
    # The Job controller's own pod labels are not part of the pod set (cleanLabels).
    for label in ("controller-uid", "batch.kubernetes.io/controller-uid"):
        (tmeta.get("labels") or {}).pop(label, None)
    spec: dict[str, Any] = {
        "queueName": queue_name(job),
        "podSets": [{"name": api.DEFAULT_POD_SET, "count": pods_count(job), "template": template}],
        "priority": priority,
    }
    if priority_class:
        spec["priorityClassRef"] = {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": priority_class,
        }
    return {
        "apiVersion": api.API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name_for_job(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "labels": {api.JOB_UID_LABEL: meta["uid"]},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def owner_job_uid(wl: Obj) -> str | None:
    for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("apiVersion", "").startswith("batch/"):
            return ref.get("uid")
    return None


# -- conditions ----------------------------------------------------------------------


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def _reset_active(obj: MutableMapping[str, Any], ctype: str, reason: str, now: str) -> None:
    prev = condition(obj, ctype)
    if prev is not None and prev.get("status") == "True":
        set_condition(obj, ctype, "False", reason, f"Previously: {prev.get('message', '')}", now)


def set_quota_reservation(wl: MutableMapping[str, Any], admission: Obj, now: str) -> None:
    """Record admission; without admission checks, Admitted follows QuotaReserved."""
    status = wl.setdefault("status", {})
    status["admission"] = dict(admission)
    cq = admission["clusterQueue"]
    set_condition(
        wl, api.QUOTA_RESERVED, "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cq}", now
    )
    _reset_active(wl, api.EVICTED, "QuotaReserved", now)
    _reset_active(wl, api.PREEMPTED, "QuotaReserved", now)
    set_condition(wl, api.ADMITTED, "True", "Admitted", "The workload is admitted", now)


def unset_quota_reservation(
    wl: MutableMapping[str, Any], reason: str, message: str, now: str
) -> bool:
    """QuotaReserved=False with why; clears the admission and the Admitted condition."""
    changed = set_condition(wl, api.QUOTA_RESERVED, "False", reason, message, now)
    status = wl.setdefault("status", {})
    if status.get("admission") is not None:
        status["admission"] = None
        changed = True
    if condition_true(wl, api.ADMITTED):
        set_condition(
            wl, api.ADMITTED, "False", "NoReservation", "The workload has no reservation", now
        )
        changed = True
    return changed


def set_evicted(wl: MutableMapping[str, Any], reason: str, message: str, now: str) -> None:
    set_condition(wl, api.EVICTED, "True", reason, message, now)


def has_quota_reservation(wl: Obj) -> bool:
    return bool((wl.get("status") or {}).get("admission")) and condition_true(
        wl, api.QUOTA_RESERVED
    )


def is_admitted(wl: Obj) -> bool:
    return condition_true(wl, api.ADMITTED) and bool((wl.get("status") or {}).get("admission"))


def is_finished(wl: Obj) -> bool:
    return condition_true(wl, api.FINISHED)


def is_evicted(wl: Obj) -> bool:
    return condition_true(wl, api.EVICTED)


def preemption_message(preemptor: Obj, reason: str, preemptor_cq: str, preemptee_cq: str) -> str:
    """preemption.go preemptionMessage."""
    human = {
        api.IN_CLUSTER_QUEUE: "prioritization in the ClusterQueue",
        api.IN_COHORT_RECLAMATION: "reclamation within the cohort",
    }.get(reason, "UNKNOWN")
    meta = preemptor.get("metadata") or {}
    uid = meta.get("uid") or "UNKNOWN"
    job_uid = (meta.get("labels") or {}).get(api.JOB_UID_LABEL) or "UNKNOWN"
    return (
        f"Preempted to accommodate a workload (UID: {uid}, JobUID: {job_uid}) due to {human}; "
        f"preemptor path: {preemptor_cq or 'UNKNOWN'}; preemptee path: {preemptee_cq or 'UNKNOWN'}"
    )


# -- Jobs ------------------------------------------------------------------------------


def job_finished(job: Obj) -> tuple[bool, bool, str]:
    """(finished, succeeded, message) from the Job's Complete / Failed conditions."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return True, cond["type"] == "Complete", cond.get("message", "")
    return False, True, ""


def job_suspended(job: Obj) -> bool:
    return bool((job.get("spec") or {}).get("suspend"))


def job_active(job: Obj) -> bool:
    return bool((job.get("status") or {}).get("active"))


def admitted_template_patch(job: Obj, wl: Obj, flavors: Mapping[str, Flavor]) -> dict[str, Any]:
    """spec.template changes for an admitted Job: the assigned flavors' nodeLabels as
    nodeSelector and their tolerations appended (podset.Merge)."""
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    selector = dict(pod_spec.get("nodeSelector") or {})
    tolerations = list(pod_spec.get("tolerations") or [])
    assignments = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    for psa in assignments:
        for flavor_name in dict.fromkeys((psa.get("flavors") or {}).values()):
            flavor = flavors.get(flavor_name)
            if flavor is None:
                continue
            selector.update(flavor.node_labels)
            tolerations += [t for t in flavor.tolerations if t not in tolerations]
    spec: dict[str, Any] = {"nodeSelector": selector or None}
    if tolerations:
        spec["tolerations"] = tolerations
    return {"spec": {"template": {"spec": spec}}}


def restore_template_patch(wl: Obj) -> dict[str, Any]:
    """Put back the pod template's nodeSelector and tolerations from the Workload's
    pod set (RestorePodSetsInfo), undoing what admission injected."""
    pod_sets = (wl.get("spec") or {}).get("podSets") or [{}]
    original = ((pod_sets[0].get("template") or {}).get("spec")) or {}
    return {
        "spec": {
            "template": {
                "spec": {
                    "nodeSelector": original.get("nodeSelector") or None,
                    "tolerations": original.get("tolerations") or None,
                }
            }
        }
    }


def condition_status(obj: Obj, ctype: str) -> str | None:
    cond = condition(obj, ctype)
    return None if cond is None else cond.get("status")
