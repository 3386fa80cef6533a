"""The manager's reconcile + schedule passes against an in-memory API (no cluster)."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

from kubernetes.client.rest import ApiException

from gpulab.kueue import api, model
from gpulab.kueue import workload as wlutil
from gpulab.kueue.api import FlavorResource
from gpulab.kueue.controllers.client import (
    ALL,
    CLUSTER_QUEUES,
    JOBS,
    LOCAL_QUEUES,
    RESOURCE_FLAVORS,
    WORKLOADS,
    Resource,
    key_of,
)
from gpulab.kueue.controllers.informer import SYNC, Event
from gpulab.kueue.controllers.manager import Manager
from gpulab.trace import Tracer

Obj = dict[str, Any]


def _merge(target: Obj, patch: Obj) -> None:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def _prune_nulls(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _prune_nulls(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_prune_nulls(v) for v in d]
    return d


class FakeKube:
    """What the manager calls on KubeClient, with resourceVersion conflicts."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Obj]] = {r.plural: {} for r in ALL}
        self.rv = 0
        self.priorities: dict[str, int] = {}
        self.writes = 0

    def _bump(self, obj: Obj) -> Obj:
        self.rv += 1
        self.writes += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def add(self, res: Resource, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{self.rv % 60:02d}Z")
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        self.objects[res.plural][key_of(obj)] = obj
        return self._bump(obj)

    def create(self, res: Resource, body: Obj) -> Obj:
        if key_of(body) in self.objects[res.plural]:
            raise ApiException(status=409, reason="AlreadyExists")
        return self.add(res, body)

    def _get(self, res: Resource, obj: Obj) -> Obj:
        cur = self.objects[res.plural].get(key_of(obj))
        if cur is None:
            raise ApiException(status=404, reason="NotFound")
        return cur

    def patch(self, res: Resource, obj: Obj, body: Obj) -> Obj:
        cur = self._get(res, obj)
        _merge(cur, {k: v for k, v in body.items() if k != "status"})
        return self._bump(cur)

    def patch_status(self, res: Resource, obj: Obj, body: Obj) -> Obj:
        cur = self._get(res, obj)
        _merge(cur, {"status": body.get("status") or {}})
        return self._bump(cur)

    def replace_status(self, res: Resource, obj: Obj) -> Obj:
        cur = self._get(res, obj)
        if obj["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        cur["status"] = _prune_nulls(copy.deepcopy(obj.get("status") or {}))
        return self._bump(cur)

    def namespace_labels(self) -> dict[str, dict[str, str]]:
        return {"default": {"kubernetes.io/metadata.name": "default"}}

    def priority_class_value(self, name: str) -> int | None:
        return self.priorities.get(name)

    # what watches would deliver
    def get(self, res: Resource, key: str) -> Obj:
        return self.objects[res.plural][key]


def new_manager(kube: FakeKube) -> tuple[Manager, io.StringIO]:
    log = io.StringIO()
    return Manager(kube, Tracer("kueue-controller", None, stream=log)), log  # type: ignore[arg-type]


def settle(m: Manager, kube: FakeKube, rounds: int = 6) -> None:
    """Deliver the API's state to the manager (as relists) until nothing changes."""
    for _ in range(rounds):
        before = kube.writes
        for res in ALL:
            m._apply(
                Event(
                    res, SYNC, items=tuple(copy.deepcopy(list(kube.objects[res.plural].values())))
                )
            )
        m.process(m._everything())
        if kube.writes == before:
            return
    raise AssertionError("controllers did not settle")


def setup_queues(
    kube: FakeKube, cpu: int = 9, flavor: str = "default-flavor", **cq_spec: Any
) -> None:
    kube.add(
        RESOURCE_FLAVORS,
        {"metadata": {"name": "default-flavor"}, "spec": {"nodeLabels": {"pool": "batch"}}},
    )
    kube.add(
        CLUSTER_QUEUES,
        {
            "metadata": {"name": "cluster-queue"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {"name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu}]}
                        ],
                    }
                ],
                **cq_spec,
            },
        },
    )
    kube.add(
        LOCAL_QUEUES,
        {
            "metadata": {"name": "user-queue", "namespace": "default"},
            "spec": {"clusterQueue": "cluster-queue"},
        },
    )


def add_job(
    kube: FakeKube,
    name: str,
    cpu: str = "3",
    queue: str = "user-queue",
    suspend: bool = True,
    priority_class: str = "",
) -> Obj:
    pod: Obj = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
        "restartPolicy": "Never",
    }
    if priority_class:
        pod["priorityClassName"] = priority_class
    return kube.add(
        JOBS,
        {
            "metadata": {"name": name, "namespace": "default", "labels": {api.QUEUE_LABEL: queue}},
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "suspend": suspend,
                "template": {"spec": pod},
            },
        },
    )


def workload_of(kube: FakeKube, job_name: str) -> Obj:
    job = kube.get(JOBS, f"default/{job_name}")
    [wl] = [
        w
        for w in kube.objects[WORKLOADS.plural].values()
        if wlutil.owner_job_uid(w) == job["metadata"]["uid"]
    ]
    return wl


def steps(log: io.StringIO) -> list[str]:
    return [json.loads(line)["step"] for line in log.getvalue().splitlines()]


def test_jobs_wait_for_quota_then_run_when_quota_frees() -> None:
    kube = FakeKube()
    setup_queues(kube)
    for i in range(4):
        add_job(kube, f"job-{i}")
    m, log = new_manager(kube)
    settle(m, kube)

    for i in range(3):
        job = kube.get(JOBS, f"default/job-{i}")
        assert job["spec"]["suspend"] is False
        assert job["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "batch"}
        wl = workload_of(kube, f"job-{i}")
        assert wlutil.is_admitted(wl)
        assert wl["metadata"]["ownerReferences"][0]["name"] == f"job-{i}"
    assert kube.get(JOBS, "default/job-3")["spec"]["suspend"] is True
    waiting = workload_of(kube, "job-3")
    assert model.condition(waiting, api.QUOTA_RESERVED)["reason"] == api.REASON_WAITING_FOR_QUOTA
    cq = kube.get(CLUSTER_QUEUES, "cluster-queue")["status"]
    assert (cq["pendingWorkloads"], cq["admittedWorkloads"]) == (1, 3)
    assert cq["flavorsUsage"][0]["resources"][0]["total"] == "9"
    assert model.condition(kube.get(CLUSTER_QUEUES, "cluster-queue"), "Active")["status"] == "True"
    lq = kube.get(LOCAL_QUEUES, "default/user-queue")["status"]
    assert (lq["pendingWorkloads"], lq["admittedWorkloads"]) == (1, 3)

    # job-0 completes: its Workload finishes, the quota goes to job-3.
    done = kube.objects[JOBS.plural]["default/job-0"]
    done["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    settle(m, kube)
    assert model.condition(workload_of(kube, "job-0"), api.FINISHED)["reason"] == "Succeeded"
    assert kube.get(JOBS, "default/job-3")["spec"]["suspend"] is False
    assert m.cache.used("cluster-queue", FlavorResource("default-flavor", "cpu")) == 9
    assert {"Reconcile", "FindClusterQueue", "Admit", "Unsuspend", "Finish"} <= set(steps(log))


def test_restart_rebuilds_usage_and_does_not_admit_twice() -> None:
    kube = FakeKube()
    setup_queues(kube, cpu=6)
    for i in range(3):
        add_job(kube, f"job-{i}")
    m, _ = new_manager(kube)
    settle(m, kube)
    admitted = {k for k, w in kube.objects[WORKLOADS.plural].items() if wlutil.is_admitted(w)}
    assert len(admitted) == 2

    restarted, _ = new_manager(kube)
    settle(restarted, kube)
    assert restarted.cache.used("cluster-queue", FlavorResource("default-flavor", "cpu")) == 6
    again = {k for k, w in kube.objects[WORKLOADS.plural].items() if wlutil.is_admitted(w)}
    assert again == admitted


def test_job_unsuspended_without_admission_is_suspended_again() -> None:
    kube = FakeKube()
    setup_queues(kube, cpu=1)
    add_job(kube, "runner", suspend=False)
    m, log = new_manager(kube)
    settle(m, kube)
    assert kube.get(JOBS, "default/runner")["spec"]["suspend"] is True
    assert "Stop" in steps(log)


def test_missing_local_queue_keeps_job_suspended_with_reason() -> None:
    kube = FakeKube()
    setup_queues(kube)
    add_job(kube, "lost", queue="no-such-queue")
    m, log = new_manager(kube)
    settle(m, kube)
    assert kube.get(JOBS, "default/lost")["spec"]["suspend"] is True
    cond = model.condition(workload_of(kube, "lost"), api.QUOTA_RESERVED)
    assert (cond["status"], cond["reason"]) == ("False", api.REASON_MISCONFIGURED)
    assert cond["message"] == "LocalQueue no-such-queue is terminating or missing"
    assert "FindClusterQueue" in steps(log)


def test_cluster_queue_with_unknown_flavor_is_inactive() -> None:
    kube = FakeKube()
    setup_queues(kube, flavor="no-such-flavor")
    add_job(kube, "j")
    m, log = new_manager(kube)
    settle(m, kube)
    cq = kube.get(CLUSTER_QUEUES, "cluster-queue")
    active = model.condition(cq, "Active")
    assert (active["status"], active["reason"]) == ("False", "FlavorNotFound")
    assert "no-such-flavor" in active["message"]
    wl = model.condition(workload_of(kube, "j"), api.QUOTA_RESERVED)
    assert wl["message"] == "ClusterQueue cluster-queue is inactive"
    assert kube.get(JOBS, "default/j")["spec"]["suspend"] is True
    lines = [json.loads(x) for x in log.getvalue().splitlines()]
    assert any(x["step"] == "Reconcile" and "inactive" in x["message"] for x in lines)


def test_priority_preemption_evicts_and_suspends_the_lower_priority_job() -> None:
    kube = FakeKube()
    kube.priorities["high"] = 100
    setup_queues(kube, cpu=3, preemption={"withinClusterQueue": "LowerPriority"})
    add_job(kube, "low")
    m, log = new_manager(kube)
    settle(m, kube)
    assert kube.get(JOBS, "default/low")["spec"]["suspend"] is False

    add_job(kube, "high", priority_class="high")
    settle(m, kube)
    low_wl = workload_of(kube, "low")
    evicted = model.condition(low_wl, api.EVICTED)
    assert (evicted["status"], evicted["reason"]) == ("True", "Preempted")
    assert model.condition(low_wl, api.PREEMPTED)["reason"] == api.IN_CLUSTER_QUEUE
    assert not wlutil.has_quota_reservation(low_wl)
    assert kube.get(JOBS, "default/low")["spec"]["suspend"] is True
    # The restored template no longer carries the flavor's nodeSelector.
    assert "nodeSelector" not in kube.get(JOBS, "default/low")["spec"]["template"]["spec"]
    assert workload_of(kube, "high")["spec"]["priority"] == 100
    assert wlutil.is_admitted(workload_of(kube, "high"))
    assert kube.get(JOBS, "default/high")["spec"]["suspend"] is False
    assert "Evict" in steps(log)


def test_admission_not_recorded_gives_quota_back() -> None:
    kube = FakeKube()
    setup_queues(kube, cpu=3)
    job = add_job(kube, "j")
    wl = kube.add(WORKLOADS, wlutil.workload_for_job(job))
    m, _ = new_manager(kube)
    for res in ALL:
        items = copy.deepcopy(list(kube.objects[res.plural].values()))
        m._apply(Event(res, SYNC, items=tuple(items)))
    # Someone else wrote the Workload after our informer saw it: our PUT conflicts.
    kube.objects[WORKLOADS.plural][key_of(wl)]["metadata"]["resourceVersion"] = "newer"
    m.process(m._everything())
    assert not wlutil.is_admitted(kube.get(WORKLOADS, key_of(wl)))
    assert m.cache.used("cluster-queue", FlavorResource("default-flavor", "cpu")) == 0
    assert kube.get(JOBS, "default/j")["spec"]["suspend"] is True
    settle(m, kube)  # the next pass, on fresh data, admits it
    assert wlutil.is_admitted(kube.get(WORKLOADS, key_of(wl)))
