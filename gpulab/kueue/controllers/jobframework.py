"""The job reconciler shared by every integration: one Workload per job; the job runs
only while its Workload is admitted.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/controller/jobframework/reconciler.go
``ReconcileGenericJob``, in its order: ``ensureOneWorkload`` compares a Job with its
Workload on every reconcile (``EquivalentToWorkload``: pod count, containers) and, when
they differ, rewrites the Workload of a suspended Job that holds no quota
(``updateWorkloadToMatchJob``) or else stops a running Job and deletes the Workload,
so a new one is created and queued (raising ``parallelism`` on a running Job cannot
escape quota); a finished job finishes its Workload; a job without a Workload gets one
(``handleJobWithNoWorkload``, owned by the job, suspended if it was not); with
waitForPodsReady the PodsReady condition follows the pods
(``generatePodsReadyCondition``); an evicted Workload's job is stopped (``stopJob``)
and, once nothing runs, the quota reservation is released and Requeued set (False for
a single pod's Workload: SkipReassignmentForPodOwnedWorkloads); a suspended job whose
Workload is admitted is started (``startJob``: unsuspend, or remove the pods'
scheduling gate, with the flavors' node labels, the podset and queue labels and the
admission checks' podSetUpdates; a template that conflicts finishes the Workload
``FailedToStart``); a suspended job relabelled to another LocalQueue moves its
Workload there (``handleQueueNameChange``); a running job without admission is
stopped. Plain pods and pod groups follow pkg/controller/jobs/pod/pod_controller.go
(the ``kueue.x-k8s.io/managed`` finalizer is removed once a pod ended or is deleted
and its Workload finished).

Lab differences: the equivalence check covers batch/v1 Jobs (a Pod's spec cannot
change; a pod group is one pod set); a Job stopped because it no longer matches keeps
its Workload, and so its quota, until its pods are gone and its template is restored
(upstream deletes the Workload at once, and a v1.36 API server refuses the restore while
pods are active).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from gpulab.informer import JOBS, PODS
from gpulab.kueue import api
from gpulab.kueue import jobs as jobsutil
from gpulab.kueue import workload as wlutil
from gpulab.kueue.controllers.client import WORKLOADS, is_conflict, is_not_found
from gpulab.kueue.model import condition
from gpulab.trace import ObjectRef

if TYPE_CHECKING:
    from gpulab.kueue.controllers.manager import Manager

_log = logging.getLogger("gpulab.kueue.jobframework")
Obj = dict[str, Any]

NOT_READY = "Not all pods are ready or succeeded"
RECOVERING = "At least one pod has failed, waiting for recovery"
READY = "All pods reached readiness and the workload is running"
# upstream's stopJob message, with the lab's difference where a learner meets it
NO_MATCH_STOP = (
    "No matching Workload; restoring pod templates according to existent Workload "
    "(lab: the Workload, and its quota, is kept until the Job's pods are gone; "
    "upstream deletes it now)"
)


class JobReconciler:
    def __init__(self, manager: Manager) -> None:
        self.m = manager

    def reconcile(self, key: str) -> float | None:
        ref = jobsutil.Ref.parse(key)
        try:
            if ref.kind == jobsutil.JOB:
                self._job(ref)
            else:
                self._pods(ref)
        except ApiException as exc:
            if not is_conflict(exc):
                raise  # run_worker retries with back-off: no watch event may come
            # the watch brings the fresh object and the job is reconciled again
            _log.debug("%s: %s %s", ref, exc.status, exc.reason)
        return None

    def _workload(self, namespace: str, name: str) -> Obj | None:
        return self.m.store(WORKLOADS).get(f"{namespace}/{name}")

    def _update(self, key: str, mutate: Any) -> Obj | None:
        return self.m.scheduler.update_status(key, mutate)

    # -- the steps every integration shares ------------------------------------------------

    def _finish(self, wl: Obj, reason: str, message: str) -> None:
        text = message or f"Job {reason.lower()}"
        now = wlutil.now_rfc3339()
        written = self._update(
            f"{wl['metadata']['namespace']}/{wl['metadata']['name']}",
            lambda w: wlutil.set_condition(w, api.FINISHED, "True", reason, text, now),
        )
        if written is None:
            return
        admission = (wl.get("status") or {}).get("admission") or {}
        pc = ((wl.get("spec") or {}).get("priorityClassRef") or {}).get("name", "")
        if admission:
            self.m.metrics.finished.labels(admission["clusterQueue"], pc, "standalone").inc()
        self.m.tracer.step("FinishWorkload", ObjectRef.of(written), f"{reason}: {text}")

    def _new_workload(
        self, ref: jobsutil.Ref, owners: Sequence[Obj], pod_sets: list[Obj]
    ) -> dict[str, Any]:
        """constructWorkload with its priority (prepareWorkload)."""
        first = owners[0]
        pod_spec = (pod_sets[0].get("template") or {}).get("spec") or {}
        wpcs, pcs = self.m.priority_values()
        priority, pref = jobsutil.priority_of(first, pod_spec, wpcs, pcs)
        return jobsutil.new_workload(
            ref, owners, jobsutil.queue_name(first), pod_sets, priority, pref
        )

    def _create_workload(
        self, ref: jobsutil.Ref, owners: Sequence[Obj], pod_sets: list[Obj]
    ) -> None:
        body = self._new_workload(ref, owners, pod_sets)
        first = owners[0]
        try:
            created = self.m.kube.create(WORKLOADS, body)
        except ApiException as exc:
            if exc.status != 409:  # AlreadyExists: the watch has not delivered it yet
                raise
            return
        self.m.tracer.step(
            "handleJobWithNoWorkload",
            ObjectRef.of(created),
            f"Created Workload: {ref.namespace}/{created['metadata']['name']} for {ref} in "
            f"LocalQueue {jobsutil.queue_name(first)}",
            priority=body["spec"]["priority"],
        )

    def _pods_ready(self, wl: Obj, ready: bool) -> bool:
        """generatePodsReadyCondition; True when it wrote a change."""
        if self.m.config.wait_for_pods_ready is None or not wlutil.is_admitted(wl):
            return False
        old = condition(wl, api.PODS_READY)
        if ready:
            recovering = old is not None and old.get("reason") in (
                api.WAIT_FOR_RECOVERY,
                api.RECOVERED,
            )
            status, reason, message = "True", api.RECOVERED if recovering else api.STARTED, READY
        elif old is not None and (
            old.get("status") == "True" or old.get("reason") == api.WAIT_FOR_RECOVERY
        ):
            status, reason, message = "False", api.WAIT_FOR_RECOVERY, RECOVERING
        else:
            status, reason, message = "False", api.WAIT_FOR_START, NOT_READY
        if old is not None and (old.get("status"), old.get("reason")) == (status, reason):
            return False
        now = wlutil.now_rfc3339()
        key = f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"
        written = self._update(
            key, lambda w: wlutil.set_condition(w, api.PODS_READY, status, reason, message, now)
        )
        if written is not None:
            self.m.tracer.step(
                "generatePodsReadyCondition",
                ObjectRef.of(written),
                f"PodsReady={status}: {message}",
            )
        return written is not None

    def _release_after_stop(self, wl: Obj) -> None:
        """The job stopped after an eviction: clear the admission (Requeued=True only for
        preemption), put the admission checks back to Pending."""
        evicted = condition(wl, api.EVICTED) or {}
        reason = evicted.get("reason") or api.EVICTED
        message = evicted.get("message", "")
        now = wlutil.now_rfc3339()
        granular = self.m.granular

        # a pod-owned Workload dies with its pod: requeuing it would place nothing
        requeue = reason == api.EVICTED_BY_PREEMPTION and not wlutil.owned_by_single_pod(wl)

        def release(w: MutableMapping[str, Any]) -> bool:
            changed = wlutil.set_requeued(w, reason, message, requeue, now)
            pending = api.REASON_PENDING_EVALUATION if granular else api.PENDING
            changed = wlutil.unset_quota_reservation(w, pending, message, now, granular) or changed
            return wlutil.reset_checks_to_pending(w, now) or changed

        key = f"{wl['metadata']['namespace']}/{wl['metadata']['name']}"
        written = self._update(key, release)
        if written is not None:
            # the eviction's message (a preemption's names both UIDs) is on the
            # Workload's IssuePreemptions line already: its reason says which one
            self.m.tracer.step(
                "stopJob", ObjectRef.of(written), f"quota reservation released ({reason})"
            )

    # -- batch/v1 Job ----------------------------------------------------------------------

    def _job(self, ref: jobsutil.Ref) -> None:
        m = self.m
        job = m.store(JOBS).get(f"{ref.namespace}/{ref.name}")
        if job is None or not jobsutil.queue_name(job):
            return  # the garbage collector deletes the owned Workload
        meta = job["metadata"]
        jref = ObjectRef.of({**job, "apiVersion": "batch/v1", "kind": "Job"})
        wl = self._workload(
            ref.namespace, wlutil.workload_name(meta["name"], meta["uid"], "Job", "batch")
        )
        if wl is not None and wlutil.is_finished(wl):
            return
        if wl is not None and not jobsutil.job_matches_workload(job, wl, m.cache.flavors):
            wl = self._no_matching_workload(ref, job, wl, jref)
            if wl is None:
                return  # its deletion brings the Job back here, to create a new one
        finished, succeeded, message = jobsutil.job_finished(job)
        if finished:
            if wl is not None:
                reason = api.FINISHED_SUCCEEDED if succeeded else api.FINISHED_FAILED
                self._finish(wl, reason, message)
            return
        if wl is None:
            self._create_workload(ref, [job], jobsutil.job_pod_sets(job))
            if not (job.get("spec") or {}).get("suspend"):
                self._suspend(job, jref, "Not admitted by cluster queue")
            return
        suspended = bool((job.get("spec") or {}).get("suspend"))
        if not suspended and self._pods_ready(wl, jobsutil.job_pods_ready(job)):
            return
        if wlutil.is_evicted(wl):
            self._stop_evicted_job(job, wl, jref)
            return
        if suspended:
            if wlutil.is_admitted(wl):
                self._start_job(job, wl, jref)
            else:
                self._queue_name_change(job, wl, jref)
            return
        if not wlutil.is_admitted(wl):
            self._suspend(job, jref, "Not admitted by cluster queue")

    def _no_matching_workload(
        self, ref: jobsutil.Ref, job: Obj, wl: Obj, jref: ObjectRef
    ) -> Obj | None:
        """ensureOneWorkload when the Job no longer matches its Workload: the Workload of
        a suspended Job holding no quota is rewritten; otherwise a running Job is stopped
        and the Workload deleted (None)."""
        m = self.m
        suspended = bool((job.get("spec") or {}).get("suspend"))
        key = f"{ref.namespace}/{wl['metadata']['name']}"
        if suspended and not wlutil.has_quota_reservation(wl):
            body = self._new_workload(ref, [job], jobsutil.job_pod_sets(job))
            spec = {**body["spec"], "active": wlutil.is_active(wl)}
            try:
                written = m.kube.update(WORKLOADS, {**wl, "spec": spec})
            except ApiException as exc:
                if is_not_found(exc):
                    return None
                raise
            m.tracer.step(
                "updateWorkloadToMatchJob",
                jref,
                f"Updated not matching Workload for suspended job: {key}",
            )
            return written
        if not jobsutil.job_finished(job)[0]:
            job = self._stop_job(
                job,
                wl,
                jref,
                NO_MATCH_STOP,
            )
            if jobsutil.job_restore_patch(job, wl) is not None:
                return None  # restored once its pods are gone; the Job's update brings it back
        m.kube.delete(WORKLOADS, wl)
        m.tracer.step("ensureOneWorkload", jref, f"Deleted not matching Workload: {key}")
        return None

    def _start_job(self, job: Obj, wl: Obj, jref: ObjectRef) -> None:
        """startJob; a pod template the admission cannot be merged into finishes the
        Workload (FailedToStart), as retrying cannot help."""
        m = self.m
        try:
            patch = jobsutil.job_start_patch(job, wl, m.cache.flavors)
        except jobsutil.PodSetUpdateError as exc:
            self._finish(wl, api.FINISHED_FAILED_TO_START, str(exc))
            return
        m.kube.patch(JOBS, job, patch)
        cq = wl["status"]["admission"]["clusterQueue"]
        m.tracer.step(
            "startJob",
            jref,
            f"Admitted by clusterQueue {cq}",
            nodeSelector=patch["spec"]["template"]["spec"]["nodeSelector"],
        )

    def _queue_name_change(self, job: Obj, wl: Obj, jref: ObjectRef) -> None:
        """handleQueueNameChange: the Workload follows the Job's queue-name label (the
        Workload's queueName is immutable while it holds quota)."""
        queue = jobsutil.queue_name(job)
        old = (wl.get("spec") or {}).get("queueName", "")
        if old == queue or wlutil.has_quota_reservation(wl):
            return
        self.m.kube.patch(WORKLOADS, wl, {"spec": {"queueName": queue}})
        self.m.tracer.step(
            "handleQueueNameChange",
            jref,
            f"Job changed queue-name, updating workload: LocalQueue {old} -> {queue}",
        )

    def _suspend(self, job: Obj, jref: ObjectRef, why: str) -> None:
        self.m.kube.patch(JOBS, job, {"spec": {"suspend": True}})
        self.m.tracer.step("stopJob", jref, f"Job suspended: {why}", warning=True)

    def _stop_job(self, job: Obj, wl: Obj, jref: ObjectRef, message: str) -> Obj:
        """Job.Stop: suspend, forget the start time, restore the template the Workload
        recorded. The API server lets a suspended Job's template change only once it has
        no startTime (or is Suspended) and no active pod (MutableSchedulingDirectives-
        ForSuspendedJobs, Beta in v1.36): until the Job controller has removed its pods the
        restore waits, and the Job's status update brings the reconcile back."""
        m = self.m
        if not (job.get("spec") or {}).get("suspend"):
            job = m.kube.patch(JOBS, job, {"spec": {"suspend": True}})
            m.tracer.step("stopJob", jref, f"Job suspended: {message}", warning=True)
        if (job.get("status") or {}).get("startTime"):
            job = m.kube.patch_status(JOBS, job, {"status": {"startTime": None}})
        restore = jobsutil.job_restore_patch(job, wl)
        if restore is not None and not (job.get("status") or {}).get("active"):
            job = m.kube.patch(JOBS, job, restore)
        return job

    def _stop_evicted_job(self, job: Obj, wl: Obj, jref: ObjectRef) -> None:
        evicted = condition(wl, api.EVICTED) or {}
        why = f"its Workload was evicted ({evicted.get('reason', '')})"
        job = self._stop_job(job, wl, jref, why)
        if wlutil.has_quota_reservation(wl) and not (job.get("status") or {}).get("active"):
            self._release_after_stop(wl)

    # -- Pods and pod groups --------------------------------------------------------------

    def _pods(self, ref: jobsutil.Ref) -> None:
        m = self.m
        if ref.kind == jobsutil.POD:
            pod = m.store(PODS).get(f"{ref.namespace}/{ref.name}")
            pods = [pod] if pod is not None else []
        else:
            pods = [
                p
                for p in m.store(PODS).list()
                if p["metadata"]["namespace"] == ref.namespace
                and jobsutil.group_name(p) == ref.name
            ]
        if not pods:
            return
        first = pods[0]
        if ref.kind == jobsutil.POD:
            meta = first["metadata"]
            wl_name = wlutil.workload_name(meta["name"], meta["uid"], "Pod", "")
            count: int | None = 1
        else:
            wl_name, count = ref.name, jobsutil.total_count(first)
        if count is None:
            return  # the webhook rejects a group without its total count
        wl = self._workload(ref.namespace, wl_name)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        if ref.kind == jobsutil.POD:
            gone = bool(first["metadata"].get("deletionTimestamp"))
            finished = jobsutil.pod_terminal(first) or gone
            succeeded = jobsutil.pod_phase(first) == "Succeeded"
            message = (first.get("status") or {}).get("message", "") or (
                "Pod deleted" if gone else ""
            )
        else:
            finished, succeeded, message = jobsutil.group_finished(pods, count)
        if wl is not None and not wlutil.is_finished(wl) and finished:
            reason = api.FINISHED_SUCCEEDED if succeeded else api.FINISHED_FAILED
            self._finish(wl, reason, message)
            return
        if wl is None or wlutil.is_finished(wl):
            if wl is None and not finished and jobsutil.queue_name(first):
                complete = (
                    len(live) >= count
                    or jobsutil.annotations(first).get("kueue.x-k8s.io/pod-group-fast-admission")
                    == "true"
                )
                if complete:
                    self._create_workload(ref, live, self._pod_sets(ref, live, count))
            self._finalize(pods, wl)
            return
        if self._pods_ready(wl, all(jobsutil.pod_ready(p) for p in live) and len(live) >= count):
            return
        if wlutil.is_evicted(wl):
            self._stop_pods(live, wl)
            return
        if wlutil.is_admitted(wl):
            for pod in live:
                if jobsutil.is_gated(pod):
                    try:
                        ungated = jobsutil.pod_ungate(pod, wl, m.cache.flavors)
                    except jobsutil.PodSetUpdateError as exc:
                        self._finish(wl, api.FINISHED_FAILED_TO_START, str(exc))
                        return
                    m.kube.update(PODS, ungated)
                    m.tracer.step(
                        "startJob",
                        ObjectRef.of({**pod, "apiVersion": "v1", "kind": "Pod"}),
                        f"Admitted by clusterQueue {wl['status']['admission']['clusterQueue']}: "
                        "scheduling gate removed",
                    )
        self._finalize([p for p in pods if p not in live or jobsutil.pod_terminal(p)], wl)

    def _pod_sets(self, ref: jobsutil.Ref, pods: Sequence[Obj], count: int) -> list[Obj]:
        if ref.kind == jobsutil.POD:
            return [
                {
                    "name": api.DEFAULT_POD_SET,
                    "count": 1,
                    "template": jobsutil.pod_template(pods[0]),
                }
            ]
        return jobsutil.group_pod_sets(pods, count)

    def _stop_pods(self, pods: Sequence[Obj], wl: Obj) -> None:
        """Pod.Stop: an evicted Workload's running pods are deleted; once none is left
        the quota is released."""
        running = [p for p in pods if not jobsutil.is_gated(p) and not jobsutil.pod_terminal(p)]
        for pod in running:
            self.m.kube.delete(PODS, pod)
            self.m.tracer.step(
                "stopJob",
                ObjectRef.of({**pod, "apiVersion": "v1", "kind": "Pod"}),
                f"Pod deleted: {(condition(wl, api.EVICTED) or {}).get('message', '')}",
                warning=True,
            )
        if not running and wlutil.has_quota_reservation(wl):
            self._release_after_stop(wl)

    def _finalize(self, pods: Sequence[Obj], wl: Mapping[str, Any] | None) -> None:
        """Drop the kueue.x-k8s.io/managed finalizer of pods that ended or are deleted."""
        for pod in pods:
            finalizers = pod["metadata"].get("finalizers") or []
            done = jobsutil.pod_terminal(pod) or pod["metadata"].get("deletionTimestamp")
            if api.POD_FINALIZER not in finalizers or not done:
                continue
            if (
                wl is not None
                and not wlutil.is_finished(wl)
                and not pod["metadata"].get("deletionTimestamp")
            ):
                continue
            updated = copy.deepcopy(pod)
            updated["metadata"]["finalizers"] = [f for f in finalizers if f != api.POD_FINALIZER]
            self.m.kube.update(PODS, updated)
