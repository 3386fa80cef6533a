"""Workloads built from jobs and pods, their conditions, requests as upstream counts them
(transformations, sidecars), and what admission injects into a job."""

from __future__ import annotations

import copy
import hashlib
from decimal import Decimal
from typing import Any

import pytest
from kueue_fake import merge

from gpulab.kueue import api, jobs, model
from gpulab.kueue import workload as wlutil
from gpulab.kueue.config import ConfigError, duration, parse

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


def job_workload(
    j: dict[str, Any], priority: int = 0, ref: dict[str, str] | None = None
) -> dict[str, Any]:
    meta = j["metadata"]
    return jobs.new_workload(
        jobs.Ref(jobs.JOB, meta["namespace"], meta["name"]),
        [j],
        jobs.queue_name(j),
        jobs.job_pod_sets(j),
        priority,
        ref,
    )


def test_workload_for_job_is_named_and_owned_as_upstream() -> None:
    ref = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"}
    wl = job_workload(job(), priority=7, ref=ref)
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
    assert (wl["spec"]["priority"], wl["spec"]["priorityClassRef"]) == (7, ref)
    [ps] = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("main", 3)
    assert ps["template"]["metadata"]["labels"] == {"app": "x"}
    info = model.workload_from_obj({**wl, "metadata": {**wl["metadata"], "namespace": "default"}})
    assert info.total_requests[0].requests == {"cpu": 3000, "memory": 3 * 200 * 1024**2}


def test_pod_workload_names_use_the_core_group() -> None:
    digest = hashlib.sha1(b"Pod\n\nweb-0\nu").hexdigest()[:5]
    assert wlutil.workload_name("web-0", "u", "Pod", "") == f"pod-web-0-{digest}"
    long = wlutil.workload_name("x" * 300, "uid", "Job", "batch")
    assert len(long) == 253 and long.startswith("job-xxx")


def test_pods_count_is_parallelism_capped_by_completions() -> None:
    assert jobs.pods_count(job(parallelism=4, completions=2)) == 2
    assert jobs.pods_count(job(parallelism=2, completions=10)) == 2
    j = job()
    del j["spec"]["parallelism"]
    assert jobs.pods_count(j) == 1


def test_pod_requests_count_sidecars_and_init_containers_as_kubelet_does() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"resources": {"requests": {"cpu": "2"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    assert model.pod_requests(spec) == {"cpu": Decimal("2.6")}


def test_transformations_add_credits_and_replace_drops_the_input() -> None:
    config = parse(
        {
            "resources": {
                "excludeResourcePrefixes": ["example.com/"],
                "transformations": [
                    {"input": "cpu", "outputs": {"cpu_credits": 1}},
                    {
                        "input": "nvidia.com/mig-1g.5gb",
                        "strategy": "Replace",
                        "outputs": {"mig": 1},
                    },
                ],
            }
        }
    )
    effective = config.resources.effective(
        {"cpu": Decimal(3), "nvidia.com/mig-1g.5gb": Decimal(2), "example.com/x": Decimal(1)}
    )
    assert effective == {"cpu": 3, "cpu_credits": 3, "mig": 2}


def reserve(wl: dict[str, Any], checks_ok: bool = True) -> dict[str, Any]:
    wl = copy.deepcopy(wl)
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "main", "flavors": {"cpu": "spot"}, "resourceUsage": {"cpu": "3"}, "count": 3}
        ],
    }
    wlutil.set_quota_reservation(wl, admission, NOW, checks_ok, granular=True)
    return wl


def test_quota_reservation_and_release_conditions() -> None:
    wl = reserve(job_workload(job()))
    assert wlutil.has_quota_reservation(wl) and wlutil.is_admitted(wl)
    qr = model.condition(wl, api.QUOTA_RESERVED)
    assert qr["message"] == "Quota reserved in ClusterQueue cq"
    wlutil.set_evicted(wl, api.EVICTED_BY_PREEMPTION, "Preempted to accommodate ...", LATER)
    assert wlutil.unset_quota_reservation(wl, api.REASON_PENDING_EVALUATION, "evicted", LATER, True)
    assert wl["status"]["admission"] is None
    assert not wlutil.is_admitted(wl) and not wlutil.has_quota_reservation(wl)
    assert model.condition(wl, api.ADMITTED)["reason"] == "NoReservation"
    assert wl["status"]["accumulatedPastExecutionTimeSeconds"] == 60
    wl = reserve(wl)  # admitting again resets Evicted, as SetQuotaReservation does
    ev = model.condition(wl, api.EVICTED)
    assert ev["status"] == "False" and ev["message"].startswith("Previously: ")


def test_admitted_waits_for_every_admission_check() -> None:
    wl = reserve(job_workload(job()), checks_ok=False)
    assert wlutil.has_quota_reservation(wl) and not wlutil.is_admitted(wl)
    assert wlutil.sync_admission_check_states(wl, ["gpus-healthy"], NOW)
    assert wlutil.sync_admitted_condition(wl, NOW, granular=True)
    assert model.condition(wl, api.ADMITTED)["reason"] == "UnsatisfiedAdmissionChecks"
    wl["status"]["admissionChecks"][0]["state"] = api.CHECK_READY
    assert wlutil.sync_admitted_condition(wl, LATER, granular=True)
    assert wlutil.is_admitted(wl)
    assert not wlutil.sync_admission_check_states(wl, ["gpus-healthy"], LATER)


def test_without_the_observability_gate_the_reason_is_the_legacy_one() -> None:
    wl = job_workload(job())
    assert not wlutil.sync_admitted_condition(wl, NOW, granular=False)  # nothing to say yet
    wlutil.unset_quota_reservation(wl, api.PENDING, "waiting", NOW, granular=False)
    assert model.condition(wl, api.ADMITTED) is None


def test_set_condition_keeps_transition_time_and_reports_change() -> None:
    obj: dict[str, Any] = {"metadata": {"generation": 2}}
    assert wlutil.set_condition(obj, "Active", "True", "Ready", "ok", NOW)
    assert not wlutil.set_condition(obj, "Active", "True", "Ready", "ok", LATER)
    assert wlutil.set_condition(obj, "Active", "True", "Ready", "still ok", LATER)
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == NOW
    assert wlutil.set_condition(obj, "Active", "False", "FlavorNotFound", "x", LATER)
    assert obj["status"]["conditions"][0]["lastTransitionTime"] == LATER
    assert obj["status"]["conditions"][0]["observedGeneration"] == 2


def test_requeue_state_backs_off_exponentially() -> None:
    wl: dict[str, Any] = {"status": {}}
    wlutil.update_requeue_state(wl, 60, 3600, 0.0)
    assert wl["status"]["requeueState"] == {"count": 1, "requeueAt": "1970-01-01T00:01:00Z"}
    wlutil.update_requeue_state(wl, 60, 3600, 0.0)
    assert wl["status"]["requeueState"]["requeueAt"] == "1970-01-01T00:02:00Z"


def test_admission_injects_flavor_podset_and_queue_labels_and_restore_undoes_it() -> None:
    """getPodSetsInfoFromStatus: the flavor's node labels and tolerations, the labels
    kueue.x-k8s.io/podset and (AssignQueueLabelsForPods) the queue names; stopping the
    Job puts its template back as the Workload recorded it, the Job controller's
    labels kept."""
    j = job()
    j["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] = "sample"
    wl = reserve(job_workload(j))
    spot = model.Flavor(
        "spot",
        node_labels={"instance-type": "spot"},
        tolerations=({"key": "spot", "operator": "Exists", "effect": "NoSchedule"},),
    )
    patch = jobs.job_start_patch(j, wl, {"spot": spot})
    template = patch["spec"]["template"]
    assert patch["spec"]["suspend"] is False
    assert template["spec"]["nodeSelector"] == {"zone": "a", "instance-type": "spot"}
    assert template["spec"]["tolerations"] == [
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert template["metadata"]["labels"] == {
        "batch.kubernetes.io/controller-uid": "uid-1",
        "batch.kubernetes.io/job-name": "sample",
        "app": "x",
        api.PODSET_LABEL: "main",
        api.LOCAL_QUEUE_LABEL: "user-queue",
        api.CLUSTER_QUEUE_LABEL: "cq",
    }
    started = copy.deepcopy(j)
    merge(started, patch)
    restored = copy.deepcopy(started)
    merge(restored, jobs.job_restore_patch(started, wl) or {})
    assert restored["spec"]["template"] == {**j["spec"]["template"]}
    assert jobs.job_restore_patch(restored, wl) is None  # nothing left to undo


def test_admission_check_pod_set_updates_reach_the_template_and_conflicts_refuse() -> None:
    """podSetUpdates of an admission check are merged in; a key the template already has
    with another value is a permanent error (the Workload finishes FailedToStart)."""
    j = job()
    wl = reserve(job_workload(j))
    wl["status"]["admissionChecks"] = [
        {
            "name": "prov",
            "state": api.CHECK_READY,
            "podSetUpdates": [
                {"name": "main", "labels": {"team": "ml"}, "annotations": {"note": "x"}}
            ],
        }
    ]
    template = jobs.job_start_patch(j, wl, {})["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["annotations"] == {"note": "x"}
    wl["status"]["admissionChecks"][0]["podSetUpdates"][0]["nodeSelector"] = {"zone": "b"}
    with pytest.raises(jobs.PodSetUpdateError) as err:
        jobs.job_start_patch(j, wl, {})
    assert str(err.value) == (
        "invalid admission check PodSetUpdate: conflict for nodeSelector: "
        "conflict for key=zone, value1=a, value2=b"
    )
    spot = model.Flavor("spot", node_labels={"zone": "c"})
    del wl["status"]["admissionChecks"][0]["podSetUpdates"][0]["nodeSelector"]
    wl["status"]["admissionChecks"][0]["podSetUpdates"][0]["labels"] = {api.PODSET_LABEL: "x"}
    with pytest.raises(jobs.PodSetUpdateError) as err:
        jobs.job_start_patch(j, wl, {"spot": spot})
    assert str(err.value) == (
        'in admission check "prov": invalid admission check PodSetUpdate: conflict for '
        f"labels: conflict for key={api.PODSET_LABEL}, value1=main, value2=x"
    )


def test_pod_ungate_removes_only_the_admission_gate() -> None:
    """A plain Pod is started as upstream's pod_controller.go ``prepare`` does: the
    admission gate removed, the flavor's node labels merged in, and the labels of
    getPodSetsInfoFromStatus (the pod set, and with AssignQueueLabelsForPods the
    LocalQueue and ClusterQueue); the Pod's own queue-name label stays."""
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "n",
            "uid": "pod-uid",
            "labels": {api.QUEUE_LABEL: "user-queue", "app": "x"},
        },
        "spec": {"schedulingGates": [{"name": api.ADMISSION_GATE}, {"name": "other"}]},
    }
    ref = jobs.ref_for_pod(pod)
    pod_sets = [{"name": api.DEFAULT_POD_SET, "count": 1, "template": jobs.pod_template(pod)}]
    wl = jobs.new_workload(ref, [pod], jobs.queue_name(pod), pod_sets, 0, None)
    wl = reserve(wl)
    out = jobs.pod_ungate(pod, wl, {"spot": model.Flavor("spot", node_labels={"a": "b"})})
    assert out["spec"]["schedulingGates"] == [{"name": "other"}]
    assert out["spec"]["nodeSelector"] == {"a": "b"}
    assert out["metadata"]["labels"] == {
        api.QUEUE_LABEL: "user-queue",
        "app": "x",
        api.PODSET_LABEL: "main",
        api.LOCAL_QUEUE_LABEL: "user-queue",
        api.CLUSTER_QUEUE_LABEL: "cq",
    }
    assert pod["metadata"]["labels"] == {api.QUEUE_LABEL: "user-queue", "app": "x"}


def test_pod_group_finishes_when_all_pods_ended_serving_when_all_are_gone() -> None:
    def pod(phase: str, **ann: str) -> dict[str, Any]:
        return {"metadata": {"annotations": ann}, "status": {"phase": phase}}

    assert jobs.group_finished([pod("Succeeded"), pod("Running")], 2)[0] is False
    assert jobs.group_finished([pod("Succeeded"), pod("Succeeded")], 2) == (
        True,
        True,
        "Pods succeeded",
    )
    assert jobs.group_finished([pod("Succeeded"), pod("Failed")], 2)[:2] == (True, False)
    serving = pod("Running", **{api.POD_GROUP_SERVING: "true"})
    assert jobs.group_finished([serving], 1)[0] is False


def test_priority_prefers_the_workload_priority_class_label() -> None:
    j = job()
    j["metadata"]["labels"][api.PRIORITY_CLASS_LABEL] = "batch"
    spec = {"priorityClassName": "high"}
    assert jobs.priority_of(j, spec, {"batch": 10}, {"high": 1000}) == (
        10,
        {"group": api.GROUP, "kind": "WorkloadPriorityClass", "name": "batch"},
    )
    del j["metadata"]["labels"][api.PRIORITY_CLASS_LABEL]
    assert jobs.priority_of(j, spec, {}, {"high": 1000})[0] == 1000


def test_preemption_message_matches_upstream() -> None:
    wl = {"metadata": {"uid": "w-uid", "labels": {api.JOB_UID_LABEL: "j-uid"}}}
    assert wlutil.preemption_message(wl, api.IN_CLUSTER_QUEUE, "/cq", "/cq") == (
        "Preempted to accommodate a workload (UID: w-uid, JobUID: j-uid) due to "
        "prioritization in the ClusterQueue; preemptor path: /cq; preemptee path: /cq"
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"manageJobsWithoutQueueName": True}, "manageJobsWithoutQueueName: true is not supported"),
        ({"multiKueue": {}}, "Configuration: multiKueue not supported by the lab's Kueue"),
        ({"integrations": {"frameworks": ["ray.io/rayjob"]}}, "ray.io/rayjob not implemented"),
        (
            {"featureGates": {"TopologyAwareScheduling": True}},
            "TopologyAwareScheduling is not implemented",
        ),
        (
            {"waitForPodsReady": {"timeout": "soon"}},
            "waitForPodsReady.timeout: 'soon' is not a duration",
        ),
    ],
)
def test_configuration_fields_the_lab_does_not_honour_are_rejected(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(raw)


def test_configuration_as_upstream_ships_it_is_accepted() -> None:
    config = parse(
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "health": {"healthProbeBindAddress": ":8081"},
            "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
            "webhook": {"port": 9443},
            "leaderElection": {"leaderElect": True},
            "integrations": {"frameworks": ["batch/job", "pod"]},
            "waitForPodsReady": {"timeout": "5m", "blockAdmission": True},
            "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare"]},
        }
    )
    assert config.wait_for_pods_ready and config.wait_for_pods_ready.timeout == 300
    assert config.fair_sharing == ("LessThanOrEqualToFinalShare",)
    assert config.cluster_queue_resource_metrics and config.frameworks == ("batch/job", "pod")
    assert config.not_applicable == ("leaderElection", "health")
    assert duration("1h30m", "x") == 5400
