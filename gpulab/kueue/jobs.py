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
``kueue.x-k8s.io/admission``), pkg/podset/podset.go (``FromAssignment``: the flavors'
nodeLabels as nodeSelector and their tolerations; ``Merge``, which refuses a key the
pod template already has with another value; ``RestorePodSpec``),
jobframework/reconciler.go ``getPodSetsInfoFromStatus`` (the labels
``kueue.x-k8s.io/podset``, ``kueue.x-k8s.io/local-queue-name`` and
``kueue.x-k8s.io/cluster-queue-name`` — AssignQueueLabelsForPods, Beta, on — and the
admission checks' ``podSetUpdates``) and ``EquivalentToWorkload`` with
pkg/util/equality (the pod count, containers, init containers and, until admitted,
tolerations decide whether a Job still matches its Workload).

Lab difference: a pod group is one pod set (upstream splits it by role hash).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils.quantity import parse_quantity

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


# the labels the Job controller puts on its pod template (job_controller.go managedLabels)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MANAGED_JOB_LABELS = (
    "job-name",
    "controller-uid",
    JOB_NAME_LABEL,
    "batch.kubernetes.io/controller-uid",
)


def job_pod_sets(job: Obj) -> list[dict[str, Any]]:
    """Job.PodSets: one pod set, the template without the Job controller's labels but
    its job name (cleanLabels)."""
    template = copy.deepcopy(dict((job.get("spec") or {}).get("template") or {}))
    labels = (template.setdefault("metadata", {}).get("labels")) or {}
    for label in MANAGED_JOB_LABELS:
        if label != JOB_NAME_LABEL:
            labels.pop(label, None)
    return [{"name": api.DEFAULT_POD_SET, "count": pods_count(job), "template": template}]


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


class PodSetUpdateError(Exception):
    """podset.ErrInvalidPodSetUpdate: the admission cannot be put on the pod template
    (a key it has with another value). Permanent: the Workload finishes FailedToStart."""


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass
class PodSetInfo:
    """podset.PodSetInfo: what starting a pod set adds to its pod template."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    def merge(
        self, labels: Obj, annotations: Obj, selector: Obj, tolerations: Sequence[Obj]
    ) -> None:
        """PodSetInfo.Merge: add the other's maps, refusing a key with another value."""
        for what, mine, theirs in (
            ("annotations", self.annotations, annotations),
            ("labels", self.labels, labels),
            ("nodeSelector", self.node_selector, selector),
        ):
            for key, value in mine.items():
                if key in theirs and theirs[key] != value:
                    raise PodSetUpdateError(
                        f"invalid admission check PodSetUpdate: conflict for {what}: conflict "
                        f"for key={key}, value1={value}, value2={theirs[key]}"
                    )
        self.annotations.update(annotations)
        self.labels.update(labels)
        self.node_selector.update(selector)
        self.tolerations += [dict(t) for t in tolerations if dict(t) not in self.tolerations]


def pod_set_info(wl: Obj, flavors: Mapping[str, Flavor], pod_set: str) -> PodSetInfo:
    """getPodSetsInfoFromStatus for one pod set of an admitted Workload."""
    info = PodSetInfo(pod_set)
    status = wl.get("status") or {}
    admission = status.get("admission") or {}
    psa = next(
        (p for p in admission.get("podSetAssignments") or [] if p.get("name") == pod_set), {}
    )
    for name in dict.fromkeys((psa.get("flavors") or {}).values()):  # FromAssignment
        flavor = flavors.get(name)
        if flavor is not None:
            info.node_selector.update(flavor.node_labels)
            info.tolerations += [dict(t) for t in flavor.tolerations]
    info.labels[api.PODSET_LABEL] = pod_set
    info.labels[api.LOCAL_QUEUE_LABEL] = (wl.get("spec") or {}).get("queueName", "")
    cq = admission.get("clusterQueue", "")
    if len(cq) <= 63 and _DNS1123_LABEL.match(cq):
        info.labels[api.CLUSTER_QUEUE_LABEL] = cq
    for check in wlutil.admission_checks(wl):
        for update in check.get("podSetUpdates") or []:
            if update.get("name") != pod_set:
                continue
            try:
                info.merge(
                    update.get("labels") or {},
                    update.get("annotations") or {},
                    update.get("nodeSelector") or {},
                    update.get("tolerations") or [],
                )
            except PodSetUpdateError as exc:
                raise PodSetUpdateError(f'in admission check "{check.get("name")}": {exc}') from exc
            break
    return info


def _merged(meta: Obj, spec: Obj, info: PodSetInfo) -> PodSetInfo:
    """podset.Merge: the pod template's own labels, annotations, nodeSelector and
    tolerations with ``info`` added."""
    out = PodSetInfo(
        info.name,
        dict(meta.get("labels") or {}),
        dict(meta.get("annotations") or {}),
        dict(spec.get("nodeSelector") or {}),
        [dict(t) for t in spec.get("tolerations") or []],
    )
    out.merge(info.labels, info.annotations, info.node_selector, info.tolerations)
    return out


def job_start_patch(job: Obj, wl: Obj, flavors: Mapping[str, Flavor]) -> dict[str, Any]:
    """RunWithPodSetsInfo: unsuspend, the admission merged into the pod template."""
    template = (job.get("spec") or {}).get("template") or {}
    merged = _merged(
        template.get("metadata") or {},
        template.get("spec") or {},
        pod_set_info(wl, flavors, api.DEFAULT_POD_SET),
    )
    return {
        "spec": {
            "suspend": False,
            "template": {
                "metadata": {"labels": merged.labels, "annotations": merged.annotations or None},
                "spec": {
                    "nodeSelector": merged.node_selector or None,
                    "tolerations": merged.tolerations or None,
                },
            },
        }
    }


def _replace(current: Obj, target: Obj) -> dict[str, Any] | None:
    """A merge patch turning the map ``current`` into ``target`` (None removes a key)."""
    if not target:
        return None
    return {k: target.get(k) for k in {**current, **target}}


def job_restore_patch(job: Obj, wl: Obj) -> dict[str, Any] | None:
    """RestorePodSetsInfo: the pod template's labels, annotations, nodeSelector and
    tolerations back to what the Workload's pod set recorded (the Job controller's own
    labels kept); None when they already are."""
    pod_sets = (wl.get("spec") or {}).get("podSets") or [{}]
    original = pod_sets[0].get("template") or {}
    meta, spec = original.get("metadata") or {}, original.get("spec") or {}
    template = (job.get("spec") or {}).get("template") or {}
    have_meta, have_spec = template.get("metadata") or {}, template.get("spec") or {}
    labels = dict(meta.get("labels") or {})
    labels.update(
        {k: v for k, v in (have_meta.get("labels") or {}).items() if k in MANAGED_JOB_LABELS}
    )
    want = {
        "labels": labels,
        "annotations": dict(meta.get("annotations") or {}),
        "nodeSelector": dict(spec.get("nodeSelector") or {}),
        "tolerations": list(spec.get("tolerations") or []),
    }
    have = {
        "labels": dict(have_meta.get("labels") or {}),
        "annotations": dict(have_meta.get("annotations") or {}),
        "nodeSelector": dict(have_spec.get("nodeSelector") or {}),
        "tolerations": list(have_spec.get("tolerations") or []),
    }
    if want == have:
        return None
    return {
        "spec": {
            "template": {
                "metadata": {
                    "labels": _replace(have["labels"], want["labels"]),
                    "annotations": _replace(have["annotations"], want["annotations"]),
                },
                "spec": {
                    "nodeSelector": _replace(have["nodeSelector"], want["nodeSelector"]),
                    "tolerations": want["tolerations"] or None,
                },
            }
        }
    }


def pod_ungate(pod: Obj, wl: Obj, flavors: Mapping[str, Flavor]) -> dict[str, Any]:
    """Pod.Run (prepare): the Pod with the admission merged in and the admission gate
    removed (a gated pod's nodeSelector may still be changed)."""
    out = copy.deepcopy(dict(pod))
    meta, spec = out.setdefault("metadata", {}), out.setdefault("spec", {})
    merged = _merged(meta, spec, pod_set_info(wl, flavors, api.DEFAULT_POD_SET))
    meta["labels"] = merged.labels
    if merged.annotations:
        meta["annotations"] = merged.annotations
    if merged.node_selector:
        spec["nodeSelector"] = merged.node_selector
    if merged.tolerations:
        spec["tolerations"] = merged.tolerations
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != api.ADMISSION_GATE]
    spec["schedulingGates"] = gates or None
    return out


# -- does the Job still match its Workload (EquivalentToWorkload) ------------------------------


def _semantic(value: Any) -> Any:
    """equality.Semantic: unset and empty alike."""
    if isinstance(value, Mapping):
        out = {k: _semantic(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [], "")}
    if isinstance(value, list):
        return [_semantic(v) for v in value]
    return value


def _semantic_containers(containers: Any) -> list[Any]:
    """Containers with their resources parsed, so "1" and "1000m" compare equal."""
    out = []
    for c in containers or []:
        c = dict(c)
        res = dict(c.get("resources") or {})
        for which in ("requests", "limits"):
            if which in res:
                res[which] = {k: parse_quantity(v) for k, v in (res[which] or {}).items()}
        c["resources"] = res
        out.append(_semantic(c))
    return out


def _same_pod_sets(a: Sequence[Obj], b: Sequence[Obj], ignore_tolerations: bool) -> bool:
    """ComparePodSetSlices: count, containers, init containers, tolerations."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if int(x.get("count", 1)) != int(y.get("count", 1)):
            return False
        sx = (x.get("template") or {}).get("spec") or {}
        sy = (y.get("template") or {}).get("spec") or {}
        if not ignore_tolerations and _semantic(sx.get("tolerations") or []) != _semantic(
            sy.get("tolerations") or []
        ):
            return False
        for kind in ("initContainers", "containers"):
            if _semantic_containers(sx.get(kind)) != _semantic_containers(sy.get(kind)):
                return False
    return True


def _running_pod_sets(wl: Obj, flavors: Mapping[str, Flavor]) -> list[Obj] | None:
    """expectedRunningPodSets: the pod sets as started (tolerations merged in)."""
    out = []
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        template = ps.get("template") or {}
        try:
            merged = _merged(
                template.get("metadata") or {},
                template.get("spec") or {},
                pod_set_info(wl, flavors, ps.get("name", api.DEFAULT_POD_SET)),
            )
        except PodSetUpdateError:
            return None
        spec = {**(template.get("spec") or {}), "tolerations": merged.tolerations}
        out.append({**ps, "template": {**template, "spec": spec}})
    return out


def job_matches_workload(job: Obj, wl: Obj, flavors: Mapping[str, Flavor]) -> bool:
    """EquivalentToWorkload: the Job's pod sets against the Workload's (against the pod
    sets as started while it holds quota; a suspended Job also against the spec)."""
    want = job_pod_sets(job)
    spec_pod_sets = (wl.get("spec") or {}).get("podSets") or []
    ignore = wlutil.is_admitted(wl)
    running = _running_pod_sets(wl, flavors) if wlutil.has_quota_reservation(wl) else None
    if running is None:
        return _same_pod_sets(want, spec_pod_sets, ignore)
    if _same_pod_sets(want, running, ignore):
        return True
    return bool((job.get("spec") or {}).get("suspend")) and _same_pod_sets(
        want, spec_pod_sets, ignore
    )


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
