"""Webhook decisions (gpulab.hami.webhook) and the AdmissionReview envelope, against HAMi
v2.10.0 ``Handle`` / NVIDIA ``MutateAdmission`` and controller-runtime's responses."""

from __future__ import annotations

import base64
import json
from typing import Any

import yaml

from gpulab.hami.config import NvidiaConfig
from gpulab.hami.webhook import WebhookConfig, decide, review
from harness.apply import MANIFESTS

CFG = WebhookConfig(scheduler_name="hami-scheduler")
V1BETA1 = "admission.k8s.io/v1beta1"


def pod(
    limits: dict[str, str] | None = None,
    scheduler: str = "default-scheduler",
    privileged: bool = False,
    init: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    ctr: dict[str, Any] = {"name": "main", "image": "x"}
    if limits is not None:
        ctr["resources"] = {"limits": limits}
    if privileged:
        ctr["securityContext"] = {"privileged": True}
    body: dict[str, Any] = {"schedulerName": scheduler, "containers": [ctr], **spec}
    if init is not None:
        body["initContainers"] = init
    return {"metadata": {"name": "p", "namespace": "default"}, "spec": body}


def ops(p: dict[str, Any], cfg: WebhookConfig = CFG) -> dict[str, Any]:
    d = decide(p, cfg)
    assert d.allowed, d.message
    return {op["path"]: op.get("value") for op in d.patch}


LIMITS = "/spec/containers/0/resources/limits/"


def test_pod_without_gpu_passes_unchanged() -> None:
    d = decide(pod({"cpu": "1"}), CFG)
    assert d.allowed and d.patch == [] and not d.gpu


def test_gpumem_without_a_card_count_gets_default_gpu_num_in_limits() -> None:
    paths = ops(pod({"nvidia.com/gpumem": "3000"}))
    assert paths[LIMITS + "nvidia.com~1gpu"] == "1"
    assert not any("/requests" in p for p in paths)  # limits only, as upstream
    assert paths["/spec/schedulerName"] == "hami-scheduler"
    none = WebhookConfig(scheduler_name="hami-scheduler", nvidia=NvidiaConfig(default_gpu_num=0))
    assert decide(pod({"nvidia.com/gpumem": "3000"}), none).patch == []


def test_a_card_only_request_gets_the_whole_cards_cores() -> None:
    assert ops(pod({"nvidia.com/gpu": "1"}))[LIMITS + "nvidia.com~1gpucores"] == "100"
    whole = ops(pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"}))
    assert whole[LIMITS + "nvidia.com~1gpucores"] == "100"
    for given in (
        {"nvidia.com/gpumem": "3000"},
        {"nvidia.com/gpumem-percentage": "50"},
        {"nvidia.com/gpucores": "20"},
    ):
        paths = ops(pod({"nvidia.com/gpu": "1", **given}))
        assert LIMITS + "nvidia.com~1gpucores" not in paths, given


def test_env_and_runtime_class_from_the_device_config() -> None:
    cfg = WebhookConfig(
        scheduler_name="hami-scheduler",
        nvidia=NvidiaConfig(
            gpu_core_policy="force", runtime_class_name="nvidia", overwrite_env=True
        ),
    )
    p = pod({"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}, init=[{"name": "setup"}])
    paths = ops(p, cfg)
    assert paths["/spec/runtimeClassName"] == "nvidia"
    app_env = [
        op["value"]
        for op in decide(p, cfg).patch
        if op["path"].startswith("/spec/containers/0/env")
    ]
    assert app_env == [
        [{"name": "CUDA_TASK_PRIORITY", "value": "1"}],
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
    ]
    # the init container asks for no GPU: overwriteEnv hides the GPUs from it
    init_env = [
        op["value"]
        for op in decide(p, cfg).patch
        if op["path"].startswith("/spec/initContainers/0/env")
    ]
    assert init_env[-1] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}
    assert "/spec/runtimeClassName" not in ops(
        pod({"nvidia.com/gpu": "1"}, runtimeClassName="x"), cfg
    )


def test_scheduler_name_rules() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}, scheduler="volcano"), CFG)
    assert (
        d.allowed and d.patch == [] and d.message == "pod already has different scheduler assigned"
    )
    assert "/spec/schedulerName" not in ops(
        pod({"nvidia.com/gpu": "1"}, scheduler="hami-scheduler")
    )
    keep = WebhookConfig(scheduler_name="hami-scheduler", force_overwrite_default_scheduler=False)
    assert decide(pod({"nvidia.com/gpu": "1"}), keep).patch == []
    # without --scheduler-name the webhook defaults resources but never sets a scheduler
    assert "/spec/schedulerName" not in ops(pod({"nvidia.com/gpu": "1"}), WebhookConfig())


def test_denials() -> None:
    d = decide(pod({"nvidia.com/gpu": "1"}, privileged=True), CFG)
    assert not d.allowed and d.code == 403 and d.message == "container main is privileged"
    assert decide(pod({"cpu": "1"}, privileged=True), CFG).allowed
    assert (
        decide(pod({"nvidia.com/gpu": "1"}, nodeName="n1"), CFG).message == "pod has node assigned"
    )
    p = pod()
    p["spec"]["containers"] = []
    assert decide(p, CFG).message == "pod has no containers"
    bad = decide(pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}), CFG)
    assert (bad.allowed, bad.code) == (False, 500) and "between 0 and 100" in bad.message


def test_resource_quota_counts_app_sum_against_init_peak() -> None:
    asked: list[tuple[str, int, int]] = []

    def fits(ns: str, mem: int, cores: int) -> bool:
        asked.append((ns, mem, cores))
        return mem <= 8000

    init = [
        {"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6000"}}}
    ]
    two = pod(
        {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "10"}, init=init
    )
    assert decide(two, CFG, "team-a", fits).allowed
    assert asked == [("team-a", 6000, 20)]  # max(2x3000, 6000) MiB, max(2x10, 0) cores
    big = pod({"nvidia.com/gpu": "3", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "10"})
    d = decide(big, CFG, "team-a", fits)
    assert not d.allowed and d.message == "exceeding resource quota"


def _review(p: Any, uid: str = "u1", version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    return {
        "apiVersion": version,
        "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"kind": "Pod"}, "operation": "CREATE", "object": p},
    }


def test_review_envelope_as_controller_runtime_writes_it() -> None:
    answer, _ = review(_review(pod({"nvidia.com/gpu": "1"})), CFG)
    resp = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert resp["uid"] == "u1" and resp["allowed"] is True and resp["patchType"] == "JSONPatch"
    assert resp["status"]["code"] == 200
    assert json.loads(base64.b64decode(resp["patch"]))[-1]["path"] == "/spec/schedulerName"
    denied, _ = review(_review(pod({"nvidia.com/gpu": "1"}, privileged=True)), CFG)
    assert denied["response"]["status"] == {
        "metadata": {},
        "code": 403,
        "reason": "Forbidden",
        "message": "container main is privileged",
    }


def test_a_v1beta1_review_is_answered_in_v1beta1() -> None:
    """The chart's webhook lists only v1beta1, so the API server sends v1beta1 reviews;
    controller-runtime answers each in the version it came in."""
    answer, decision = review(_review(pod({"nvidia.com/gpu": "1"}), version=V1BETA1), CFG)
    assert answer["apiVersion"] == V1BETA1 and answer["response"]["uid"] == "u1"
    assert decision.allowed and decision.gpu


def test_the_webhook_manifest_keeps_the_charts_defaults() -> None:
    """charts/hami/templates/scheduler/webhook.yaml with the v2.10.0 values: v1beta1
    reviews, and only the hami.io/webhook=ignore label excludes a namespace or a pod."""
    (hook,) = yaml.safe_load((MANIFESTS / "hami" / "webhook.yaml").read_text())["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1beta1"]
    ignore = [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]
    assert hook["namespaceSelector"] == {"matchExpressions": ignore}
    assert hook["objectSelector"] == {"matchExpressions": ignore}
    assert (hook["failurePolicy"], hook["reinvocationPolicy"]) == ("Ignore", "Never")


def test_undecodable_reviews_are_errored_400_never_an_http_error() -> None:
    for bad in ([], {"request": None}, "x", None):
        answer, decision = review(bad, CFG)
        assert decision.code == 400 and answer["response"]["allowed"] is False
        assert answer["response"]["uid"] == "" and "apiVersion" not in answer
    answer, _ = review(_review({"spec": {"containers": "nope"}}), CFG)
    assert answer["response"]["status"]["code"] == 400 and answer["response"]["uid"] == "u1"
    answer, _ = review(_review({"kind": "Deployment", "spec": {}}), CFG)
    assert answer["response"]["status"]["code"] == 400
