"""The Kueue controllers (informer handlers, reconcilers, scheduler loop) against the
in-memory API of kueue_fake, which enforces the API server's Job and Pod update rules."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from kueue_fake import FakeKube, new_manager, settle, steps, trace

from gpulab.informer import JOBS, NODES, PODS
from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.config import Configuration, WaitForPodsReady, parse
from gpulab.kueue.controllers import client as kc
from gpulab.kueue.controllers.manager import Manager
from gpulab.kueue.model import condition, timestamp
from gpulab.wait import wait_for

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
NS = "team"


def setup(kube: FakeKube, quota: int = 4, **spec: Any) -> None:
    kube.add(
        kc.NAMESPACES, {"metadata": {"name": NS, "labels": {"kubernetes.io/metadata.name": NS}}}
    )
    kube.add(
        kc.RESOURCE_FLAVORS,
        {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {"gpu": "a100"}}},
    )
    add_queue(kube, "cq", "lq", quota, **spec)


def add_queue(kube: FakeKube, cq: str, lq: str, quota: int, **spec: Any) -> None:
    """A ClusterQueue of ``quota`` a100 GPUs and a LocalQueue ``lq`` in NS pointing at it."""
    kube.add(
        kc.CLUSTER_QUEUES,
        {
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [GPU],
                        "flavors": [
                            {"name": "a100", "resources": [{"name": GPU, "nominalQuota": quota}]}
                        ],
                    }
                ],
                **spec,
            },
        },
    )
    kube.add(
        kc.LOCAL_QUEUES,
        {"metadata": {"name": lq, "namespace": NS}, "spec": {"clusterQueue": cq}},
    )


def job(name: str, gpus: int, queue: str = "lq", suspend: bool = True, **meta: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {api.QUEUE_LABEL: queue}, **meta},
        "spec": {
            "parallelism": 1,
            "suspend": suspend,
            "template": {
                "spec": {
                    "containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus)}}}],
                    "restartPolicy": "Never",
                }
            },
        },
    }


def workload_of(kube: FakeKube, name: str) -> Obj:
    j = kube.obj(JOBS, f"{NS}/{name}")
    key = f"{NS}/{wlutil.workload_name(name, j['metadata']['uid'], 'Job', 'batch')}"
    return kube.obj(kc.WORKLOADS, key)


def running(kube: FakeKube, name: str) -> bool:
    return kube.obj(JOBS, f"{NS}/{name}")["spec"]["suspend"] is False


def start_pods(kube: FakeKube, name: str) -> None:
    """What the Job controller does with an unsuspended Job: pods active, startTime set."""
    j = kube.obj(JOBS, f"{NS}/{name}")
    kube.patch_status(
        JOBS, j, {"status": {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"}}
    )


def stop_pods(kube: FakeKube, name: str) -> None:
    """What the Job controller does with a suspended Job: its pods deleted, Suspended."""
    j = kube.obj(JOBS, f"{NS}/{name}")
    suspended = {"type": "Suspended", "status": "True", "reason": "JobSuspended"}
    kube.patch_status(JOBS, j, {"status": {"active": 0, "ready": 0, "conditions": [suspended]}})


def complete(kube: FakeKube, name: str) -> None:
    j = kube.obj(JOBS, f"{NS}/{name}")
    done = {"type": "Complete", "status": "True", "message": "done"}
    kube.patch_status(JOBS, j, {"status": {"active": 0, "succeeded": 1, "conditions": [done]}})


def reason(wl: Obj, ctype: str) -> str | None:
    c = condition(wl, ctype)
    return c.get("reason") if c else None


def test_over_quota_waits_parked_and_is_requeued_when_a_workload_finishes() -> None:
    kube = FakeKube()
    setup(kube, quota=4)
    m, log = new_manager(
        kube, Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    )
    kube.add(JOBS, job("first", 4))
    settle(m)
    kube.add(JOBS, job("second", 2))
    settle(m)
    assert running(kube, "first") and not running(kube, "second")
    second = workload_of(kube, "second")
    assert reason(second, api.QUOTA_RESERVED) == api.REASON_WAITING_FOR_QUOTA
    assert condition(second, api.QUOTA_RESERVED)["message"] == (
        "couldn't assign flavors to pod set main: insufficient unused quota for "
        "nvidia.com/gpu in flavor a100, 2 more needed"
    )
    assert m.queues.pending("cq") == (0, 1)  # parked, not re-sorted every pass
    start_pods(kube, "first")
    complete(kube, "first")
    settle(m)  # Finished -> quota released -> QueueAssociatedInadmissibleWorkloadsAfter
    assert running(kube, "second")
    assert workload_of(kube, "second")["status"]["admission"]["podSetAssignments"][0][
        "flavors"
    ] == {GPU: "a100"}
    assert kube.obj(JOBS, f"{NS}/second")["spec"]["template"]["spec"]["nodeSelector"] == {
        "gpu": "a100"
    }
    for step in (
        "handleJobWithNoWorkload",
        "admit",
        "startJob",
        "requeueAndUpdate",
        "FinishWorkload",
    ):
        assert step in steps(log)
    assert not kube.rejected


def test_quota_raised_requeues_the_parked_workload() -> None:
    kube = FakeKube()
    setup(kube, quota=2)
    m, _ = new_manager(kube)
    kube.add(JOBS, job("big", 4))
    settle(m)
    assert not running(kube, "big")
    assert reason(workload_of(kube, "big"), api.QUOTA_RESERVED) == api.PENDING  # gate off
    cq = kube.obj(kc.CLUSTER_QUEUES, "cq")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 4
    kube.patch(kc.CLUSTER_QUEUES, cq, {"spec": cq["spec"]})
    settle(m)
    assert running(kube, "big")


def test_quota_raised_while_a_status_write_is_batched_still_requeues() -> None:
    """The batched status write of a ClusterQueue and its requeue request are two work
    queues' keys ("ClusterQueue:cq" in both): one must not swallow the other."""
    kube = FakeKube()
    setup(kube, quota=2)
    m, _ = new_manager(kube)
    kube.add(JOBS, job("big", 4))
    settle(m)
    assert not running(kube, "big")
    m.enqueue_status("cq", later=True)  # what a Workload event does, batched 1 s
    cq = kube.obj(kc.CLUSTER_QUEUES, "cq")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 4
    kube.patch(kc.CLUSTER_QUEUES, cq, {"spec": cq["spec"]})
    settle(m)
    assert running(kube, "big")


def test_flavor_added_later_makes_the_queue_active_and_admits() -> None:
    kube = FakeKube()
    setup(kube)
    kube.delete(kc.RESOURCE_FLAVORS, kube.obj(kc.RESOURCE_FLAVORS, "a100"))
    m, _ = new_manager(kube)
    kube.add(JOBS, job("w", 1))
    settle(m)
    active = condition(kube.obj(kc.CLUSTER_QUEUES, "cq"), "Active")
    assert (active["status"], active["reason"]) == ("False", api.CQ_REASON_FLAVOR_NOT_FOUND)
    assert (
        active["message"]
        == "Can't admit new workloads: references missing ResourceFlavor(s): a100."
    )
    assert not running(kube, "w")
    kube.add(
        kc.RESOURCE_FLAVORS, {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {"gpu": "a100"}}}
    )
    settle(m)
    assert running(kube, "w")


def test_restart_rebuilds_usage_and_does_not_admit_twice() -> None:
    kube = FakeKube()
    setup(kube, quota=2)
    m, _ = new_manager(kube)
    for name in ("a", "b", "c"):
        kube.add(JOBS, job(name, 1))
    settle(m)
    admitted = {n for n in ("a", "b", "c") if running(kube, n)}
    assert len(admitted) == 2
    writes = kube.writes
    m2, log2 = new_manager(kube)  # a new process over the same API objects
    settle(m2)
    assert {n for n in ("a", "b", "c") if running(kube, n)} == admitted
    assert "admit" not in steps(log2)
    assert kube.writes - writes < 10


def test_job_unsuspended_without_admission_is_suspended_again() -> None:
    kube = FakeKube()
    setup(kube, quota=1)
    m, log = new_manager(kube)
    kube.add(JOBS, job("sneaky", 2, suspend=False))
    settle(m)
    assert kube.obj(JOBS, f"{NS}/sneaky")["spec"]["suspend"] is True
    assert "stopJob" in steps(log)


def test_missing_local_queue_is_inadmissible_with_upstream_message() -> None:
    kube = FakeKube()
    setup(kube)
    m, _ = new_manager(
        kube, Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    )
    kube.add(JOBS, job("lost", 1, queue="no-such-queue"))
    settle(m)
    cond = condition(workload_of(kube, "lost"), api.QUOTA_RESERVED)
    assert (cond["reason"], cond["message"]) == (
        api.REASON_MISCONFIGURED,
        "LocalQueue no-such-queue is terminating or missing",
    )
    kube.add(
        kc.LOCAL_QUEUES,
        {"metadata": {"name": "no-such-queue", "namespace": NS}, "spec": {"clusterQueue": "cq"}},
    )
    settle(m)
    assert running(kube, "lost")


def test_preemption_stops_the_job_and_restores_its_template_in_the_allowed_order() -> None:
    kube = FakeKube()
    setup(kube, quota=2, preemption={"withinClusterQueue": "LowerPriority"})
    kube.add(kc.PRIORITY_CLASSES, {"metadata": {"name": "high"}, "value": 1000})
    m, log = new_manager(kube)
    kube.add(JOBS, job("low", 2))
    settle(m)
    start_pods(kube, "low")
    settle(m)
    high = job("high", 2)
    high["spec"]["template"]["spec"]["priorityClassName"] = "high"
    kube.add(JOBS, high)
    settle(m)
    low = workload_of(kube, "low")
    assert reason(low, api.EVICTED) == api.EVICTED_BY_PREEMPTION
    assert reason(low, api.PREEMPTED) == api.IN_CLUSTER_QUEUE
    lowjob = kube.obj(JOBS, f"{NS}/low")
    assert lowjob["spec"]["suspend"] is True
    # the API server refuses a template change while pods are active: not yet restored
    assert lowjob["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert not running(kube, "high")  # the quota is released once the pods are gone
    stop_pods(kube, "low")
    settle(m)
    assert "nodeSelector" not in kube.obj(JOBS, f"{NS}/low")["spec"]["template"]["spec"]
    assert running(kube, "high")
    assert reason(workload_of(kube, "low"), api.REQUEUED) == api.EVICTED_BY_PREEMPTION
    assert "IssuePreemptions" in steps(log)
    assert not kube.rejected  # never patched a running Job's template


def test_admission_not_recorded_gives_the_quota_back() -> None:
    kube = FakeKube()
    setup(kube, quota=1)
    m, log = new_manager(kube)
    kube.conflicts_left = 5  # every write of the first admission attempt conflicts
    kube.add(JOBS, job("a", 1))
    settle(m)
    # the quota assumed for the failed attempt was given back, or the quota of 1 would
    # have left no room for the second attempt
    assert running(kube, "a") and len(m.cache.workloads) == 1
    assert steps(log).count("admit") == 1


def test_a_job_write_the_api_server_fails_is_retried() -> None:
    """A 500 (the API server could not call a webhook while the controller's pod was
    replaced) goes back to the work queue, as controller-runtime's Reconcile error does:
    no watch event would bring the Job back."""
    kube = FakeKube()
    setup(kube, quota=1)
    m, _ = new_manager(kube)
    kube.job_errors_left = 1  # the patch that unsuspends the Job
    kube.add(JOBS, job("a", 1))
    settle(m)
    assert kube.job_errors_left == 0 and running(kube, "a")


def test_hold_and_drain_evicts_admitted_workloads() -> None:
    kube = FakeKube()
    setup(kube, quota=2)
    m, _ = new_manager(kube)
    kube.add(JOBS, job("a", 1))
    settle(m)
    assert running(kube, "a")
    cq = kube.obj(kc.CLUSTER_QUEUES, "cq")
    kube.patch(kc.CLUSTER_QUEUES, cq, {"spec": {"stopPolicy": "HoldAndDrain"}})
    settle(m)
    assert reason(workload_of(kube, "a"), api.EVICTED) == api.EVICTED_BY_CQ_STOPPED
    assert not running(kube, "a")


def checked_world(kube: FakeKube) -> tuple[Manager, io.StringIO]:
    """A ClusterQueue whose admissions wait for the gpus-healthy check, and node n1
    (gpu=a100) with one of its 8 GPUs unhealthy, so the check holds until it heals."""
    setup(kube, admissionChecksStrategy={"admissionChecks": [{"name": "gpus-healthy"}]})
    kube.add(
        kc.ADMISSION_CHECKS,
        {
            "metadata": {"name": "gpus-healthy"},
            "spec": {"controllerName": "gpulab.io/gpus-healthy"},
        },
    )
    node = {
        "metadata": {"name": "n1", "labels": {"gpu": "a100"}},
        "status": {"capacity": {GPU: "8"}, "allocatable": {GPU: "7"}},
    }
    kube.add(NODES, node)
    return new_manager(kube)


def test_admission_check_waits_for_healthy_gpus() -> None:
    kube = FakeKube()
    m, log = checked_world(kube)
    kube.add(JOBS, job("w", 1))
    settle(m)
    wl = workload_of(kube, "w")
    assert wlutil.has_quota_reservation(wl) and not wlutil.is_admitted(wl)
    [check] = wl["status"]["admissionChecks"]
    assert check["state"] == api.CHECK_PENDING
    assert check["message"] == "waiting for healthy GPUs: n1 has 7/8 healthy"
    assert not running(kube, "w")
    kube.patch_status(NODES, kube.obj(NODES, "n1"), {"status": {"allocatable": {GPU: "8"}}})
    settle(m)
    wl = workload_of(kube, "w")
    assert wl["status"]["admissionChecks"][0]["state"] == api.CHECK_READY
    assert wlutil.is_admitted(wl) and running(kube, "w")
    assert "SyncAdmittedCondition" in steps(log)


def test_wait_for_pods_ready_evicts_after_the_timeout_with_backoff() -> None:
    kube = FakeKube()
    setup(kube)
    config = Configuration(
        wait_for_pods_ready=WaitForPodsReady(timeout=60, backoff_base_seconds=10)
    )
    m, _ = new_manager(kube, config)
    kube.add(JOBS, job("slow", 1))
    settle(m)
    assert running(kube, "slow")
    assert reason(workload_of(kube, "slow"), api.PODS_READY) == api.WAIT_FOR_START
    admitted_at = wlutil.now_rfc3339()
    kube.clock = (timestamp(admitted_at) or 0) + 61
    m.workload_q.add(f"{NS}/{workload_of(kube, 'slow')['metadata']['name']}")
    settle(m)
    wl = workload_of(kube, "slow")
    assert reason(wl, api.EVICTED) == api.EVICTED_BY_PODS_READY_TIMEOUT
    assert wl["status"]["requeueState"]["count"] == 1
    assert not running(kube, "slow")


def reconcile_jobs(m: Any) -> None:
    """The job reconciler alone: Workloads created, no scheduling cycle yet."""
    while (key := m.job_q.get(timeout=0)) is not None:
        m.jobs.reconcile(key)
        m.job_q.done(key)


def test_block_admission_counts_a_workload_as_not_ready_from_the_moment_it_is_assumed() -> None:
    """waitForPodsReadyIfNeeded: with blockAdmission, two heads of one cycle (two
    ClusterQueues) are not both admitted. The first is not ready from the moment the
    scheduler assumes it (clusterqueue.go addOrUpdateWorkload), not from when the watch
    brings its QuotaReserved update; the events are held back here until the cycle blocks.
    The second is told to wait (QuotaReserved=False, Waiting) until PodsReady."""
    kube = FakeKube()
    setup(kube)
    add_queue(kube, "cq2", "lq2", 4)
    config = Configuration(wait_for_pods_ready=WaitForPodsReady(timeout=300, block_admission=True))
    names = ("first", "second")
    m, log = new_manager(kube, config)
    kube.add(JOBS, job(names[0], 1))
    kube.add(JOBS, job(names[1], 1, queue="lq2"))
    reconcile_jobs(m)
    heads = m.queues.heads()
    assert len(heads) == 2
    kube.hold()  # the watch is slower than the scheduler
    cycle = threading.Thread(target=m.scheduler.schedule, args=(heads,), daemon=True)
    cycle.start()
    wait_for(
        lambda: (
            not cycle.is_alive()
            or any(reason(workload_of(kube, n), api.QUOTA_RESERVED) == api.WAITING for n in names)
        ),
        5,
        "the cycle to admit one Workload and block",
    )
    cycle.join(0.2)
    assert cycle.is_alive(), "both Workloads were admitted in one cycle"
    reserved = [n for n in names if wlutil.has_quota_reservation(workload_of(kube, n))]
    waiting = [n for n in names if reason(workload_of(kube, n), api.QUOTA_RESERVED) == api.WAITING]
    assert len(reserved) == 1 and len(waiting) == 1 and reserved != waiting
    kube.release()
    reconcile_jobs(m)  # the admitted Job starts
    assert running(kube, reserved[0])
    start_pods(kube, reserved[0])
    reconcile_jobs(m)  # PodsReady=True on the admitted one
    cycle.join(5)
    assert not cycle.is_alive()
    settle(m)
    assert running(kube, waiting[0])
    assert "waitForPodsReadyIfNeeded" in steps(log)


def test_credits_transformation_caps_the_shared_quota_at_14() -> None:
    config = parse(
        {
            "resources": {
                "transformations": [
                    {"input": "cpu", "strategy": "Retain", "outputs": {"cpu_credits": 1}}
                ]
            }
        }
    )
    kube = FakeKube()
    kube.add(kc.NAMESPACES, {"metadata": {"name": NS}})
    for name in ("on-demand", "spot", "credits"):
        kube.add(kc.RESOURCE_FLAVORS, {"metadata": {"name": name}})
    kube.add(
        kc.CLUSTER_QUEUES,
        {
            "metadata": {"name": "cq"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": "on-demand",
                                "resources": [{"name": "cpu", "nominalQuota": 9}],
                            },
                            {"name": "spot", "resources": [{"name": "cpu", "nominalQuota": 9}]},
                        ],
                    },
                    {
                        "coveredResources": ["cpu_credits"],
                        "flavors": [
                            {
                                "name": "credits",
                                "resources": [{"name": "cpu_credits", "nominalQuota": 14}],
                            }
                        ],
                    },
                ],
            },
        },
    )
    kube.add(
        kc.LOCAL_QUEUES,
        {"metadata": {"name": "lq", "namespace": NS}, "spec": {"clusterQueue": "cq"}},
    )
    m, _ = new_manager(kube, config)
    for i in range(6):
        j = job(f"j{i}", 0)
        j["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "3"}}
        kube.add(JOBS, j)
    settle(m)
    assert sum(running(kube, f"j{i}") for i in range(6)) == 4  # 12 credits of 14, not 18 CPUs


# -- a Job edit reaches its Workload (ensureOneWorkload, handleQueueNameChange) -------------


def test_raising_parallelism_of_a_running_job_cannot_escape_quota() -> None:
    """The Workload no longer matches the Job: the Job is stopped, its template
    restored, the Workload deleted; the new Workload (3 pods) waits for quota."""
    kube = FakeKube()
    setup(kube, quota=4)
    m, log = new_manager(kube)
    grow = job("grow", 2)
    grow["spec"]["completions"] = 3  # the pod count is parallelism capped by completions
    kube.add(JOBS, grow)
    settle(m)
    start_pods(kube, "grow")
    settle(m)
    old = workload_of(kube, "grow")
    assert running(kube, "grow") and wlutil.is_admitted(old)
    kube.patch(JOBS, kube.obj(JOBS, f"{NS}/grow"), {"spec": {"parallelism": 3}})
    settle(m)
    assert kube.obj(JOBS, f"{NS}/grow")["spec"]["suspend"] is True
    assert workload_of(kube, "grow")["metadata"]["uid"] == old["metadata"]["uid"]  # pods left
    stops = [line for line in trace(log) if line["step"] == "stopJob"]
    # the learner sees where the lab differs: upstream deletes the Workload at once
    assert [line["message"] for line in stops] == [
        "Job suspended: No matching Workload; restoring pod templates according to existent "
        "Workload (lab: the Workload, and its quota, is kept until the Job's pods are gone; "
        "upstream deletes it now)"
    ]
    stop_pods(kube, "grow")
    settle(m)
    j = kube.obj(JOBS, f"{NS}/grow")
    assert "nodeSelector" not in j["spec"]["template"]["spec"]  # restored
    assert api.PODSET_LABEL not in (j["spec"]["template"].get("metadata") or {}).get("labels", {})
    assert "startTime" not in (j.get("status") or {})
    new = workload_of(kube, "grow")
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["spec"]["podSets"][0]["count"] == 3
    assert not wlutil.has_quota_reservation(new) and not m.cache.workloads
    assert "ensureOneWorkload" in steps(log)
    assert not kube.rejected


def test_suspended_job_edit_updates_its_workload() -> None:
    """updateWorkloadToMatchJob: a queued Job cut from 3 to 2 pods gets the same Workload
    with the new count, which now fits."""
    kube = FakeKube()
    setup(kube, quota=4)
    m, log = new_manager(kube)
    big = job("shrink", 2)
    big["spec"]["parallelism"] = 3
    kube.add(JOBS, big)
    settle(m)
    uid = workload_of(kube, "shrink")["metadata"]["uid"]
    assert not running(kube, "shrink")
    kube.patch(JOBS, kube.obj(JOBS, f"{NS}/shrink"), {"spec": {"parallelism": 2}})
    settle(m)
    wl = workload_of(kube, "shrink")
    assert wl["metadata"]["uid"] == uid and wl["spec"]["podSets"][0]["count"] == 2
    assert running(kube, "shrink")
    assert "updateWorkloadToMatchJob" in steps(log)


def test_relabelling_a_suspended_job_moves_its_workload_to_the_new_local_queue() -> None:
    kube = FakeKube()
    setup(kube, quota=4)
    m, log = new_manager(
        kube, Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    )
    kube.add(JOBS, job("lost", 1, queue="no-such-queue"))
    settle(m)
    assert reason(workload_of(kube, "lost"), api.QUOTA_RESERVED) == api.REASON_MISCONFIGURED
    j = kube.obj(JOBS, f"{NS}/lost")
    kube.patch(JOBS, j, {"metadata": {"labels": {api.QUEUE_LABEL: "lq"}}})
    settle(m)
    wl = workload_of(kube, "lost")
    assert wl["spec"]["queueName"] == "lq"
    assert wl["status"]["admission"]["clusterQueue"] == "cq"
    assert running(kube, "lost")
    assert "handleQueueNameChange" in steps(log)


# -- pending reasons and kueue_unadmitted_workloads ---------------------------------------------


def test_unadmitted_workloads_metric_counts_why_workloads_wait() -> None:
    kube = FakeKube()
    setup(kube, quota=4)
    config = Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    m, _ = new_manager(kube, config)
    kube.add(JOBS, job("first", 4))
    settle(m)
    kube.add(JOBS, job("second", 2))
    kube.add(JOBS, job("third", 1))
    settle(m)

    def waiting(cause: str) -> float | None:
        return m.metrics.registry.get_sample_value(
            "kueue_unadmitted_workloads",
            {
                "cluster_queue": "cq",
                "reason": "NoReservation",
                "underlying_cause": cause,
                "replica_role": "standalone",
            },
        )

    assert running(kube, "first")
    assert waiting(api.REASON_WAITING_FOR_QUOTA) == 2
    start_pods(kube, "first")
    complete(kube, "first")
    settle(m)
    assert running(kube, "second") and running(kube, "third")
    assert waiting(api.REASON_WAITING_FOR_QUOTA) is None  # nothing waits: no series


def test_unadmitted_workloads_metric_is_not_served_without_the_gate() -> None:
    kube = FakeKube()
    setup(kube, quota=1)
    m, _ = new_manager(kube)
    kube.add(JOBS, job("big", 2))
    settle(m)
    assert not [
        s
        for metric in m.metrics.registry.collect()
        if metric.name == "kueue_unadmitted_workloads"
        for s in metric.samples
    ]


# -- pod templates: podset labels, conflicts ----------------------------------------------------


def test_pods_get_podset_and_queue_labels_and_a_conflict_fails_to_start() -> None:
    """startJob merges the flavor's node labels into the template; a key the template
    already has with another value (a nodeSelector changed while the Job waited for its
    admission check) finishes the Workload FailedToStart instead of overwriting it."""
    kube = FakeKube()
    m, log = checked_world(kube)
    kube.add(JOBS, job("ok", 1))
    kube.add(JOBS, job("moved", 1))
    settle(m)
    j = kube.obj(JOBS, f"{NS}/moved")
    kube.patch(JOBS, j, {"spec": {"template": {"spec": {"nodeSelector": {"gpu": "h100"}}}}})
    kube.patch_status(NODES, kube.obj(NODES, "n1"), {"status": {"allocatable": {GPU: "8"}}})
    settle(m)
    labels = kube.obj(JOBS, f"{NS}/ok")["spec"]["template"]["metadata"]["labels"]
    assert running(kube, "ok")
    assert labels == {
        api.PODSET_LABEL: "main",
        api.LOCAL_QUEUE_LABEL: "lq",
        api.CLUSTER_QUEUE_LABEL: "cq",
    }
    moved = workload_of(kube, "moved")
    finished = condition(moved, api.FINISHED)
    assert (finished["status"], finished["reason"]) == ("True", api.FINISHED_FAILED_TO_START)
    assert finished["message"] == (
        "invalid admission check PodSetUpdate: conflict for nodeSelector: "
        "conflict for key=gpu, value1=h100, value2=a100"
    )
    assert not running(kube, "moved") and not m.cache.is_added(f"{NS}/{moved['metadata']['name']}")
    assert "FinishWorkload" in steps(log)


# -- admissibility: resources, LimitRange, DRA -------------------------------------------------


def limit_range(**limits: Any) -> Obj:
    return {"metadata": {"name": "limits", "namespace": NS}, "spec": {"limits": [limits]}}


def test_limit_range_defaults_count_and_its_bounds_make_the_workload_misconfigured() -> None:
    kube = FakeKube()
    setup(kube, quota=4)
    kube.add(kc.LIMIT_RANGES, limit_range(type="Container", max={GPU: "2"}))
    m, _ = new_manager(
        kube, Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    )
    kube.add(JOBS, job("greedy", 3))
    kube.add(JOBS, job("fine", 2))
    settle(m)
    cond = condition(workload_of(kube, "greedy"), api.QUOTA_RESERVED)
    assert (cond["status"], cond["reason"]) == ("False", api.REASON_MISCONFIGURED)
    assert cond["message"] == (
        "resources didn't satisfy LimitRange constraints: spec.podSets[0].template.spec."
        'containers[0]: Invalid value: ["nvidia.com/gpu"]: requests must not be above the '
        "limitRange max"
    )
    assert running(kube, "fine") and not running(kube, "greedy")


def test_a_request_above_its_defaulted_limit_is_misconfigured() -> None:
    """ValidateResources after AdjustResources: the LimitRange's default limit (1 GPU)
    lies under the container's request."""
    kube = FakeKube()
    setup(kube, quota=4)
    kube.add(kc.LIMIT_RANGES, limit_range(type="Container", default={GPU: "1"}))
    m, _ = new_manager(
        kube, Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    )
    kube.add(JOBS, job("over", 2))
    settle(m)
    cond = condition(workload_of(kube, "over"), api.QUOTA_RESERVED)
    assert (cond["reason"], cond["message"]) == (
        api.REASON_MISCONFIGURED,
        "resources validation failed: spec.podSets[0].template.spec.containers[0]: "
        'Invalid value: ["nvidia.com/gpu"]: requests must not exceed its limits',
    )


def test_limit_range_default_request_is_counted_against_quota() -> None:
    kube = FakeKube()
    setup(kube, quota=4)
    kube.add(kc.LIMIT_RANGES, limit_range(type="Container", defaultRequest={GPU: "3"}))
    m, _ = new_manager(kube)
    for name in ("a", "b"):
        j = job(name, 0)
        j["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
        kube.add(JOBS, j)
    settle(m)
    assert sum(running(kube, n) for n in ("a", "b")) == 1  # 3 + 3 > 4
    admitted = next(workload_of(kube, n) for n in ("a", "b") if running(kube, n))
    assert admitted["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {GPU: "3"}


def dra_job(name: str, claim: Obj) -> Obj:
    j = job(name, 0)
    spec = j["spec"]["template"]["spec"]
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    spec["resourceClaims"] = [{"name": "gpu", **claim}]
    return j


def test_dra_claims_are_refused_not_admitted_uncounted() -> None:
    kube = FakeKube()
    setup(kube, quota=4)
    kube.add(
        kc.RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "one-gpu", "namespace": NS},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                }
            },
        },
    )
    m, _ = new_manager(
        kube, Configuration(feature_gates={"UnadmittedWorkloadsObservability": True})
    )
    kube.add(JOBS, dra_job("templated", {"resourceClaimTemplateName": "one-gpu"}))
    kube.add(JOBS, dra_job("claimed", {"resourceClaimName": "shared-gpu"}))
    kube.add(JOBS, dra_job("missing", {"resourceClaimTemplateName": "nope"}))
    settle(m)
    expected = {
        "templated": (
            "spec.podSets[0].template.spec.resourceClaims[0].resourceClaimTemplateName: "
            'Not found: "DeviceClass gpu.nvidia.com is not mapped in DRA configuration for '
            'podset main"'
        ),
        "claimed": "KueueDRAIntegration feature does not support use of resource claims",
        "missing": (
            "spec.podSets[0].template.spec.resourceClaims[0]: Internal error: failed to get "
            "claim spec for ResourceClaimTemplate nope in podset main: "
            'resourceclaimtemplates.resource.k8s.io "nope" not found'
        ),
    }
    for name, message in expected.items():
        wl = workload_of(kube, name)
        cond = condition(wl, api.QUOTA_RESERVED)
        assert (cond["reason"], cond["message"]) == (api.REASON_MISCONFIGURED, message), name
        requeued = condition(wl, api.REQUEUED)
        assert (requeued["status"], requeued["reason"]) == ("False", api.INADMISSIBLE)
        assert not running(kube, name)
    assert not m.cache.workloads and m.queues.pending("cq") == (0, 0)


# -- a preempted single pod is not requeued (SkipReassignmentForPodOwnedWorkloads) -------------


def queued_pod(name: str, gpus: int, priority_class: str = "") -> Obj:
    """A plain Pod as the pod webhook leaves it: managed, gated, with the finalizer."""
    spec: Obj = {
        "schedulingGates": [{"name": api.ADMISSION_GATE}],
        "containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus)}}}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {api.QUEUE_LABEL: "lq", api.MANAGED_LABEL: "true"},
            "finalizers": [api.POD_FINALIZER],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def test_a_preempted_single_pod_workload_is_not_requeued() -> None:
    kube = FakeKube()
    setup(
        kube,
        quota=2,
        preemption={"withinClusterQueue": "LowerPriority"},
        admissionChecksStrategy={"admissionChecks": [{"name": "gpus-healthy"}]},
    )
    kube.add(
        kc.ADMISSION_CHECKS,
        {
            "metadata": {"name": "gpus-healthy"},
            "spec": {"controllerName": "gpulab.io/gpus-healthy"},
        },
    )
    # the check stays Pending: the low pod holds quota while still gated
    node = {
        "metadata": {"name": "n1", "labels": {"gpu": "a100"}},
        "status": {"capacity": {GPU: "8"}, "allocatable": {GPU: "7"}},
    }
    kube.add(NODES, node)
    kube.add(kc.PRIORITY_CLASSES, {"metadata": {"name": "high"}, "value": 1000})
    m, _ = new_manager(kube)
    kube.add(PODS, queued_pod("low", 2))
    settle(m)
    uid = kube.obj(PODS, f"{NS}/low")["metadata"]["uid"]
    low_key = f"{NS}/{wlutil.workload_name('low', uid, 'Pod', '')}"
    assert wlutil.has_quota_reservation(kube.obj(kc.WORKLOADS, low_key))
    kube.add(PODS, queued_pod("high", 2, "high"))
    settle(m)
    low = kube.obj(kc.WORKLOADS, low_key)
    assert reason(low, api.EVICTED) == api.EVICTED_BY_PREEMPTION
    requeued = condition(low, api.REQUEUED)
    assert (requeued["status"], requeued["reason"]) == ("False", api.EVICTED_BY_PREEMPTION)
    assert not wlutil.has_quota_reservation(low)


def test_a_gated_pod_gets_podset_and_queue_labels_and_a_conflict_fails_to_start() -> None:
    """The Pod path of startJob (pod_controller.go ``Run`` → ``prepare``): an admitted
    Pod is ungated with the podset and queue labels; a Pod given nodeSelector gpu=h100
    while gated (an addition the API server allows) cannot take the a100 flavor's
    gpu=a100, so its Workload finishes FailedToStart and the Pod stays gated."""
    kube = FakeKube()
    m, log = checked_world(kube)
    kube.add(PODS, queued_pod("ok", 1))
    kube.add(PODS, queued_pod("moved", 1))
    settle(m)
    moved_pod = kube.obj(PODS, f"{NS}/moved")
    uid = moved_pod["metadata"]["uid"]
    moved_key = f"{NS}/{wlutil.workload_name('moved', uid, 'Pod', '')}"
    assert wlutil.has_quota_reservation(kube.obj(kc.WORKLOADS, moved_key))
    kube.patch(PODS, moved_pod, {"spec": {"nodeSelector": {"gpu": "h100"}}})
    kube.patch_status(NODES, kube.obj(NODES, "n1"), {"status": {"allocatable": {GPU: "8"}}})
    settle(m)
    ok = kube.obj(PODS, f"{NS}/ok")
    assert not ok["spec"].get("schedulingGates")
    assert ok["spec"]["nodeSelector"] == {"gpu": "a100"}
    assert ok["metadata"]["labels"] == {
        api.QUEUE_LABEL: "lq",
        api.MANAGED_LABEL: "true",
        api.PODSET_LABEL: "main",
        api.LOCAL_QUEUE_LABEL: "lq",
        api.CLUSTER_QUEUE_LABEL: "cq",
    }
    moved = kube.obj(kc.WORKLOADS, moved_key)
    finished = condition(moved, api.FINISHED)
    assert (finished["status"], finished["reason"]) == ("True", api.FINISHED_FAILED_TO_START)
    assert finished["message"] == (
        "invalid admission check PodSetUpdate: conflict for nodeSelector: "
        "conflict for key=gpu, value1=h100, value2=a100"
    )
    moved_pod = kube.obj(PODS, f"{NS}/moved")
    assert moved_pod["spec"]["schedulingGates"] == [{"name": api.ADMISSION_GATE}]
    assert moved_pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert not m.cache.is_added(moved_key)
    assert "FinishWorkload" in steps(log)


# -- StrictFIFO --------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", [api.STRICT_FIFO, api.BEST_EFFORT_FIFO])
def test_strict_fifo_holds_the_queue_behind_its_head(strategy: str) -> None:
    """StrictFIFO: the older Workload that does not fit blocks the younger one that
    would; BestEffortFIFO parks it and admits the younger one."""
    kube = FakeKube()
    setup(kube, quota=4, queueingStrategy=strategy)
    m, _ = new_manager(kube)
    kube.add(JOBS, job("running", 3))
    settle(m)
    kube.clock += 1
    kube.add(JOBS, job("older", 2))
    settle(m)
    kube.clock += 1
    kube.add(JOBS, job("younger", 1))
    settle(m)
    assert running(kube, "running") and not running(kube, "older")
    assert running(kube, "younger") is (strategy == api.BEST_EFFORT_FIFO)
