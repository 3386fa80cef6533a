"""The integrations Kueue queues: batch/v1 Jobs, plain Pods, pod groups (and through
them Deployments and StatefulSets). What each one is as a Workload, and how it is
started and stopped. Pure functions on dicts; the reconciler that calls them is
controllers/jobframework.py.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/controller/jobframework/interface.go
(``GenericJob``: ``PodSets``, ``IsSuspended``, ``RunWithPodSetsInfo``,
``RestorePodSetsInfo``, ``Finished``, ``PodsReady``, ``IsActive``),
pkg/controller/jobs/job/job_controller.go, pkg/controller/jobs/pod/pod_controller.go
(single pods and groups named by ``kueue.x-k8s.io/pod-group-name`` with
``kueue.x-k8s.io/pod-group-total-count``; pods held by the scheduling gate
``kueue.x-k8s.io/admission``), and pkg/podset/podset.go (``Merge``: the flavor's
nodeLabels as nodeSelector, its tolerations appended).

Lab difference: a pod group is one pod set (upstream splits it by role hash).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.model import Flavor

Obj = Mapping[str, Any]

JOB = "batch/Job"
POD = "Pod"
POD_GROUP = "PodGroup"


@dataclass(frozen=True)
class Ref:
    """What the job reconciler works on: a Job, a Pod, or a pod group (namespace/name)."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.namespace}/{self.name}"

    @staticmethod
    def parse(key: str) -> Ref:
        kind, _, rest = key.partition(":")
        ns, _, name = rest.partition("/")
        return Ref(kind, ns, name)


def labels(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def annotations(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def queue_name(obj: Obj) -> str:
    return labels(obj).get(api.QUEUE_LABEL, "")


def group_name(pod: Obj) -> str:
    return labels(pod).get(api.POD_GROUP_NAME_LABEL, "")


def ref_for_pod(pod: Obj) -> Ref:
    meta = pod["metadata"]
    group = group_name(pod)
    if group:
        return Ref(POD_GROUP, meta["namespace"], group)
    return Ref(POD, meta["namespace"], meta["name"])


# -- batch/v1 Job ------------------------------------------------------------------------


def pods_count(job: Obj) -> int:
    """parallelism, capped by completions (the API server defaults parallelism to 1)."""
    spec = job.get("spec") or {}
    count = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    if completions is not None and int(completions) < count:
        count = int(completions)
    return count


def _clean_template(template: Obj, drop: Sequence[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(template))
    meta = out.setdefault("metadata", {})
    for label in drop:
        (meta.get("labels") or {}).pop(label, None)
    return out


def job_pod_sets(job: Obj) -> list[dict[str, Any]]:
    template = (job.get("spec") or {}).get("template") or {}
    clean = _clean_template(template, ("controller-uid", "batch.kubernetes.io/controller-uid"))
    return [{"name": api.DEFAULT_POD_SET, "count": pods_count(job), "template": clean}]


def job_finished(job: Obj) -> tuple[bool, bool, str]:
    """(finished, succeeded, message) from the Job's Complete / Failed conditions."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return True, cond["type"] == "Complete", cond.get("message", "")
    return False, True, ""


def job_pods_ready(job: Obj) -> bool:
    """Job.PodsReady: ready + succeeded pods reach the pod count."""
    status = job.get("status") or {}
    return int(status.get("ready") or 0) + int(status.get("succeeded") or 0) >= pods_count(job)


# -- Pods and pod groups ------------------------------------------------------------------


def is_gated(pod: Obj) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == api.ADMISSION_GATE for g in gates)


def pod_phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase", "")


def pod_terminal(pod: Obj) -> bool:
    return pod_phase(pod) in ("Succeeded", "Failed")


def pod_ready(pod: Obj) -> bool:
    if pod_phase(pod) == "Succeeded":
        return True
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def total_count(pod: Obj) -> int | None:
    value = annotations(pod).get(api.POD_GROUP_TOTAL_COUNT)
    if value is None or not value.isdigit():
        return None
    return int(value)


def pod_template(pod: Obj) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    for key in ("nodeName", "schedulingGates"):
        spec.pop(key, None)
    return {
        "metadata": {
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": spec,
    }


def group_pod_sets(pods: Sequence[Obj], count: int) -> list[dict[str, Any]]:
    return [{"name": api.DEFAULT_POD_SET, "count": count, "template": pod_template(pods[0])}]


def group_is_serving(pods: Sequence[Obj]) -> bool:
    return any(annotations(p).get(api.POD_GROUP_SERVING) == "true" for p in pods)


def group_finished(pods: Sequence[Obj], count: int) -> tuple[bool, bool, str]:
    """A batch group finishes when ``count`` pods ended; a serving group (StatefulSet)
    only when all of its pods are gone."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if group_is_serving(pods):
        return (not live and bool(pods)), True, "Pods are gone"
    ended = [p for p in pods if pod_terminal(p)]
    if len(ended) < count:
        return False, True, ""
    failed = sum(1 for p in ended if pod_phase(p) == "Failed")
    if failed:
        return True, False, f"{failed} pods failed"
    return True, True, "Pods succeeded"


# -- running and stopping (RunWithPodSetsInfo / RestorePodSetsInfo) -------------------------


def _merge_flavors(
    pod_spec: Obj,
    flavor_names: Sequence[str],
    flavors: Mapping[str, Flavor],
    updates: Sequence[Obj],
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    selector = dict(pod_spec.get("nodeSelector") or {})
    tolerations = [dict(t) for t in pod_spec.get("tolerations") or []]
    for name in dict.fromkeys(flavor_names):
        flavor = flavors.get(name)
        if flavor is None:
            continue
        selector.update(flavor.node_labels)
        tolerations += [dict(t) for t in flavor.tolerations if dict(t) not in tolerations]
    for update in updates:  # admission check podSetUpdates
        selector.update(update.get("nodeSelector") or {})
        tolerations += [
            dict(t) for t in update.get("tolerations") or [] if dict(t) not in tolerations
        ]
    return selector, tolerations


def admitted_flavors(wl: Obj, pod_set: str = api.DEFAULT_POD_SET) -> list[str]:
    psas = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    for psa in psas:
        if psa.get("name") == pod_set:
            return list((psa.get("flavors") or {}).values())
    return []


def pod_set_updates(wl: Obj, pod_set: str = api.DEFAULT_POD_SET) -> list[Obj]:
    return [
        u
        for check in wlutil.admission_checks(wl)
        for u in check.get("podSetUpdates") or []
        if u.get("name") == pod_set
    ]


def job_start_patch(job: Obj, wl: Obj, flavors: Mapping[str, Flavor]) -> dict[str, Any]:
    """Unsuspend with the admitted flavors' node labels and tolerations merged in."""
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    selector, tolerations = _merge_flavors(
        pod_spec, admitted_flavors(wl), flavors, pod_set_updates(wl)
    )
    spec: dict[str, Any] = {"nodeSelector": selector or None}
    if tolerations:
        spec["tolerations"] = tolerations
    return {"spec": {"suspend": False, "template": {"spec": spec}}}


def job_restore_patch(wl: Obj) -> dict[str, Any]:
    """RestorePodSetsInfo: the pod template's nodeSelector and tolerations as the
    Workload's pod set recorded them, undoing what admission injected."""
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


def pod_ungate(pod: Obj, wl: Obj, flavors: Mapping[str, Flavor]) -> dict[str, Any]:
    """The Pod with the admission gate removed and the flavors' node labels added (a
    gated pod's nodeSelector may still be changed)."""
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    selector, tolerations = _merge_flavors(spec, admitted_flavors(wl), flavors, pod_set_updates(wl))
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != api.ADMISSION_GATE]
    spec["schedulingGates"] = gates or None
    return out


# -- the Workload of a job -----------------------------------------------------------------


def new_workload(
    ref: Ref,
    owners: Sequence[Obj],
    queue: str,
    pod_sets: list[dict[str, Any]],
    priority: int,
    priority_ref: dict[str, str] | None,
) -> dict[str, Any]:
    """The Workload the integration creates (jobframework ``constructWorkload``)."""
    first = owners[0]
    meta = first["metadata"]
    if ref.kind == JOB:
        name = wlutil.workload_name(meta["name"], meta["uid"], "Job", "batch")
        owner_refs = [_owner_ref(first, "batch/v1", "Job", controller=True)]
        annotations_: dict[str, str] = {}
    elif ref.kind == POD:
        name = wlutil.workload_name(meta["name"], meta["uid"], "Pod", "")
        owner_refs = [_owner_ref(first, "v1", "Pod", controller=True)]
        annotations_ = {}
    else:
        name = ref.name
        owner_refs = [_owner_ref(p, "v1", "Pod", controller=False) for p in owners]
        annotations_ = {api.IS_GROUP_WORKLOAD: "true"}
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets, "priority": priority}
    if priority_ref:
        spec["priorityClassRef"] = priority_ref
    body: dict[str, Any] = {
        "apiVersion": api.API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": {api.JOB_UID_LABEL: meta["uid"]},
            "ownerReferences": owner_refs,
        },
        "spec": spec,
    }
    if annotations_:
        body["metadata"]["annotations"] = annotations_
    return body


def _owner_ref(obj: Obj, api_version: str, kind: str, controller: bool) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def priority_of(
    job: Obj,
    pod_spec: Obj,
    workload_priority_classes: Mapping[str, int],
    priority_classes: Mapping[str, int],
) -> tuple[int, dict[str, str] | None]:
    """ExtractPriority: a WorkloadPriorityClass named by the kueue.x-k8s.io/priority-class
    label first, else the pod template's PriorityClass."""
    wpc = labels(job).get(api.PRIORITY_CLASS_LABEL, "")
    if wpc and wpc in workload_priority_classes:
        ref = {"group": api.GROUP, "kind": "WorkloadPriorityClass", "name": wpc}
        return workload_priority_classes[wpc], ref
    pc = pod_spec.get("priorityClassName") or ""
    if pc and pc in priority_classes:
        ref = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": pc}
        return priority_classes[pc], ref
    return int(pod_spec.get("priority") or 0), None


def owned_by(wl: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid for r in (wl.get("metadata") or {}).get("ownerReferences") or [])
