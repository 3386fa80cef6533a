"""CRD conversion v1beta1 <-> v1beta2 (gpulab.kueue.conversion)."""

from __future__ import annotations

import copy

import pytest

from gpulab.kueue.conversion import V1BETA1, V1BETA2, ConversionError, convert, review

CQ_V1BETA1 = {
    "apiVersion": V1BETA1,
    "kind": "ClusterQueue",
    "metadata": {"name": "team-a"},
    "spec": {
        "cohort": "gpu-team",
        "admissionChecks": ["prov"],
        "flavorFungibility": {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [
                    {
                        "name": "f",
                        "resources": [{"name": "cpu", "nominalQuota": 9, "borrowingLimit": "2"}],
                    }
                ],
            }
        ],
    },
    "status": {"pendingWorkloads": 1, "admittedWorkloads": 2},
}

LQ_V1BETA1 = {
    "apiVersion": V1BETA1,
    "kind": "LocalQueue",
    "metadata": {"name": "user-queue", "namespace": "default"},
    "spec": {"clusterQueue": "cluster-queue"},
    "status": {"flavorUsage": [{"name": "f", "resources": [{"name": "cpu", "total": "3"}]}]},
}

WL_V1BETA1 = {
    "apiVersion": V1BETA1,
    "kind": "Workload",
    "metadata": {"name": "job-a-12345", "namespace": "default"},
    "spec": {
        "queueName": "user-queue",
        "priority": 100,
        "priorityClassName": "high",
        "priorityClassSource": "scheduling.k8s.io/priorityclass",
        "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": []}}}],
    },
    "status": {"accumulatedPastExexcutionTimeSeconds": 42},
}


def test_cluster_queue_cohort_is_renamed() -> None:
    out = convert(CQ_V1BETA1, V1BETA2)
    assert out["apiVersion"] == V1BETA2
    assert out["spec"]["cohortName"] == "gpu-team"
    assert "cohort" not in out["spec"]
    assert out["spec"]["admissionChecksStrategy"] == {"admissionChecks": [{"name": "prov"}]}
    assert "admissionChecks" not in out["spec"]
    assert out["spec"]["resourceGroups"] == CQ_V1BETA1["spec"]["resourceGroups"]
    back = convert(out, V1BETA1)
    assert back["spec"]["cohort"] == "gpu-team" and "cohortName" not in back["spec"]


def test_deprecated_fungibility_values_become_may_stop_search() -> None:
    old = copy.deepcopy(CQ_V1BETA1)
    old["spec"]["flavorFungibility"] = {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"}
    out = convert(old, V1BETA2)
    assert out["spec"]["flavorFungibility"] == {
        "whenCanBorrow": "MayStopSearch",
        "whenCanPreempt": "MayStopSearch",
    }


@pytest.mark.parametrize("obj", [LQ_V1BETA1, WL_V1BETA1], ids=["LocalQueue", "Workload"])
def test_round_trip_is_lossless(obj: dict) -> None:
    there = convert(obj, V1BETA2)
    assert there != obj
    assert convert(there, V1BETA1) == obj


def test_round_trip_from_the_hub() -> None:
    hub = convert(CQ_V1BETA1, V1BETA2)
    assert convert(convert(hub, V1BETA1), V1BETA2) == hub


def test_local_queue_and_workload_fields() -> None:
    lq = convert(LQ_V1BETA1, V1BETA2)
    assert lq["status"]["flavorsUsage"] == LQ_V1BETA1["status"]["flavorUsage"]
    wl = convert(WL_V1BETA1, V1BETA2)
    assert wl["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }
    assert "priorityClassName" not in wl["spec"] and "priorityClassSource" not in wl["spec"]
    assert wl["status"] == {"accumulatedPastExecutionTimeSeconds": 42}
    wpc = convert(
        {
            **wl,
            "spec": {
                **wl["spec"],
                "priorityClassRef": {
                    "group": "kueue.x-k8s.io",
                    "kind": "WorkloadPriorityClass",
                    "name": "batch",
                },
            },
        },
        V1BETA1,
    )
    assert wpc["spec"]["priorityClassSource"] == "kueue.x-k8s.io/workloadpriorityclass"


def test_input_is_not_modified_and_same_version_is_a_copy() -> None:
    before = copy.deepcopy(CQ_V1BETA1)
    convert(CQ_V1BETA1, V1BETA2)
    assert before == CQ_V1BETA1
    same = convert(CQ_V1BETA1, V1BETA1)
    assert same == CQ_V1BETA1 and same is not CQ_V1BETA1


def test_unsupported_conversions_fail() -> None:
    with pytest.raises(ConversionError):
        convert({**CQ_V1BETA1, "kind": "Topology"}, V1BETA2)
    with pytest.raises(ConversionError):
        convert(CQ_V1BETA1, "kueue.x-k8s.io/v1alpha1")


WL_V1BETA2 = convert(WL_V1BETA1, V1BETA2)


@pytest.mark.parametrize(
    ("obj", "to", "message"),
    [
        (
            {**CQ_V1BETA1, "spec": {"flavorFungibility": "x"}},
            V1BETA2,
            "ClusterQueue team-a: spec.flavorFungibility: must be an object",
        ),
        ({**CQ_V1BETA1, "status": "x"}, V1BETA2, "ClusterQueue team-a: status: must be an object"),
        ({**CQ_V1BETA1, "spec": True}, V1BETA2, "ClusterQueue team-a: spec: must be an object"),
        (
            {**CQ_V1BETA1, "spec": {"admissionChecks": "prov"}},
            V1BETA2,
            "ClusterQueue team-a: spec.admissionChecks: must be a list of names",
        ),
        (
            {**CQ_V1BETA1, "apiVersion": V1BETA2, "spec": ["x"]},
            V1BETA1,
            "ClusterQueue team-a: spec: must be an object",
        ),
        (
            {**LQ_V1BETA1, "status": 7},
            V1BETA2,
            "LocalQueue default/user-queue: status: must be an object",
        ),
        (
            {**WL_V1BETA1, "spec": {"priorityClassName": {"a": 1}}},
            V1BETA2,
            "Workload default/job-a-12345: spec.priorityClassName: must be a string",
        ),
        (
            {**WL_V1BETA2, "spec": {"priorityClassRef": "high"}},
            V1BETA1,
            "Workload default/job-a-12345: spec.priorityClassRef: must be an object",
        ),
        (
            {**WL_V1BETA2, "spec": {"priorityClassRef": {"name": 3}}},
            V1BETA1,
            "Workload default/job-a-12345: spec.priorityClassRef.name: must be a string",
        ),
        (
            {**WL_V1BETA2, "metadata": None, "status": []},
            V1BETA1,
            "Workload (no name): status: must be an object",
        ),
    ],
)
def test_a_field_of_the_wrong_type_is_named(obj: dict, to: str, message: str) -> None:
    """Each field a converter reads is type-checked and refused with its path, in one
    line (upstream's decoder refuses such a field), never with an exception's text."""
    with pytest.raises(ConversionError) as info:
        convert(obj, to)
    assert str(info.value) == message


def test_null_fields_convert_as_absent() -> None:
    out = convert({**CQ_V1BETA1, "spec": {"flavorFungibility": None}, "status": None}, V1BETA2)
    assert out["spec"] == {"flavorFungibility": None} and out["status"] is None


def test_review_reports_failure_per_protocol() -> None:
    ok = review(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "u1", "desiredAPIVersion": V1BETA2, "objects": [CQ_V1BETA1]},
        }
    )
    assert ok["response"]["uid"] == "u1"
    assert ok["response"]["result"] == {"status": "Success"}
    assert ok["response"]["convertedObjects"][0]["spec"]["cohortName"] == "gpu-team"
    bad = review({"request": {"uid": "u2", "objects": [CQ_V1BETA1]}})
    assert bad["response"]["result"]["status"] == "Failure"
    assert "desiredAPIVersion" in bad["response"]["result"]["message"]
    odd = review({"request": {"uid": 5, "desiredAPIVersion": V1BETA2, "objects": "x"}})
    assert odd["response"] == {
        "uid": "",
        "convertedObjects": [],
        "result": {"status": "Failure", "message": "request.objects must be a list"},
    }
