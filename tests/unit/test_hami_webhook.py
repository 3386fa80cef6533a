"""Webhook decisions (gpulab.hami.webhook) and the AdmissionReview envelope."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from gpulab.hami.webhook import ReviewError, WebhookConfig, decide, review

CFG = WebhookConfig()


def pod(
    limits: dict[str, str] | None = None,
    scheduler: str = "default-scheduler",
    privileged: bool = False,
    **spec: Any,
) -> dict[str, Any]:
    ctr: dict[str, Any] = {"name": "main", "image": "x"}
    if limits is not None:
        ctr["resources"] = {"limits": limits}
    if privileged:
        ctr["securityContext"] = {"privileged": True}
    return {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"schedulerName": scheduler, "containers": [ctr], **spec},
    }


def test_pod_without_gpu_passes_unchanged() -> None:
    d = decide(pod({"cpu": "1"}), CFG)
    assert d.allowed and d.patch == [] and not d.gpu


def test_gpu_pod_gets_hami_scheduler() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}), CFG)
    assert d.allowed
    assert {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"} in d.patch


def test_gpu_asked_in_requests_only_counts_too() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpucores": "20"}}
    d = decide(p, WebhookConfig(default_gpu_count=1))
    assert d.gpu and any(op["path"] == "/spec/schedulerName" for op in d.patch)


def test_other_explicit_scheduler_is_left_alone() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}, scheduler="volcano"), CFG)
    assert d.allowed and d.patch == []
    assert "different scheduler" in d.message


def test_already_hami_scheduler_needs_no_scheduler_patch() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}, scheduler="hami-scheduler"), CFG)
    assert d.allowed and d.patch == []


def test_privileged_gpu_container_is_rejected() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}, privileged=True), CFG)
    assert not d.allowed and d.message == "container main is privileged"
    assert decide(pod({"cpu": "1"}, privileged=True), CFG).allowed


def test_gpumem_without_gpu_count_is_rejected_or_defaulted() -> None:
    d = decide(pod({"nvidia.com/gpumem": "3000"}), CFG)
    assert not d.allowed and "without nvidia.com/gpu" in d.message
    d = decide(pod({"nvidia.com/gpumem": "3000"}), WebhookConfig(default_gpu_count=1))
    assert d.allowed
    paths = {op["path"]: op.get("value") for op in d.patch}
    assert paths["/spec/containers/0/resources/limits/nvidia.com~1gpu"] == "1"
    assert paths["/spec/containers/0/resources/requests/nvidia.com~1gpu"] == "1"
    assert paths["/spec/containers/0/resources/requests"] == {}  # created before filling


def test_defaults_for_memory_and_cores_are_written() -> None:
    cfg = WebhookConfig(default_mem=2000, default_cores=25)
    d = decide(pod({"nvidia.com/gpu": "1"}), cfg)
    values = {op["path"]: op.get("value") for op in d.patch}
    assert values["/spec/containers/0/resources/limits/nvidia.com~1gpumem"] == "2000"
    assert values["/spec/containers/0/resources/limits/nvidia.com~1gpucores"] == "25"
    given = decide(pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}), cfg)
    assert not any("gpumem" in op["path"] for op in given.patch)


def test_pod_with_node_assigned_is_rejected() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}, nodeName="n1"), CFG)
    assert not d.allowed and d.message == "pod has node assigned"


def test_pod_without_containers_is_rejected() -> None:
    p = pod()
    p["spec"]["containers"] = []
    assert decide(p, CFG).message == "pod has no containers"


def _review(p: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": operation, "object": p},
    }


def test_review_envelope_carries_a_base64_json_patch() -> None:
    answer, _ = review(_review(pod({"nvidia.com/gpu": "1"})), CFG)
    resp = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert resp["uid"] == "u1" and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(resp["patch"]))
    assert ops[-1]["path"] == "/spec/schedulerName"


def test_review_denial_has_status_message_and_no_patch() -> None:
    answer, _ = review(_review(pod({"nvidia.com/gpu": "1"}, privileged=True)), CFG)
    resp = answer["response"]
    assert resp["allowed"] is False and "patch" not in resp
    assert resp["status"]["message"] == "container main is privileged"
    assert resp["status"]["code"] == 403


def test_review_ignores_updates_and_rejects_non_reviews() -> None:
    answer, _ = review(_review(pod({"nvidia.com/gpu": "1"}), operation="UPDATE"), CFG)
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
    for bad in ([], {"request": None}, {"request": {"uid": 5}}, "x"):
        with pytest.raises(ReviewError):
            review(bad, CFG)
    answer, _ = review(_review({"spec": {"containers": "nope"}}), CFG)
    assert answer["response"]["allowed"] is False and answer["response"]["status"]["code"] == 400
