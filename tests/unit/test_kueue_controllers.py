"""The Kueue controllers (informer handlers, reconcilers, scheduler loop) against the
in-memory API of kueue_fake, which enforces the API server's Job and Pod update rules."""

from __future__ import annotations

import threading
from typing import Any

from kueue_fake import FakeKube, new_manager, settle, steps

from gpulab.informer import JOBS, NODES
from gpulab.kueue import api
from gpulab.kueue import workload as wlutil
from gpulab.kueue.config import Configuration, WaitForPodsReady, parse
from gpulab.kueue.controllers import client as kc
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
    kube.add(
        kc.CLUSTER_QUEUES,
        {
            "metadata": {"name": "cq"},
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
        {"metadata": {"name": "lq", "namespace": NS}, "spec": {"clusterQueue": "cq"}},
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
    assert "nodeSelector" not in lowjob["spec"]["template"]["spec"]  # restored
    # the Job controller notices the suspension: no pods left
    kube.patch_status(JOBS, lowjob, {"status": {"active": 0}})
    settle(m)
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


def test_admission_check_waits_for_healthy_gpus() -> None:
    kube = FakeKube()
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
    m, log = new_manager(kube)
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


def test_block_admission_holds_the_scheduler_until_admitted_pods_are_ready() -> None:
    """waitForPodsReadyIfNeeded: with blockAdmission the next Workload is told to wait
    (QuotaReserved=False, Waiting) and the scheduler blocks until PodsReady."""
    kube = FakeKube()
    setup(kube)
    config = Configuration(wait_for_pods_ready=WaitForPodsReady(timeout=300, block_admission=True))
    m, log = new_manager(kube, config)
    kube.add(JOBS, job("first", 1))
    settle(m)
    assert running(kube, "first")
    kube.add(JOBS, job("second", 1))
    while (key := m.job_q.get(timeout=0)) is not None:  # the Workload, no cycle yet
        m.jobs.reconcile(key)
        m.job_q.done(key)
    cycle = threading.Thread(target=m.scheduler.schedule, args=(m.queues.heads(),))
    cycle.start()
    wait_for(
        lambda: reason(workload_of(kube, "second"), api.QUOTA_RESERVED) == api.WAITING,
        5,
        "second to be told to wait",
    )
    cycle.join(0.5)
    assert cycle.is_alive() and not running(kube, "second")
    start_pods(kube, "first")
    while (key := m.job_q.get(timeout=0)) is not None:  # PodsReady=True on first
        m.jobs.reconcile(key)
        m.job_q.done(key)
    cycle.join(5)
    assert not cycle.is_alive()
    settle(m)
    assert running(kube, "second")
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
