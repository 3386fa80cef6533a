"""From manifests/gpu-operator/assets/ to the objects the operator applies (resource_manager.go
and the Transform* functions of object_controls.go, gpu-operator v26.7.0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulab.gpuoperator import api, render, states
from harness.apply import MANIFESTS

NS = "gpu-operator"
SAMPLE = yaml.safe_load((MANIFESTS / "gpu-operator/samples/clusterpolicy.yaml").read_text())


def policy(spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "cp", "uid": "u-1"}, "spec": spec if spec is not None else {}}


def ctx(spec: dict[str, Any] | None = None) -> render.Context:
    return render.Context(NS, "gpulab:dev", policy(spec))


def render_state(state: str, context: render.Context) -> list[dict[str, Any]]:
    return [render.render(doc, context) for doc in render.load_state(state)]


def daemonset(state: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    (ds,) = [o for o in render_state(state, ctx(spec)) if o["kind"] == "DaemonSet"]
    return ds


def container(ds: dict[str, Any], name: str, init: bool = False) -> dict[str, Any]:
    key = "initContainers" if init else "containers"
    return next(c for c in ds["spec"]["template"]["spec"].get(key, []) if c["name"] == name)


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


@pytest.mark.parametrize("state", states.STATES)
def test_every_state_renders_owned_hashed_objects_in_the_operator_namespace(state: str) -> None:
    for obj in render_state(state, ctx(SAMPLE["spec"])):
        meta = obj["metadata"]
        if obj["kind"] in render.NAMESPACED:
            assert meta["namespace"] == NS
        assert meta["ownerReferences"] == [
            {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cp", "uid": "u-1",
             "controller": True, "blockOwnerDeletion": True}
        ]  # fmt: skip
        assert meta["annotations"][render.HASH_ANNOTATION] == render.object_hash(obj)
        for subject in obj.get("subjects") or []:
            assert subject["namespace"] == NS
        if obj["kind"] == "DaemonSet":
            pod = obj["spec"]["template"]["spec"]
            images = {c["image"] for c in pod["containers"] + pod.get("initContainers", [])}
            assert images == {"gpulab:dev"}


def test_the_states_the_lab_runs_have_assets() -> None:
    shipped = {p.name for p in render.ASSETS.iterdir()}
    assert shipped == {
        "pre-requisites", "state-operator-metrics", "state-driver", "state-container-toolkit",
        "state-operator-validation", "state-device-plugin", "state-dcgm", "state-dcgm-exporter",
        "gpu-feature-discovery", "state-mig-manager",
    }  # fmt: skip
    assert shipped <= set(states.STATES)


def test_the_clusterpolicys_image_is_recorded_and_the_labs_runs() -> None:
    ds = daemonset("state-device-plugin", SAMPLE["spec"])
    assert ds["metadata"]["annotations"][render.UPSTREAM_IMAGE_ANNOTATION] == (
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    )
    assert container(ds, "nvidia-device-plugin")["image"] == "gpulab:dev"


@pytest.mark.parametrize(
    ("comp", "path"),
    [
        ({"repository": "nvcr.io/nvidia", "image": "driver", "version": "595.91.07"},
         "nvcr.io/nvidia/driver:595.91.07"),
        ({"repository": "r", "image": "i", "version": "sha256:abc"}, "r/i@sha256:abc"),
        ({"image": "quay.io/x/y:1"}, "quay.io/x/y:1"),
        ({}, ""),
    ],
)  # fmt: skip
def test_image_path(comp: dict, path: str) -> None:
    assert api.image_path(comp) == path


@pytest.mark.parametrize("state", ["state-device-plugin", "gpu-feature-discovery"])
def test_mig_strategy_and_no_config_manager_without_a_custom_config(state: str) -> None:
    ds = daemonset(state, {"mig": {"strategy": "mixed"}})
    main = ds["spec"]["template"]["spec"]["containers"][0]
    assert env(main)["MIG_STRATEGY"] == "mixed"
    assert env(main)["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    inits = [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]]
    assert inits == ["toolkit-validation"]
    none = daemonset(state, {"mig": {"strategy": "none"}})["spec"]["template"]["spec"]
    assert "NVIDIA_MIG_MONITOR_DEVICES" not in env(none["containers"][0])
    unset = daemonset(state, {})["spec"]["template"]["spec"]
    assert "MIG_STRATEGY" not in env(unset["containers"][0])


def test_a_custom_plugin_config_reaches_the_plugin_through_config_manager() -> None:
    spec = {"devicePlugin": {"config": {"name": "plugin-configs", "default": "any"}}}
    ds = daemonset("state-device-plugin", spec)
    pod = ds["spec"]["template"]["spec"]
    main = container(ds, "nvidia-device-plugin")
    assert env(main)["CONFIG_FILE"] == "/config/config.yaml"
    assert {"name": "plugin-configs", "mountPath": "/available-configs"} in main["volumeMounts"]
    init = container(ds, "config-manager-init", init=True)
    assert env(init)["DEFAULT_CONFIG"] == "any" and env(init)["FALLBACK_STRATEGIES"] == "empty"
    assert {"name": "plugin-configs", "configMap": {"name": "plugin-configs"}} in pod["volumes"]
    assert {"name": "config", "emptyDir": {}} in pod["volumes"]


def test_the_plugin_validation_goes_with_the_device_plugin() -> None:
    spec = {"mig": {"strategy": "single"}, "validator": {"driver": {"env": [
        {"name": "DISABLE_DEV_CHAR_SYMLINK_CREATION", "value": "true"}]}}}  # fmt: skip
    ds = daemonset("state-operator-validation", spec)
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]]
    assert names == [
        "driver-validation",
        "toolkit-validation",
        "cuda-validation",
        "plugin-validation",
    ]
    assert env(container(ds, "plugin-validation", init=True))["MIG_STRATEGY"] == "single"
    assert (
        env(container(ds, "driver-validation", init=True))["DISABLE_DEV_CHAR_SYMLINK_CREATION"]
        == "true"
    )
    off = daemonset("state-operator-validation", {**spec, "devicePlugin": {"enabled": False}})
    names = [c["name"] for c in off["spec"]["template"]["spec"]["initContainers"]]
    assert "plugin-validation" not in names


def test_the_mig_manager_reads_the_default_or_the_custom_mig_parted_config() -> None:
    ds = daemonset("state-mig-manager", {})
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols["mig-parted-config"]["configMap"] == {
        "name": "default-mig-parted-config",
        "items": [{"key": "config.yaml", "path": "config-default.yaml"}],
    }
    assert vols["gpu-clients"]["configMap"] == {"name": "default-gpu-clients"}
    main = container(ds, "nvidia-mig-manager")
    assert env(main)["DEFAULT_CONFIG_FILE"] == "/mig-parted-config/config-default.yaml"
    custom = daemonset("state-mig-manager", {"migManager": {"config": {"name": "mine"}}})
    vols = {v["name"]: v for v in custom["spec"]["template"]["spec"]["volumes"]}
    assert vols["mig-parted-config"]["configMap"] == {"name": "mine"}
    assert env(container(custom, "nvidia-mig-manager"))["CONFIG_FILE"] == (
        "/mig-parted-config/config.yaml"
    )


def test_dcgm_exporter_talks_to_a_standalone_host_engine_only_when_there_is_one() -> None:
    def main(spec: dict) -> dict:
        return env(container(daemonset("state-dcgm-exporter", spec), "nvidia-dcgm-exporter"))

    assert main({})[render.DCGM_REMOTE_HOSTENGINE] == "nvidia-dcgm:5555"  # dcgm on by default
    assert render.DCGM_REMOTE_HOSTENGINE not in main({"dcgm": {"enabled": False}})
    custom = main({"dcgmExporter": {"config": {"name": "metrics"}}})
    assert custom["DCGM_EXPORTER_COLLECTORS"] == "/etc/dcgm-exporter/dcgm-metrics.csv"


def test_a_custom_metrics_configmap_is_mounted_as_one_file() -> None:
    """subPath: the image's other files under /etc/dcgm-exporter stay visible."""
    ds = daemonset("state-dcgm-exporter", {"dcgmExporter": {"config": {"name": "metrics"}}})
    mounts = container(ds, "nvidia-dcgm-exporter")["volumeMounts"]
    assert {"name": "metrics-config", "readOnly": True,
            "mountPath": "/etc/dcgm-exporter/dcgm-metrics.csv",
            "subPath": "dcgm-metrics.csv"} in mounts  # fmt: skip


def test_the_dcgm_exporter_service_takes_the_clusterpolicys_type() -> None:
    def service(spec: dict) -> dict:
        (svc,) = [o for o in render_state("state-dcgm-exporter", ctx(spec))
                  if o["kind"] == "Service"]  # fmt: skip
        return svc["spec"]

    assert "type" not in service({})
    spec = {"dcgmExporter": {"service": {"type": "NodePort", "internalTrafficPolicy": "Local"}}}
    assert (service(spec)["type"], service(spec)["internalTrafficPolicy"]) == ("NodePort", "Local")


@pytest.mark.parametrize(
    ("state", "container_name", "section", "name", "operators"),
    [
        ("state-device-plugin", "nvidia-device-plugin", "devicePlugin", "MIG_STRATEGY", "mixed"),
        ("state-device-plugin", "nvidia-device-plugin", "devicePlugin", "CONFIG_FILE",
         "/config/config.yaml"),
        ("state-mig-manager", "nvidia-mig-manager", "migManager", "CONFIG_FILE",
         "/mig-parted-config/config.yaml"),
        ("state-dcgm-exporter", "nvidia-dcgm-exporter", "dcgmExporter",
         "DCGM_EXPORTER_COLLECTORS", "/etc/dcgm-exporter/dcgm-metrics.csv"),
    ],
)  # fmt: skip
def test_the_users_env_wins_over_the_operators_value(
    state: str, container_name: str, section: str, name: str, operators: str
) -> None:
    """object_controls.go sets a section's env after the operator's own settings."""
    spec: dict[str, Any] = {
        "mig": {"strategy": "mixed"},
        "devicePlugin": {"config": {"name": "plugin-config"}},
        "migManager": {"config": {"name": "mine"}},
        "dcgmExporter": {"config": {"name": "metrics"}},
    }
    main = container(daemonset(state, spec), container_name)
    assert env(main)[name] == operators  # the operator sets it ...
    spec[section] = {**spec[section], "env": [{"name": name, "value": "/the/users"}]}
    main = container(daemonset(state, spec), container_name)
    assert env(main)[name] == "/the/users"  # ... and the user's value wins
    assert [e["name"] for e in main["env"]].count(name) == 1


def test_gfds_env_loses_to_the_operators_mig_strategy() -> None:
    """TransformGPUDiscoveryPlugin applies env before applyMIGConfiguration."""
    spec = {"mig": {"strategy": "mixed"},
            "gfd": {"env": [{"name": "MIG_STRATEGY", "value": "none"},
                            {"name": "GFD_SLEEP_INTERVAL", "value": "10s"}]}}  # fmt: skip
    main = env(container(daemonset("gpu-feature-discovery", spec), "gpu-feature-discovery"))
    assert (main["MIG_STRATEGY"], main["GFD_SLEEP_INTERVAL"]) == ("mixed", "10s")


def test_daemonsets_settings_reach_every_operand() -> None:
    spec = {
        "daemonsets": {
            "labels": {"team": "ml", "app": "nope"},
            "annotations": {"a": "b"},
            "priorityClassName": "high",
            "tolerations": [{"key": "x", "operator": "Exists"}],
            "updateStrategy": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "2"},
        },
        "toolkit": {"env": [{"name": "CONTAINERD_CONFIG", "value": "/etc/c.toml"}]},
    }
    ds = daemonset("state-container-toolkit", spec)
    pod = ds["spec"]["template"]
    assert ds["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["app"] == "nvidia-container-toolkit-daemonset"
    assert pod["metadata"]["annotations"] == {"a": "b"}
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["tolerations"] == [{"key": "x", "operator": "Exists"}]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 2},
    }
    assert env(pod["spec"]["containers"][0])["CONTAINERD_CONFIG"] == "/etc/c.toml"
    # the driver keeps OnDelete: a rolling driver update would unload it under running pods
    assert daemonset("state-driver", spec)["spec"]["updateStrategy"] == {"type": "OnDelete"}
    on_delete = daemonset("state-container-toolkit", {"daemonsets": {"updateStrategy": "OnDelete"}})
    assert on_delete["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_the_hash_changes_with_the_spec_and_only_then() -> None:
    a = daemonset("state-device-plugin", {"mig": {"strategy": "single"}})
    b = daemonset("state-device-plugin", {"mig": {"strategy": "single"}})
    c = daemonset("state-device-plugin", {"mig": {"strategy": "mixed"}})
    h = render.HASH_ANNOTATION
    assert a["metadata"]["annotations"][h] == b["metadata"]["annotations"][h]
    assert a["metadata"]["annotations"][h] != c["metadata"]["annotations"][h]


def test_bad_rolling_update_and_bad_assets_are_named(tmp_path: Path) -> None:
    bad = {"daemonsets": {"rollingUpdate": {"maxUnavailable": "lots"}}}
    daemonset("state-driver", bad)  # the driver's update strategy is never rolling
    with pytest.raises(render.AssetError, match="maxUnavailable 'lots'"):
        daemonset("state-device-plugin", bad)
    (tmp_path / "state-x").mkdir()
    (tmp_path / "state-x" / "0100_a.yaml").write_text("metadata: {name: a}\n")
    (tmp_path / "state-x" / "0200_scc_openshift.yaml").write_text("kind: SCC\n")
    with pytest.raises(render.AssetError, match=r"0100_a\.yaml: every document needs a kind"):
        render.load_state("state-x", tmp_path)
    (tmp_path / "state-x" / "0100_a.yaml").write_text("kind: ServiceAccount\n")
    assert render.load_state("state-x", tmp_path) == [{"kind": "ServiceAccount"}]  # no SCC
    assert render.load_state("state-none", tmp_path) == []
