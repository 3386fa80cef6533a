"""Workload construction from a Job, conditions, and the Job reconcile decisions."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from gpulab.kueue import api, model
from gpulab.kueue import workload as wlutil
from gpulab.kueue.controllers.job_controller import JobStep, job_step
from gpulab.kueue.webhook import job_needs_suspend

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:01:00Z"


def job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "sample-job-abcde",
            "namespace": "default",
            "uid": "uid-1",
            "labels": {api.QUEUE_LABEL: "user-queue"},
        },
        "spec": {
            "parallelism": 3,
            "completions": 3,
            "suspend": True,
            "template": {
                "metadata": {"labels": {"batch.kubernetes.io/controller-uid": "uid-1", "app": "x"}},
                "spec": {
                    "nodeSelector": {"zone": "a"},
                    "containers": [
                        {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "200Mi"}}}
                    ],
                },
            },
            **spec,
        },
    }


def test_workload_for_job() -> None:
    wl = wlutil.workload_for_job(job(), priority=7, priority_class="high")
    digest = hashlib.sha1(b"Job\nbatch\nsample-job-abcde\nuid-1").hexdigest()[:5]
    assert wl["metadata"]["name"] == f"job-sample-job-abcde-{digest}"
    assert wl["metadata"]["labels"] == {api.JOB_UID_LABEL: "uid-1"}
    [owner] = wl["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "sample-job-abcde",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert wl["spec"]["queueName"] == "user-queue"
    assert wl["spec"]["priority"] == 7
    assert wl["spec"]["priorityClassRef"]["name"] == "high"
    [ps] = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("main", 3)
    assert ps["template"]["metadata"]["labels"] == {"app": "x"}
    info = model.workload_from_obj(wl)
    assert info.pod_sets[0].requests == {"cpu": 3, "memory": 3 * 200 * 1024**2}


def test_pods_count_is_parallelism_capped_by_completions() -> None:
    assert wlutil.pods_count(job(parallelism=4, completions=2)) == 2
    assert wlutil.pods_count(job(parallelism=2, completions=10)) == 2
    j = job()
    del j["spec"]["parallelism"]
    assert wlutil.pods_count(j) == 1


def test_long_job_names_are_truncated_to_a_valid_name() -> None:
    name = wlutil.workload_name_for_job("x" * 300, "uid")
    assert len(name) == 253 and name.startswith("job-xxx")


def admitted(wl: dict[str, Any], flavor: str = "spot") -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    wlutil.set_quota_reservation(
        wl,
        {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": "main",
                    "flavors": {"cpu": flavor, "memory": flavor},
                    "resourceUsage": {"cpu": "3"},
                    "count": 3,
                }
            ],
        },
        NOW,
    )
    return wl


def test_quota_reservation_conditions() -> None:
    wl = admitted(wlutil.workload_for_job(job()))
    assert wlutil.has_quota_reservation(wl) and wlutil.is_admitted(wl)
    qr = model.condition(wl, api.QUOTA_RESERVED)
    assert qr["reason"] == "QuotaReserved" and qr["message"] == "Quota reserved in ClusterQueue cq"
    wlutil.set_evicted(wl, api.EVICTED_BY_PREEMPTION, "Preempted to accommodate ...", LATER)
    assert wlutil.is_evicted(wl)
    assert wlutil.unset_quota_reservation(wl, api.REASON_PENDING_EVALUATION, "evicted", LATER)
    assert wl["status"]["admission"] is None
    assert not wlutil.is_admitted(wl) and not wlutil.has_quota_reservation(wl)
    assert model.condition(wl, api.ADMITTED)["reason"] == "NoReservation"
    # Admitting again resets Evicted, as upstream SetQuotaReservation does.
    wl = admitted(wl)
    ev = model.condition(wl, api.EVICTED)
    assert ev["status"] == "False" and ev["message"].startswith("Previously: ")


def test_set_condition_keeps_transition_time_and_reports_change() -> None:
    obj: dict[str, Any] = {"metadata": {"generation": 2}}
    assert wlutil.set_condition(obj, "Active", "True", "Ready", "ok", NOW)
    assert not wlutil.set_condition(obj, "Active", "True", "Ready", "ok", LATER)
    assert wlutil.set_condition(obj, "Active", "True", "Ready", "still ok", LATER)
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == NOW
    assert wlutil.set_condition(obj, "Active", "False", "FlavorNotFound", "x", LATER)
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == LATER
    assert obj["status"]["conditions"][0]["observedGeneration"] == 2


def test_job_steps() -> None:
    j = job()
    wl = wlutil.workload_for_job(j)
    unlabelled = copy.deepcopy(j)
    unlabelled["metadata"]["labels"] = {}
    assert job_step(unlabelled, None) is JobStep.IGNORE
    assert job_step(j, None) is JobStep.CREATE_WORKLOAD
    assert job_step(j, wl) is JobStep.NOTHING  # suspended, waiting for quota
    assert job_step(j, admitted(wl)) is JobStep.UNSUSPEND
    running = {**j, "spec": {**j["spec"], "suspend": False}}
    assert job_step(running, wl) is JobStep.SUSPEND_NOT_ADMITTED
    assert job_step(running, admitted(wl)) is JobStep.NOTHING
    evicted = admitted(wl)
    wlutil.set_evicted(evicted, "Preempted", "m", NOW)
    assert job_step(running, evicted) is JobStep.STOP_EVICTED
    done = {**running, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert job_step(done, admitted(wl)) is JobStep.FINISH_WORKLOAD
    finished = admitted(wl)
    wlutil.set_condition(finished, api.FINISHED, "True", "Succeeded", "", NOW)
    assert job_step(done, finished) is JobStep.NOTHING
    failed = {
        **running,
        "status": {
            "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]
        },
    }
    assert wlutil.job_finished(failed) == (True, False, "BackoffLimitExceeded")


def test_admission_injects_flavor_labels_and_restore_undoes_it() -> None:
    j = job()
    wl = admitted(wlutil.workload_for_job(j))
    spot = model.Flavor(
        "spot",
        node_labels={"instance-type": "spot"},
        tolerations=({"key": "spot", "operator": "Exists", "effect": "NoSchedule"},),
    )
    patch = wlutil.admitted_template_patch(j, wl, {"spot": spot})
    spec = patch["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"zone": "a", "instance-type": "spot"}
    assert spec["tolerations"] == [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
    restore = wlutil.restore_template_patch(wl)["spec"]["template"]["spec"]
    assert restore == {"nodeSelector": {"zone": "a"}, "tolerations": None}


def test_webhook_suspend_decision() -> None:
    j = job(suspend=False)
    assert job_needs_suspend(j)
    assert not job_needs_suspend(job(suspend=True))
    j["metadata"]["labels"] = {}
    assert not job_needs_suspend(j)
    no_spec_suspend = job()
    del no_spec_suspend["spec"]["suspend"]
    assert job_needs_suspend(no_spec_suspend)


def test_preemption_message_matches_upstream() -> None:
    wl = {"metadata": {"uid": "w-uid", "labels": {api.JOB_UID_LABEL: "j-uid"}}}
    assert wlutil.preemption_message(wl, api.IN_CLUSTER_QUEUE, "cq", "cq") == (
        "Preempted to accommodate a workload (UID: w-uid, JobUID: j-uid) due to "
        "prioritization in the ClusterQueue; preemptor path: cq; preemptee path: cq"
    )
