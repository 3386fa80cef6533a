"""The PodGroup controller: a group's status follows its pods.

Mirrors scheduler-plugins v0.35.4-devel ``pkg/controllers/podgroup_controller.go``
(``PodGroupReconciler.Reconcile``, run by ``cmd/controller``):

    ""          -> Pending
    Pending     -> Scheduling once at least minMember pods exist (occupiedBy: the first
                   pod's owners)
    otherwise   running/succeeded/failed counted from the pods; fewer pods than
                minMember -> Pending; running+succeeded < minMember -> Scheduling,
                >= minMember -> Running; any failed while failed+running+succeeded >=
                minMember -> Failed; succeeded >= minMember -> Finished
    Finished and Failed are final. A group stuck Pending/Scheduling with nothing running
    48 h after creation gets a Warning "Timeout" Event and is left alone.

:func:`next_status` is the pure decision; :class:`PodGroupController` is the I/O around
it (informers on PodGroups and on pods carrying the pod-group label, a work queue,
status through the status subresource, a ``Reconcile`` trace step per change).

Lab differences: pods are listed in the PodGroup's namespace (upstream lists the label
across all namespaces); a PodGroup without ``minMember`` (0: every pod would pass
alone) gets a Warning Event "MinMemberNotSet" - a lab addition; ``minMember`` 0 or
negative written explicitly is refused by the CRD's validation before it gets here.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.informer import PODS, Handlers, Informer, ListWatch, key_of
from gpulab.schedulerplugins.apis import (
    FAILED,
    FINISHED,
    GROUP,
    PENDING,
    POD_GROUP_LABEL,
    PODGROUPS,
    RUNNING,
    SCHEDULING,
    VERSION,
    min_member,
    pod_group_label,
    timestamp,
)
from gpulab.trace import ObjectRef, Tracer
from gpulab.workqueue import WorkQueue, run_worker

Obj = Mapping[str, Any]
COMPONENT = "podgroup-controller"
TIMEOUT = 48 * 3600.0


def pod_stats(pods: Sequence[Obj]) -> tuple[int, int, int]:
    """(running, succeeded, failed) by pod phase."""
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    return phases.count("Running"), phases.count("Succeeded"), phases.count("Failed")


def occupied_by(pod: Obj) -> str:
    """fillOccupiedObj: ``namespace/owner`` of each owner of the pod, sorted, joined."""
    meta = pod.get("metadata") or {}
    refs = sorted(
        f"{meta.get('namespace')}/{o.get('name')}" for o in meta.get("ownerReferences") or []
    )
    return ",".join(refs)


def timed_out(pg: Obj) -> bool:
    """Pending/Scheduling with nothing running, scheduling started 48 h after creation."""
    status = pg.get("status") or {}
    if status.get("phase") not in (PENDING, SCHEDULING) or status.get("running"):
        return False
    started = timestamp(status.get("scheduleStartTime"))
    created = timestamp((pg.get("metadata") or {}).get("creationTimestamp"))
    return started is not None and created is not None and started - created > TIMEOUT


def next_status(pg: Obj, pods: Sequence[Obj]) -> dict[str, Any]:
    """The PodGroup's status after looking at its pods (Reconcile, pure)."""
    status = dict(pg.get("status") or {})
    phase = status.get("phase") or ""
    want = min_member(pg)
    if phase in (FINISHED, FAILED):
        return status
    if phase == "":
        status["phase"] = PENDING
    elif phase == PENDING:
        if len(pods) >= want:
            status["phase"] = SCHEDULING
            if pods and occupied_by(pods[0]):
                status["occupiedBy"] = occupied_by(pods[0])
    else:
        running, succeeded, failed = pod_stats(pods)
        status.update(running=running, succeeded=succeeded, failed=failed)
        if len(pods) < want:
            status["phase"] = PENDING
            return status
        if succeeded + running < want:
            status["phase"] = SCHEDULING
        if succeeded + running >= want:
            status["phase"] = RUNNING
        if failed and failed + running + succeeded >= want:
            status["phase"] = FAILED
        if succeeded >= want:
            status["phase"] = FINISHED
    return status


class PodGroupController:
    """Informers + a work queue + Reconcile, one key (namespace/name) at a time."""

    def __init__(self, api: client.ApiClient, tracer: Tracer) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.tracer = tracer
        self.queue = WorkQueue()
        self.podgroups = Informer(
            ListWatch(api, PODGROUPS),
            Handlers(self._enqueue, lambda _o, n: self._enqueue(n), None),
            resync=30.0,
            name="informer-podgroups",
        )
        self.pods = Informer(
            ListWatch(api, PODS, label_selector=POD_GROUP_LABEL),
            Handlers(
                self._enqueue_group, lambda _o, n: self._enqueue_group(n), self._enqueue_group
            ),
            name="informer-pods",
        )
        self._warned: set[str] = set()

    def _enqueue(self, pg: Obj) -> None:
        self.queue.add(key_of(pg))

    def _enqueue_group(self, pod: Obj) -> None:
        name = pod_group_label(pod)
        if name:
            self.queue.add(f"{(pod.get('metadata') or {}).get('namespace')}/{name}")

    def pods_of(self, namespace: str, name: str) -> list[Obj]:
        return [
            p
            for p in self.pods.store.list()
            if (p.get("metadata") or {}).get("namespace") == namespace
            and pod_group_label(p) == name
        ]

    def Reconcile(self, key: str) -> float | None:
        pg = self.podgroups.store.get(key)
        if pg is None:
            return None  # deleted
        ref = ObjectRef.of({"kind": "PodGroup", "apiVersion": f"{GROUP}/{VERSION}", **pg})
        if min_member(pg) < 1 and key not in self._warned:
            self._warned.add(key)
            self.tracer.step(
                "MinMemberNotSet",
                ref,
                "spec.minMember is not set: every pod of this group is scheduled on its own; "
                "set minMember >= 1 for all-or-nothing",
                warning=True,
            )
        if timed_out(pg):
            self.tracer.step("Timeout", ref, "schedule time longer than 48 hours", warning=True)
            return None
        namespace, name = key.split("/", 1)
        old = dict(pg.get("status") or {})
        new = next_status(pg, self.pods_of(namespace, name))
        if new == old:
            return None
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PODGROUPS.plural,
                name,
                {"status": new},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        self.tracer.step(
            "Reconcile",
            ref,
            f"phase {old.get('phase') or '-'} -> {new['phase']} "
            f"(running {new.get('running', 0)}, succeeded {new.get('succeeded', 0)}, "
            f"failed {new.get('failed', 0)}, minMember {min_member(pg)})",
            phase=new["phase"],
        )
        return None

    def run(self, stop: threading.Event) -> None:
        self.podgroups.start()
        self.pods.start()
        for inf in (self.podgroups, self.pods):
            inf.wait_for_sync(60)
        worker = threading.Thread(
            target=run_worker, args=(self.queue, self.Reconcile, COMPONENT), daemon=True
        )
        worker.start()
        self.tracer.step("Run", None, "reconciling PodGroups")
        stop.wait()
        self.queue.shutdown()
        self.podgroups.stop()
        self.pods.stop()
