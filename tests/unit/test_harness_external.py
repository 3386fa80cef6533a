"""The external backend's decisions: is NVIDIA's device plugin there, which objects are
someone else's, in which order `down` deletes, which image the cluster pulls."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.external import (
    Ref,
    deletion_order,
    foreign_gpu_plugin,
    foreign_objects,
    kubeconfig_for,
    with_image,
)
from harness.spec import parse

SPEC = parse({"name": "ext-unit", "nodes": [{"name": "x"}]})


def ds(name: str, ns: str = "kube-system", image: str = "busybox", labels=None) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}]}}},
    }


def node(name: str, gpus: str | None) -> dict:
    capacity = {"cpu": "8"} | ({"nvidia.com/gpu": gpus} if gpus is not None else {})
    return {"metadata": {"name": name}, "status": {"capacity": capacity}}


def our_pod(on: str) -> dict:
    return {
        "metadata": {"labels": {"app.kubernetes.io/name": "gpulab-device-plugin"}},
        "spec": {"nodeName": on},
    }


@pytest.mark.parametrize(
    "daemonset",
    [
        ds("nvidia-device-plugin-daemonset"),  # NVIDIA's static manifest
        ds("nvdp-nvidia-device-plugin", ns="nvidia"),  # the Helm chart
        ds("plugin", ns="gpu-operator", image="nvcr.io/nvidia/k8s-device-plugin:v0.17.1"),
    ],
)
def test_nvidias_daemonset_is_found_by_name_or_image(daemonset: dict) -> None:
    reason = foreign_gpu_plugin([daemonset], [], [])
    assert reason.startswith("NVIDIA's device plugin runs (DaemonSet ")
    assert daemonset["metadata"]["name"] in reason


def test_our_own_daemonset_is_not_nvidias() -> None:
    ours = ds(
        "gpulab-device-plugin",
        ns="gpulab-system",
        image="gpulab:dev",
        labels={"app.kubernetes.io/name": "gpulab-device-plugin"},
    )
    assert foreign_gpu_plugin([ours, ds("kube-proxy")], [], [node("a", None)]) == ""


def test_a_node_advertising_gpus_without_our_plugin_means_another_plugin() -> None:
    reason = foreign_gpu_plugin([], [our_pod("gpu-1")], [node("gpu-1", "8"), node("gpu-2", "4")])
    assert reason == (
        "node gpu-2 already advertises nvidia.com/gpu=4 and no gpulab device-plugin pod runs there"
    )


def test_gpus_our_plugin_advertises_or_zero_gpus_are_fine() -> None:
    assert foreign_gpu_plugin([], [our_pod("gpu-1")], [node("gpu-1", "8"), node("c", "0")]) == ""


def test_objects_that_exist_and_are_not_ours_are_foreign() -> None:
    a, b, c = (
        Ref("v1", "Namespace", "a"),
        Ref("v1", "ConfigMap", "b", "a"),
        Ref("v1", "Secret", "c"),
    )
    assert foreign_objects([a, b, c], existing={a, b}, ours={b}) == [a]
    assert foreign_objects([a, b, c], existing=set(), ours=set()) == []


def test_down_deletes_webhooks_first_then_in_reverse() -> None:
    ns = Ref("v1", "Namespace", "kueue-system")
    crd = Ref("apiextensions.k8s.io/v1", "CustomResourceDefinition", "q")
    dep = Ref("apps/v1", "Deployment", "ctl", "kueue-system")
    hook = Ref("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", "h")
    assert deletion_order([ns, crd, dep, hook]) == [hook, dep, crd, ns]


def test_the_lab_image_is_replaced_in_every_container_of_pod_templates_and_pods() -> None:
    daemonset = {
        "kind": "DaemonSet",
        "spec": {
            "template": {
                "spec": {
                    "initContainers": [{"image": "gpulab:dev"}],
                    "containers": [{"image": "gpulab:dev"}, {"image": "busybox"}],
                }
            }
        },
    }
    out = with_image(daemonset, "registry.example/gpulab:1")
    spec = out["spec"]["template"]["spec"]
    assert [c["image"] for c in spec["initContainers"] + spec["containers"]] == [
        "registry.example/gpulab:1",
        "registry.example/gpulab:1",
        "busybox",
    ]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["image"] == "gpulab:dev"
    pod = {"kind": "Pod", "spec": {"containers": [{"image": "gpulab:dev"}]}}
    assert with_image(pod, "r/g:2")["spec"]["containers"][0]["image"] == "r/g:2"


def test_the_kubeconfig_is_required_with_one_line(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GPULAB_KUBECONFIG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with pytest.raises(
        HarnessError, match=r"needs the existing cluster's kubeconfig: --kubeconfig"
    ):
        kubeconfig_for(SPEC)
    monkeypatch.setenv("GPULAB_KUBECONFIG", "/from/env")
    assert kubeconfig_for(SPEC) == Path("/from/env")
    assert kubeconfig_for(SPEC, Path("/given")) == Path("/given")
