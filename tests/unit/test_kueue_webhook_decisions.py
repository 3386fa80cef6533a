"""The webhooks' decisions: defaulting patches and the validators' field errors, as
the API server receives them in an AdmissionReview."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from gpulab.kueue import api, webhook
from gpulab.kueue.webhook import Lookups, review

Obj = dict[str, Any]


def request(obj: Obj, operation: str = "CREATE", old: Obj | None = None) -> Obj:
    req: Obj = {"uid": "u-1", "operation": operation, "object": obj, "namespace": "team"}
    if old is not None:
        req["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def patched(obj: Obj, answer: Obj) -> Obj:
    """Apply the JSONPatch of an answer (the ops json_patch emits)."""
    out = copy.deepcopy(obj)
    ops = json.loads(base64.b64decode(answer["response"].get("patch", "W10=")))
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        target = out
        for p in parents:
            target = target[p]
        if op["op"] == "remove":
            del target[last]
        else:
            target[last] = op["value"]
    return out


def job(labels: Obj | None = None, suspend: bool | None = None) -> Obj:
    spec: Obj = {"template": {"spec": {"containers": [{"name": "c"}]}}}
    if suspend is not None:
        spec["suspend"] = suspend
    return {"metadata": {"name": "j", "namespace": "team", "labels": labels or {}}, "spec": spec}


def test_queued_job_is_suspended_others_untouched() -> None:
    queued = job({api.QUEUE_LABEL: "lq"}, suspend=False)
    answer = review(webhook.MUTATE_JOB_PATH, request(queued), Lookups())
    assert answer["response"]["allowed"] and answer["response"]["uid"] == "u-1"
    assert patched(queued, answer)["spec"]["suspend"] is True
    plain = job()
    assert "patch" not in review(webhook.MUTATE_JOB_PATH, request(plain), Lookups())["response"]


def test_default_local_queue_and_priority_class() -> None:
    lookups = Lookups(
        local_queue_exists=lambda ns, name: (ns, name) == ("team", "default"),
        priority_class_exists=lambda name: name == "default",
        gates={"WorkloadPriorityClassDefaulting": True},
    )
    out = patched(job(), review(webhook.MUTATE_JOB_PATH, request(job()), lookups))
    assert out["metadata"]["labels"] == {
        api.QUEUE_LABEL: "default",
        api.PRIORITY_CLASS_LABEL: "default",
    }
    assert out["spec"]["suspend"] is True


def test_pod_with_a_queue_is_gated_labelled_and_finalized() -> None:
    pod = {"metadata": {"name": "p", "labels": {api.QUEUE_LABEL: "lq"}}, "spec": {"containers": []}}
    out = patched(pod, review("/mutate--v1-pod", request(pod), Lookups()))
    assert out["metadata"]["labels"][api.MANAGED_LABEL] == "true"
    assert out["metadata"]["finalizers"] == [api.POD_FINALIZER]
    assert out["spec"]["schedulingGates"] == [{"name": api.ADMISSION_GATE}]


def test_pods_of_a_queued_job_are_left_to_the_job_integration() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "labels": {api.QUEUE_LABEL: "lq"},
            "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}],
        },
        "spec": {},
    }
    lookups = Lookups(job_queued=lambda ns, name: name == "j")
    assert "patch" not in review("/mutate--v1-pod", request(pod), lookups)["response"]


def test_deployment_template_is_marked_and_its_pods_are_gated() -> None:
    dep = {
        "metadata": {"name": "web", "labels": {api.QUEUE_LABEL: "lq"}},
        "spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {}}},
    }
    out = patched(dep, review("/mutate-apps-v1-deployment", request(dep), Lookups()))
    template = out["spec"]["template"]["metadata"]
    assert template["annotations"] == {api.SUSPENDED_BY_PARENT: "deployment"}
    assert template["labels"] == {"app": "web", api.MANAGED_LABEL: "true", api.QUEUE_LABEL: "lq"}
    pod = {"metadata": {"name": "web-1", **copy.deepcopy(template)}, "spec": {}}
    gated = patched(pod, review("/mutate--v1-pod", request(pod), Lookups()))
    assert gated["spec"]["schedulingGates"] == [{"name": api.ADMISSION_GATE}]


def test_statefulset_pods_form_one_group_of_replicas() -> None:
    sts = {
        "metadata": {"name": "db", "uid": "s-1", "labels": {api.QUEUE_LABEL: "lq"}},
        "spec": {"replicas": 3},
    }
    pod = {
        "metadata": {
            "name": "db-0",
            "annotations": {api.SUSPENDED_BY_PARENT: "statefulset"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": True}],
        },
        "spec": {},
    }
    out = patched(
        pod, review("/mutate--v1-pod", request(pod), Lookups(statefulset=lambda ns, n: sts))
    )
    assert out["metadata"]["labels"][api.POD_GROUP_NAME_LABEL].startswith("statefulset-db-")
    assert out["metadata"]["annotations"][api.POD_GROUP_TOTAL_COUNT] == "3"
    assert out["metadata"]["labels"][api.QUEUE_LABEL] == "lq"


def denied(path: str, obj: Obj, operation: str = "CREATE", old: Obj | None = None) -> str:
    response = review(path, request(obj, operation, old), Lookups())["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    return str(response["status"]["message"])


def cq(*groups: Obj, cohort: str | None = None) -> Obj:
    spec: Obj = {"resourceGroups": list(groups)}
    if cohort:
        spec["cohortName"] = cohort
    return {"metadata": {"name": "cq"}, "spec": spec}


def group(resources: list[str], *flavors: tuple[str, list[Obj]]) -> Obj:
    return {
        "coveredResources": resources,
        "flavors": [{"name": n, "resources": r} for n, r in flavors],
    }


CQ_PATH = "/validate-kueue-x-k8s-io-v1beta2-clusterqueue"


def test_overlapping_resources_and_flavors_are_rejected() -> None:
    gpu = [{"name": "nvidia.com/gpu", "nominalQuota": 4}]
    message = denied(
        CQ_PATH,
        cq(
            group(["nvidia.com/gpu"], ("a100", gpu)),
            group(["nvidia.com/gpu"], ("a100", gpu)),
        ),
    )
    assert message == (
        '[spec.resourceGroups[1].coveredResources[0]: Duplicate value: "nvidia.com/gpu", '
        'spec.resourceGroups[1].flavors[0].name: Duplicate value: "a100"]'
    )


@pytest.mark.parametrize(
    ("quota", "cohort", "message"),
    [
        (
            {"name": "nvidia.com/gpu", "nominalQuota": 4, "lendingLimit": 5},
            "c",
            'lendingLimit: Invalid value: "5": must be less than or equal to the nominalQuota',
        ),
        (
            {"name": "nvidia.com/gpu", "nominalQuota": 4, "borrowingLimit": 1},
            None,
            'borrowingLimit: Invalid value: "1": must be nil when cohort is empty',
        ),
        (
            {"name": "cpu", "nominalQuota": 4},
            None,
            'resources[0].name: Invalid value: "cpu": must match the name in coveredResources',
        ),
    ],
)
def test_quota_rules_of_the_release(quota: Obj, cohort: str | None, message: str) -> None:
    assert message in denied(
        CQ_PATH, cq(group(["nvidia.com/gpu"], ("a100", [quota])), cohort=cohort)
    )


def test_valid_cluster_queue_is_allowed() -> None:
    ok = cq(group(["nvidia.com/gpu"], ("a100", [{"name": "nvidia.com/gpu", "nominalQuota": 4}])))
    assert review(CQ_PATH, request(ok), Lookups())["response"] == {"uid": "u-1", "allowed": True}


def test_running_job_may_not_change_its_queue() -> None:
    old = job({api.QUEUE_LABEL: "a"}, suspend=False)
    new = job({api.QUEUE_LABEL: "b"}, suspend=False)
    assert denied("/validate-batch-v1-job", new, "UPDATE", old) == (
        f'metadata.labels[{api.QUEUE_LABEL}]: Invalid value: "b": field is immutable'
    )
    new["spec"]["suspend"] = True
    response = review("/validate-batch-v1-job", request(new, "UPDATE", old), Lookups())
    assert response["response"]["allowed"]


def test_features_the_lab_lacks_are_rejected_not_ignored() -> None:
    j = job({api.QUEUE_LABEL: "lq"})
    j["metadata"]["annotations"] = {api.JOB_MIN_PARALLELISM: "1"}
    assert "partial admission is not supported by the lab's Kueue" in denied(
        "/validate-batch-v1-job", j
    )


def test_workload_pod_sets_are_immutable_while_quota_is_reserved() -> None:
    reserved = {
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "main"}]},
        }
    }
    old = {
        "metadata": {"name": "w"},
        "spec": {"podSets": [{"name": "main", "count": 1}]},
        **reserved,
    }
    new = copy.deepcopy(old)
    new["spec"]["podSets"][0]["count"] = 2
    assert "spec.podSets: Invalid value:" in denied(
        "/validate-kueue-x-k8s-io-v1beta2-workload", new, "UPDATE", old
    )


def test_pod_group_needs_its_total_count() -> None:
    pod = {"metadata": {"name": "p", "labels": {api.POD_GROUP_NAME_LABEL: "g"}}, "spec": {}}
    assert denied("/validate--v1-pod", pod) == (
        f"metadata.annotations[{api.POD_GROUP_TOTAL_COUNT}]: Required value: both the "
        f"'{api.POD_GROUP_TOTAL_COUNT}' annotation and the '{api.POD_GROUP_NAME_LABEL}' label "
        "should be set"
    )


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"request": []},
        {"request": {"uid": 7, "operation": "CREATE"}},
        {"request": {"uid": "x", "operation": "EXPLODE"}},
        {"request": {"uid": "x", "operation": "CREATE", "object": "nope"}},
        {"request": {"uid": "x", "operation": "CREATE", "object": {"metadata": 5, "spec": []}}},
    ],
)
def test_malformed_reviews_are_answered_in_the_protocol(body: Obj) -> None:
    for path in webhook.ROUTES:
        response = review(path, body, Lookups())["response"]
        assert isinstance(response["uid"], str)
        assert isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert response["status"]["code"] in (400, 403) and response["status"]["message"]
