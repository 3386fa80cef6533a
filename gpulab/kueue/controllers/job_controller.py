"""The batch/v1 Job integration: one Workload per Job; the Job runs only while its
Workload is admitted.

Mirrors pkg/controller/jobframework/reconciler.go ReconcileGenericJob with
pkg/controller/jobs/job/job_controller.go: create the Workload (owned by the Job),
unsuspend with the assigned flavors' nodeSelector and tolerations once admitted,
suspend again a Job that runs without admission, stop an evicted Job (restoring its
pod template) and then release the Workload's quota, and declare the Workload
Finished when the Job completes or fails.
"""

from __future__ import annotations

import copy
import enum
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.controllers.client import JOBS, WORKLOADS, KubeClient, is_conflict
from gpulab.kueue.controllers.store import Store
from gpulab.kueue.model import Flavor, condition
from gpulab.trace import ObjectRef, Tracer

_log = logging.getLogger("gpulab.kueue.job")

Obj = dict[str, Any]


class JobStep(enum.Enum):
    IGNORE = "ignore"  # no queue-name label: not Kueue's Job
    NOTHING = "nothing"
    CREATE_WORKLOAD = "create-workload"
    FINISH_WORKLOAD = "finish-workload"
    STOP_EVICTED = "stop-evicted"
    UNSUSPEND = "unsuspend"
    SUSPEND_NOT_ADMITTED = "suspend-not-admitted"


def job_step(job: Mapping[str, Any], wl: Mapping[str, Any] | None) -> JobStep:
    """What the reconciler does next for a Job and its Workload (in upstream's order)."""
    if not wlutil.queue_name(job):
        return JobStep.IGNORE
    if wl is not None and wlutil.is_finished(wl):
        return JobStep.NOTHING
    if wlutil.job_finished(job)[0]:
        return JobStep.FINISH_WORKLOAD if wl is not None else JobStep.NOTHING
    if wl is None:
        return JobStep.CREATE_WORKLOAD
    if wlutil.is_evicted(wl):
        return JobStep.STOP_EVICTED
    if wlutil.job_suspended(job):
        return JobStep.UNSUSPEND if wlutil.is_admitted(wl) else JobStep.NOTHING
    if not wlutil.is_admitted(wl):
        return JobStep.SUSPEND_NOT_ADMITTED
    return JobStep.NOTHING


class JobReconciler:
    def __init__(
        self, kube: KubeClient, store: Store, flavors: Mapping[str, Flavor], tracer: Tracer
    ) -> None:
        self._kube = kube
        self._store = store
        self._flavors = flavors
        self._tracer = tracer

    def reconcile(self, key: str) -> None:
        job = self._store.jobs.get(key)
        if job is None:
            return  # the garbage collector deletes the owned Workload
        wl = self._store.workload_for_job(job)
        step = job_step(job, wl)
        if step in (JobStep.IGNORE, JobStep.NOTHING):
            return
        try:
            if step is JobStep.CREATE_WORKLOAD:
                self._create_workload(job)
            elif wl is not None and step is JobStep.FINISH_WORKLOAD:
                self._finish(job, wl)
            elif wl is not None and step is JobStep.STOP_EVICTED:
                self._stop_evicted(job, wl)
            elif wl is not None and step is JobStep.UNSUSPEND:
                self._unsuspend(job, wl)
            elif step is JobStep.SUSPEND_NOT_ADMITTED:
                self._suspend(job, "Not admitted by cluster queue")
        except ApiException as exc:
            # The watch brings the fresh object and the Job is reconciled again.
            level = logging.DEBUG if is_conflict(exc) else logging.WARNING
            _log.log(level, "job %s %s: %s %s", key, step.value, exc.status, exc.reason)

    def _job_ref(self, job: Obj) -> ObjectRef:
        return ObjectRef.of({**job, "apiVersion": "batch/v1", "kind": "Job"})

    def _priority(self, job: Obj) -> tuple[int, str]:
        pod_spec = job["spec"]["template"].get("spec") or {}
        name = pod_spec.get("priorityClassName") or ""
        if name:
            value = self._kube.priority_class_value(name)
            if value is not None:
                return value, name
        return int(pod_spec.get("priority") or 0), ""

    def _create_workload(self, job: Obj) -> None:
        priority, pc = self._priority(job)
        body = wlutil.workload_for_job(job, priority, pc)
        try:
            created = self._kube.create(WORKLOADS, body)
        except ApiException as exc:
            if exc.status != 409:  # AlreadyExists: the watch has not delivered it yet
                raise
            return
        self._store.put(WORKLOADS, created)
        self._tracer.step(
            "Reconcile",
            ObjectRef.of(created),
            f"created Workload for Job {job['metadata']['name']} in LocalQueue "
            f"{wlutil.queue_name(job)}",
            priority=priority,
        )
        if not wlutil.job_suspended(job):
            self._suspend(job, "Not admitted by cluster queue")

    def _suspend(self, job: Obj, why: str) -> None:
        updated = self._kube.patch(JOBS, job, {"spec": {"suspend": True}})
        self._store.put(JOBS, updated)
        self._tracer.step("Stop", self._job_ref(job), f"Job suspended: {why}", warning=True)

    def _finish(self, job: Obj, wl: Obj) -> None:
        _, succeeded, message = wlutil.job_finished(job)
        reason = api.FINISHED_SUCCEEDED if succeeded else api.FINISHED_FAILED
        new = copy.deepcopy(wl)
        text = message or f"Job {reason.lower()}"
        wlutil.set_condition(new, api.FINISHED, "True", reason, text, wlutil.now_rfc3339())
        self._store.put(WORKLOADS, self._kube.replace_status(WORKLOADS, new))
        self._tracer.step("Finish", ObjectRef.of(wl), f"Workload finished: {reason}: {text}")

    def _unsuspend(self, job: Obj, wl: Obj) -> None:
        patch = wlutil.admitted_template_patch(job, wl, self._flavors)
        patch["spec"]["suspend"] = False
        self._store.put(JOBS, self._kube.patch(JOBS, job, patch))
        cq = wl["status"]["admission"]["clusterQueue"]
        selector = patch["spec"]["template"]["spec"]["nodeSelector"]
        self._tracer.step(
            "Unsuspend",
            self._job_ref(job),
            f"Admitted by clusterQueue {cq}",
            nodeSelector=selector,
        )

    def _stop_evicted(self, job: Obj, wl: Obj) -> None:
        evicted = condition(wl, api.EVICTED) or {}
        message = evicted.get("message", "")
        if not wlutil.job_suspended(job):
            job = self._kube.patch(JOBS, job, {"spec": {"suspend": True}})
            self._tracer.step("Evict", self._job_ref(job), f"Job suspended: {message}")
        # The pod template may only change on a suspended Job that has no startTime.
        if (job.get("status") or {}).get("startTime"):
            job = self._kube.patch_status(JOBS, job, {"status": {"startTime": None}})
        restore = wlutil.restore_template_patch(wl)
        want = restore["spec"]["template"]["spec"]
        have = job["spec"]["template"].get("spec") or {}
        if any((have.get(k) or None) != want[k] for k in want):
            job = self._kube.patch(JOBS, job, restore)
        self._store.put(JOBS, job)
        if wlutil.has_quota_reservation(wl) and not wlutil.job_active(job):
            new = copy.deepcopy(wl)
            now = wlutil.now_rfc3339()
            requeued = "True" if evicted.get("reason") == api.EVICTED_BY_PREEMPTION else "False"
            wlutil.set_condition(
                new, api.REQUEUED, requeued, evicted.get("reason") or api.EVICTED, message, now
            )
            wlutil.unset_quota_reservation(new, api.REASON_PENDING_EVALUATION, message, now)
            self._store.put(WORKLOADS, self._kube.replace_status(WORKLOADS, new))
            self._tracer.step(
                "Evict", ObjectRef.of(wl), "Job stopped; quota reservation released", reason=message
            )
