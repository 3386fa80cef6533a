"""The PodGroup controller: a PodGroup for every plain pod Volcano is asked to schedule.

Mirrors volcano-sh/volcano v1.15.1 ``pkg/controllers/podgroup`` (``pg_controller.go``,
``pg_controller_handler.go``): a pod added with ``schedulerName: volcano`` (the
``--scheduler-name`` list) and no ``scheduling.k8s.io/group-name`` annotation - a bare
Pod, a Deployment's, a StatefulSet's, a batch Job's - gets a PodGroup named
``podgroup-<uid of its controlling owner, or its own>`` (``helpers.GeneratePodgroupName``)
with ``minMember`` 1 - or the owner's ``scheduling.volcano.sh/group-min-member`` annotation
(``--inherit-owner-annotations``, on) - ``minResources`` its quota usage times minMember,
its ``priorityClassName``, the queue its ``scheduling.volcano.sh/queue-name`` annotation
names, the owner's ``volcano.sh/*`` annotations and the pod's preemptable / cooldown /
revocable-zone / JDB keys, owned by the pod's owners (or the pod), phase Pending; then the
pod is annotated with the group's name, which is what lets vc-scheduler see it. A
ReplicaSet or StatefulSet scaled to 0 loses its PodGroup; one that is added or updated
with replicas (a rolling update) updates it from its first pod that has none yet
(``createOrUpdateNormalPodPG``). Workers: ``--worker-threads-for-podgroup`` (5).

Lab differences: the network-topology annotations are not read; pods are found in the
controller's own pod store for ReplicaSets too (upstream lists them from the API); the lab
traces ``CreatePodGroup`` as an Event on the pod.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.informer import PODS, Handlers, Informer, ListWatch, Resource, key_of
from gpulab.trace import ObjectRef, Tracer
from gpulab.volcano import apis
from gpulab.volcano.controllers.job.helpers import calc_task_requests
from gpulab.workqueue import WorkQueue, run_worker

_log = logging.getLogger(__name__)

Obj = dict[str, Any]
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet")
PODGROUP_NAME_PREFIX = "podgroup-"  # batch/v1alpha1 PodgroupNamePrefix
GROUP_MIN_MEMBER = f"{apis.SCHEDULING_GROUP}/group-min-member"
QUEUE_NAME_ANNOTATION = f"{apis.SCHEDULING_GROUP}/queue-name"
ANNOTATION_PREFIX = "volcano.sh/"  # AnnotationPrefix: what a PodGroup inherits from owners
COOLDOWN_TIME = "volcano.sh/cooldown-time"
REVOCABLE_ZONE = "volcano.sh/revocable-zone"
JDB_MIN_AVAILABLE = "volcano.sh/jdb-min-available"
JDB_MAX_UNAVAILABLE = "volcano.sh/jdb-max-unavailable"
REVISION_HASH = "controller-revision-hash"


def pod_group_name(pod: Mapping[str, Any]) -> str:
    """GeneratePodgroupName: ``podgroup-`` + the controlling owner's uid, else the pod's."""
    meta = pod.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return PODGROUP_NAME_PREFIX + str(ref.get("uid"))
    return PODGROUP_NAME_PREFIX + str(meta.get("uid"))


def min_member(owner_annotations: Mapping[str, str]) -> int:
    """getMinMemberFromUpperRes: the owners' group-min-member, 1 if absent or invalid."""
    raw = owner_annotations.get(GROUP_MIN_MEMBER)
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        _log.error("Failed to convert minMemberAnnotation %r of Pod owners into number", raw)
        return 1
    return value if value >= 0 else 1


def owner_references(pod: Mapping[str, Any]) -> list[Obj]:
    """newPGOwnerReferences: the pod's owners if one controls it, else the pod itself."""
    meta = pod.get("metadata") or {}
    refs = list(meta.get("ownerReferences") or [])
    if any(r.get("controller") for r in refs):
        return refs
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def build_pod_group(
    pod: Mapping[str, Any], owner_annotations: Mapping[str, str], inherit: bool = True
) -> Obj:
    """buildPodGroupFromPod."""
    meta = pod.get("metadata") or {}
    pod_ann = meta.get("annotations") or {}
    pod_labels = meta.get("labels") or {}
    members = min_member(owner_annotations) if inherit else 1
    annotations: dict[str, str] = {}
    if inherit:
        annotations.update(
            {k: v for k, v in owner_annotations.items() if k.startswith(ANNOTATION_PREFIX)}
        )
    for key in (apis.POD_PREEMPTABLE, COOLDOWN_TIME, REVOCABLE_ZONE):
        if key in pod_ann:
            annotations[key] = pod_ann[key]
    if JDB_MIN_AVAILABLE in pod_ann:
        annotations[JDB_MIN_AVAILABLE] = pod_ann[JDB_MIN_AVAILABLE]
    elif JDB_MAX_UNAVAILABLE in pod_ann:
        annotations[JDB_MAX_UNAVAILABLE] = pod_ann[JDB_MAX_UNAVAILABLE]
    labels = {k: pod_labels[k] for k in (apis.POD_PREEMPTABLE, COOLDOWN_TIME) if k in pod_labels}
    spec: Obj = {
        "minMember": members,
        "minResources": calc_task_requests(pod, members),
    }
    if (pod.get("spec") or {}).get("priorityClassName"):
        spec["priorityClassName"] = pod["spec"]["priorityClassName"]
    if QUEUE_NAME_ANNOTATION in pod_ann:
        spec["queue"] = pod_ann[QUEUE_NAME_ANNOTATION]
    return {
        "apiVersion": f"{apis.SCHEDULING_GROUP}/{apis.SCHEDULING_VERSION}",
        "kind": "PodGroup",
        "metadata": {
            "name": pod_group_name(pod),
            "namespace": meta.get("namespace"),
            "ownerReferences": owner_references(pod),
            "annotations": annotations,
            "labels": labels,
        },
        "spec": spec,
        "status": {"phase": apis.PG_PENDING},
    }


def changed(pg: Mapping[str, Any], wanted: Mapping[str, Any]) -> Obj | None:
    """shouldUpdateExistingPodGroup: the PodGroup to write, or None when it is current.
    The queue defaulted by the API server counts as the same."""
    meta, new_meta = pg.get("metadata") or {}, wanted["metadata"]
    spec = dict(wanted["spec"])
    spec.setdefault("queue", (pg.get("spec") or {}).get("queue"))
    same = (
        {k: v for k, v in (pg.get("spec") or {}).items() if v not in (None, "", {})}
        == {k: v for k, v in spec.items() if v not in (None, "", {})}
        and (meta.get("labels") or {}) == new_meta["labels"]
        and (meta.get("annotations") or {}) == new_meta["annotations"]
    )
    if same:
        return None
    body = dict(pg)
    body["spec"] = spec
    body["metadata"] = {
        **meta,
        "labels": new_meta["labels"],
        "annotations": new_meta["annotations"],
    }
    return body


class PodGroupController:
    def __init__(
        self,
        api: client.ApiClient,
        tracer: Tracer,
        scheduler_names: tuple[str, ...] = (apis.DEFAULT_SCHEDULER_NAME,),
        workers: int = 5,
        inherit_owner_annotations: bool = True,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.tracer = tracer
        self.scheduler_names = scheduler_names
        self.workers = max(1, workers)
        self.inherit = inherit_owner_annotations
        self.queue = WorkQueue()
        self.pods = Informer(
            ListWatch(api, PODS), Handlers(self._pod_added), name="informer-pg-pods"
        )
        self.podgroups = Informer(ListWatch(api, apis.PODGROUPS), name="informer-pg-podgroups")
        self.replicasets = Informer(
            ListWatch(api, REPLICASETS),
            Handlers(self._owner_changed, lambda _old, new: self._owner_changed(new)),
            name="informer-pg-replicasets",
        )
        self.statefulsets = Informer(
            ListWatch(api, STATEFULSETS),
            Handlers(self._owner_changed, lambda _old, new: self._owner_changed(new)),
            name="informer-pg-statefulsets",
        )
        self._informers = [self.pods, self.podgroups, self.replicasets, self.statefulsets]

    # ---------------------------------------------------------------- handlers

    def _pod_added(self, pod: Obj) -> None:
        self.queue.add(key_of(pod))

    def _owner_changed(self, owner: Obj) -> None:
        """addReplicaSet / addStatefulSet (and their updates): handlers only enqueue."""
        self.queue.add(f"{owner['kind']}:{key_of(owner)}")

    # ---------------------------------------------------------------- processNextReq

    def reconcile(self, key: str) -> float | None:
        kind, sep, owner_key = key.partition(":")
        if sep:
            self._sync_owner(kind, owner_key)
            return None
        pod = self.pods.store.get(key)
        if pod is None:
            return None
        if not self._ours(pod) or apis.group_name_of(pod):
            return None
        self._ensure(pod, update=False)
        return None

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") in self.scheduler_names

    def _sync_owner(self, kind: str, key: str) -> None:
        store = self.replicasets if kind == "ReplicaSet" else self.statefulsets
        owner = store.store.get(key)
        if owner is None:
            return
        meta, spec = owner["metadata"], owner.get("spec") or {}
        if int(spec.get("replicas") if spec.get("replicas") is not None else 1) == 0:
            name = PODGROUP_NAME_PREFIX + str(meta.get("uid"))
            try:
                self.custom.delete_namespaced_custom_object(
                    apis.SCHEDULING_GROUP,
                    apis.SCHEDULING_VERSION,
                    meta["namespace"],
                    "podgroups",
                    name,
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
            return
        wanted = dict((spec.get("selector") or {}).get("matchLabels") or {})
        if kind == "StatefulSet":
            wanted[REVISION_HASH] = (owner.get("status") or {}).get("updateRevision") or ""
        pods = [
            p
            for p in self.pods.store.list()
            if p["metadata"].get("namespace") == meta["namespace"]
            and wanted.items() <= ((p["metadata"].get("labels") or {}).items())
        ]
        if not pods:
            return
        first = min(pods, key=lambda p: p["metadata"]["name"])
        if self._ours(first) and not apis.group_name_of(first):
            self._ensure(first, update=True)

    # ---------------------------------------------------------------- createNormalPodPGIfNotExist

    def owner_annotations(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """getAnnotationsFromUpperRes: the annotations of the pod's ReplicaSet, DaemonSet,
        StatefulSet or batch Job owners (the first owner's value wins)."""
        out: dict[str, str] = {}
        ns = pod["metadata"].get("namespace")
        read = {
            "ReplicaSet": self.apps.read_namespaced_replica_set,
            "DaemonSet": self.apps.read_namespaced_daemon_set,
            "StatefulSet": self.apps.read_namespaced_stateful_set,
            "Job": self.batch.read_namespaced_job,
        }
        for ref in pod["metadata"].get("ownerReferences") or []:
            reader = read.get(str(ref.get("kind")))
            if reader is None or not ref.get("name"):
                continue
            try:
                owner = reader(ref["name"], ns)
            except ApiException as exc:
                _log.error(
                    "Failed to get upper %s for Pod <%s/%s>: %s",
                    ref["kind"],
                    ns,
                    ref["name"],
                    exc.reason,
                )
                continue
            for k, v in (owner.metadata.annotations or {}).items():
                out.setdefault(k, v)
        return out

    def _ensure(self, pod: Obj, update: bool) -> None:
        ns = pod["metadata"]["namespace"]
        owners = self.owner_annotations(pod) if self.inherit else {}
        wanted = build_pod_group(pod, owners, self.inherit)
        name = wanted["metadata"]["name"]
        existing = self.podgroups.store.get(f"{ns}/{name}")
        if existing is None:
            try:
                self.custom.create_namespaced_custom_object(
                    apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, ns, "podgroups", wanted
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise
            else:
                self.tracer.step(
                    "CreatePodGroup",
                    ObjectRef("Pod", pod["metadata"]["name"], ns, pod["metadata"].get("uid")),
                    f"PodGroup {name}: minMember {wanted['spec']['minMember']}, queue "
                    f"{wanted['spec'].get('queue') or apis.DEFAULT_QUEUE}",
                )
        elif update:
            body = changed(existing, wanted)
            if body is not None:
                self.custom.replace_namespaced_custom_object(
                    apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, ns, "podgroups", name, body
                )
        self._annotate(pod, name)

    def _annotate(self, pod: Obj, name: str) -> None:
        """updatePodAnnotations: a strategic merge patch of the group-name annotation."""
        meta = pod["metadata"]
        if apis.group_name_of(pod):
            if apis.group_name_of(pod) != name:
                _log.error(
                    "normal pod %s/%s annotations %s value is not %s, but %s",
                    meta["namespace"],
                    meta["name"],
                    apis.KUBE_GROUP_NAME_ANNOTATION,
                    name,
                    apis.group_name_of(pod),
                )
            return
        patch = {"metadata": {"annotations": {apis.KUBE_GROUP_NAME_ANNOTATION: name}}}
        self.core.patch_namespaced_pod(meta["name"], meta["namespace"], patch)

    # ---------------------------------------------------------------- run

    def run(self, stop: threading.Event) -> None:
        for informer in self._informers:
            informer.start()
        for informer in self._informers:
            informer.wait_for_sync(60)
        for i in range(self.workers):
            name = f"pg-controller-{i}"
            threading.Thread(
                target=run_worker, args=(self.queue, self.reconcile, name), name=name, daemon=True
            ).start()
        stop.wait()
        self.queue.shutdown()
        for informer in self._informers:
            informer.stop()

    def has_synced(self) -> bool:
        return all(i.has_synced() for i in self._informers)
