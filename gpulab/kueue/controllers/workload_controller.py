"""Workload reconcile: what happens to a Workload besides scheduling.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/controller/core/workload_controller.go
``Reconcile``: a Workload in backoff waits for ``requeueState.requeueAt`` and then
``Requeued=True BackoffFinished``; a deactivated one (``spec.active: false``) is
evicted (``Deactivated``); a Workload whose LocalQueue or ClusterQueue is missing or
stopped gets QuotaReserved=False with upstream's message, and an admitted one of a
``HoldAndDrain`` queue is evicted (``LocalQueueStopped`` / ``ClusterQueueStopped``);
``reconcileSyncAdmissionChecks`` keeps one check state per AdmissionCheck the
ClusterQueue requires and ``SyncAdmittedCondition`` follows them; a Retry or Rejected
check evicts (``AdmissionCheck``; Rejected also deactivates); ``reconcileNotReadyTimeout``
(waitForPodsReady) evicts an admitted Workload whose pods are not ready in time
(``PodsReadyTimeout``) with an exponential requeue backoff, or deactivates it once
``backoffLimitCount`` is reached. Eviction itself is pkg/workload/evict ``Evict``.
A pending Workload whose pods ask for DRA devices is refused or queued here
(gpulab/kueue/dra.py), as upstream's Reconcile does before queueing it; with the
UnadmittedWorkloadsObservability gate every reconcile records the Workload's
unadmitted status (``UpdateUnadmittedWorkload``, ``kueue_unadmitted_workloads``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from gpulab.kueue import api, dra
from gpulab.kueue import workload as wlutil
from gpulab.kueue.controllers.client import RESOURCE_CLAIM_TEMPLATES, WORKLOADS, is_not_found
from gpulab.kueue.controllers.scheduler import required_checks
from gpulab.kueue.model import condition, condition_true, timestamp
from gpulab.trace import ObjectRef

if TYPE_CHECKING:
    from gpulab.kueue.controllers.manager import Manager

_log = logging.getLogger("gpulab.kueue.workload")
Mutation = Callable[[MutableMapping[str, Any]], bool]
DRA_RETRY_SECONDS = 10.0  # a ResourceClaimTemplate that could not be read


class WorkloadReconciler:
    def __init__(self, manager: Manager) -> None:
        self.m = manager

    def _update(self, key: str, mutate: Mutation) -> dict[str, Any] | None:
        try:
            return self.m.scheduler.update_status(key, mutate)
        except ApiException as exc:
            _log.info("workload %s status not written: %s %s", key, exc.status, exc.reason)
            return None

    def evict(self, key: str, reason: str, message: str, extra: Mutation | None = None) -> None:
        """evict.Evict: Evicted=True with the reason; the job reconciler then stops the job
        and releases the quota."""
        m = self.m
        now = wlutil.now_rfc3339()

        def mutate(wl: MutableMapping[str, Any]) -> bool:
            if wlutil.is_evicted(wl):
                return False
            wlutil.set_evicted(wl, reason, message, now)
            if extra is not None:
                extra(wl)
            return True

        written = self._update(key, mutate)
        if written is None:
            return
        admission = (written.get("status") or {}).get("admission") or {}
        pc = ((written.get("spec") or {}).get("priorityClassRef") or {}).get("name", "")
        m.metrics.evicted.labels(
            admission.get("clusterQueue", ""), reason, "", pc, "standalone"
        ).inc()
        m.tracer.step("Evict", ObjectRef.of(written), f"{reason}: {message}", warning=True)

    def reconcile(self, key: str) -> float | None:
        m = self.m
        wl = m.store(WORKLOADS).get(key)
        if m.unadmitted is not None:
            status = wlutil.unadmitted_status(wl) if wl is not None else None
            if status is None:
                m.unadmitted.remove(key)
            else:
                ns, queue = wl["metadata"]["namespace"], (wl.get("spec") or {}).get("queueName", "")
                m.unadmitted.update(key, (m.queues.cluster_queue_for(ns, queue) or "", *status))
        if wl is None or wlutil.is_finished(wl):
            return None
        now = m.clock()
        nowstr = wlutil.now_rfc3339()
        active = wlutil.is_active(wl)
        reserved = wlutil.has_quota_reservation(wl)
        if condition_true(wl, api.DEACTIVATION_TARGET) and active:
            self._deactivate(wl)
            return None
        if not active:
            if reserved and not wlutil.is_evicted(wl):
                target = condition(wl, api.DEACTIVATION_TARGET)
                message = "The workload is deactivated"
                if target:
                    message += f" due to {target.get('message', '')}"

                def clear(w: MutableMapping[str, Any]) -> bool:
                    wlutil.remove_condition(w, api.DEACTIVATION_TARGET)
                    w["status"].pop("requeueState", None)
                    return True

                self.evict(key, api.DEACTIVATED, message, clear)
            return None
        requeue_at = timestamp(
            ((wl.get("status") or {}).get("requeueState") or {}).get("requeueAt")
        )
        if requeue_at is not None and not reserved:
            if requeue_at > now:
                return requeue_at - now

            def clear_requeue_at(w: MutableMapping[str, Any]) -> bool:
                w["status"]["requeueState"].pop("requeueAt", None)
                return True

            self._update(key, clear_requeue_at)
            return None
        requeued = condition(wl, api.REQUEUED)
        if requeued and requeued.get("status") == "False" and not reserved:
            reason = requeued.get("reason")
            if reason in (api.EVICTED_BY_PODS_READY_TIMEOUT, api.EVICTED_BY_ADMISSION_CHECK):
                self._update(
                    key,
                    lambda w: wlutil.set_requeued(
                        w, api.BACKOFF_FINISHED, "The workload backoff was finished", True, nowstr
                    ),
                )
                return None
            if reason == api.DEACTIVATED:
                self._update(
                    key,
                    lambda w: wlutil.set_requeued(
                        w, "Reactivated", "The workload was reactivated", True, nowstr
                    ),
                )
                return None
        if reserved:
            return self._reconcile_reserved(key, wl, now)
        if dra.has_dra(wl):
            return self._reconcile_dra(key, wl)
        self._reconcile_pending(key, wl)
        return None

    def _deactivate(self, wl: dict[str, Any]) -> None:
        try:
            self.m.kube.patch(WORKLOADS, wl, {"spec": {"active": False}})
        except ApiException as exc:
            _log.info("deactivating %s: %s", wl["metadata"]["name"], exc.status)

    # -- pending ------------------------------------------------------------------------------

    def _reconcile_pending(self, key: str, wl: dict[str, Any]) -> None:
        m = self.m
        queue = (wl.get("spec") or {}).get("queueName", "")
        lq = m.queues.local_queues.get(f"{wl['metadata']['namespace']}/{queue}")
        cq = m.cache.cluster_queues.get(lq.cluster_queue) if lq else None
        problem: tuple[str, str] | None = None
        if lq is None:
            problem = (api.REASON_MISCONFIGURED, f"LocalQueue {queue} is terminating or missing")
        elif lq.stop_policy != api.STOP_NONE:
            problem = (api.REASON_SUSPENDED, f"LocalQueue {queue} is stopped")
        elif cq is None:
            problem = (
                api.REASON_MISCONFIGURED,
                f"ClusterQueue {lq.cluster_queue} is terminating or missing",
            )
        elif cq.stop_policy != api.STOP_NONE:
            problem = (api.REASON_SUSPENDED, f"ClusterQueue {cq.name} is stopped")
        if problem is None:
            return
        reason = problem[0] if m.granular else api.INADMISSIBLE
        now = wlutil.now_rfc3339()
        written = self._update(
            key, lambda w: wlutil.unset_quota_reservation(w, reason, problem[1], now, m.granular)
        )
        if written is not None:
            m.tracer.step(
                "Reconcile", ObjectRef.of(written), f"{reason}: {problem[1]}", warning=True
            )

    def _claim_template(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.m.kube.get(RESOURCE_CLAIM_TEMPLATES, namespace, name)
        except ApiException as exc:
            if is_not_found(exc):
                raise dra.TemplateMissing(
                    f'resourceclaimtemplates.resource.k8s.io "{name}" not found'
                ) from exc
            raise

    def _reconcile_dra(self, key: str, wl: dict[str, Any]) -> float | None:
        """A pending Workload with DRA claims: refused (QuotaReserved=False Misconfigured,
        Requeued=False Inadmissible), or queued when it asks for no device after all."""
        m = self.m
        refusal = dra.refusal(wl, self._claim_template)
        if refusal is None:

            def clear(w: MutableMapping[str, Any]) -> bool:
                changed = False
                for ctype in (api.QUOTA_RESERVED, api.REQUEUED):
                    if (condition(w, ctype) or {}).get("status") == "False":
                        changed = wlutil.remove_condition(w, ctype) or changed
                return changed

            written = self._update(key, clear) or wl
            with m.lock:
                m.queue_pending(written)
            return None
        reason = api.REASON_MISCONFIGURED if m.granular else api.INADMISSIBLE
        now = wlutil.now_rfc3339()

        def refuse(w: MutableMapping[str, Any]) -> bool:
            if not wlutil.unset_quota_reservation(w, reason, refusal.message, now, m.granular):
                return False
            wlutil.set_requeued(w, api.INADMISSIBLE, refusal.requeued_message, False, now)
            return True

        written = self._update(key, refuse)
        if written is not None:
            m.tracer.step(
                "Reconcile", ObjectRef.of(written), f"{reason}: {refusal.message}", warning=True
            )
        return DRA_RETRY_SECONDS if refusal.retry else None

    # -- holding quota ----------------------------------------------------------------------------

    def _reconcile_reserved(self, key: str, wl: dict[str, Any], now: float) -> float | None:
        m = self.m
        admission = (wl.get("status") or {}).get("admission") or {}
        cq = m.cache.cluster_queues.get(admission.get("clusterQueue", ""))
        queue = (wl.get("spec") or {}).get("queueName", "")
        lq = m.queues.local_queues.get(f"{wl['metadata']['namespace']}/{queue}")
        evicted = wlutil.is_evicted(wl)
        if not evicted and lq is not None and lq.stop_policy == api.HOLD_AND_DRAIN:
            self.evict(key, api.EVICTED_BY_LQ_STOPPED, "The LocalQueue is stopped")
            return None
        if not evicted and cq is not None and cq.stop_policy == api.HOLD_AND_DRAIN:
            self.evict(key, api.EVICTED_BY_CQ_STOPPED, "The ClusterQueue is stopped")
            return None
        if cq is not None and not evicted:
            required = required_checks(cq.admission_checks, wlutil.flavors_of(wl))
            nowstr = wlutil.now_rfc3339()
            was_admitted = wlutil.is_admitted(wl)

            def sync(w: MutableMapping[str, Any]) -> bool:
                changed = wlutil.sync_admission_check_states(w, required, nowstr)
                return wlutil.sync_admitted_condition(w, nowstr, m.granular) or changed

            written = self._update(key, sync)
            if written is not None:
                if wlutil.is_admitted(written) and not was_admitted:
                    m.tracer.step(
                        "SyncAdmittedCondition",
                        ObjectRef.of(written),
                        f"Admitted by ClusterQueue {cq.name}: all admission checks are Ready",
                    )
                    pc = ((written.get("spec") or {}).get("priorityClassRef") or {}).get("name", "")
                    m.metrics.admitted.labels(cq.name, pc, "standalone").inc()
                return None
            if wlutil.has_check_in(wl, api.CHECK_RETRY, api.CHECK_REJECTED):
                rejected = wlutil.has_check_in(wl, api.CHECK_REJECTED)
                message = "At least one admission check is false"
                if rejected:
                    self._deactivate(wl)
                self.evict(key, api.EVICTED_BY_ADMISSION_CHECK, message)
                return None
        return self._not_ready_timeout(key, wl, now)

    def _not_ready_timeout(self, key: str, wl: dict[str, Any], now: float) -> float | None:
        """reconcileNotReadyTimeout (admittedNotReadyWorkload)."""
        cfg = self.m.config.wait_for_pods_ready
        if cfg is None or not wlutil.is_admitted(wl) or wlutil.is_evicted(wl):
            return None
        ready = condition(wl, api.PODS_READY)
        if ready is not None and ready.get("status") == "True":
            return None
        if ready is None or ready.get("reason") == api.WAIT_FOR_START:
            since = timestamp((condition(wl, api.ADMITTED) or {}).get("lastTransitionTime"))
            timeout: float | None = cfg.timeout
        elif ready.get("reason") == api.WAIT_FOR_RECOVERY:
            since = timestamp(ready.get("lastTransitionTime"))
            timeout = cfg.recovery_timeout
        else:
            return None
        if since is None or timeout is None:
            return None
        remaining = since + timeout - now
        if remaining > 0:
            return remaining
        count = int(((wl.get("status") or {}).get("requeueState") or {}).get("count") or 0)
        if cfg.backoff_limit_count is not None and count + 1 > cfg.backoff_limit_count:
            now_s = wlutil.now_rfc3339()
            self._update(
                key,
                lambda w: wlutil.set_condition(
                    w,
                    api.DEACTIVATION_TARGET,
                    "True",
                    api.REQUEUING_LIMIT_EXCEEDED,
                    "exceeding the maximum number of re-queuing retries",
                    now_s,
                ),
            )
            return None
        message = f"Exceeded the PodsReady timeout {key}"

        def backoff(w: MutableMapping[str, Any]) -> bool:
            wlutil.update_requeue_state(w, cfg.backoff_base_seconds, cfg.backoff_max_seconds, now)
            return True

        self.evict(key, api.EVICTED_BY_PODS_READY_TIMEOUT, message, backoff)
        return None
