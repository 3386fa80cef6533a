"""From ``manifests/gpu-operator/assets/<state>/`` to the objects the operator applies.

Mirrors NVIDIA gpu-operator v26.7.0 ``controllers/resource_manager.go``
(``getAssetsFrom``: a state's files in name order, OpenShift-only ones skipped) and the
transforms of ``controllers/object_controls.go``: the namespace filled in, bindings'
subjects moved to it, ``preProcessDaemonSet`` (``applyCommonDaemonsetConfig``:
update strategy, priority class, tolerations, pod security context; then the operand's
``Transform*``: image, pull policy, args, resources from its ClusterPolicy section;
``applyMIGConfiguration``; ``handleDevicePluginConfig``; ``TransformValidatorComponent``;
``TransformMIGManager``'s ConfigMaps; ``TransformDCGMExporter``'s host engine and metrics
config; the section's ``env`` last, so the user's values win - except for GFD, whose
``env`` comes before the plugin config and MIG strategy; ``applyCommonDaemonsetMetadata``),
``preprocessService`` (``TransformDCGMExporterService``), the RuntimeClass name
(``getRuntimeClassName``) and the controller reference to the ClusterPolicy. Pure:
templates in, dicts out.

Lab differences: every operand runs the lab's image (``Context.image``, gpulab:dev, which
the local backend's pod runner can run); the image the ClusterPolicy names is recorded on
the DaemonSet as ``gpulab.io/upstream-image``. Settings that only reach a real
container runtime (runtimeClassName, the CDI/NRI annotations, host networking, image pull
secrets, security contexts) are not rendered.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpulab.gpuoperator import api

Obj = dict[str, Any]

ASSETS = Path(__file__).resolve().parents[2] / "manifests" / "gpu-operator" / "assets"
HASH_ANNOTATION = "nvidia.com/last-applied-hash"  # NvidiaAnnotationHashKey
UPSTREAM_IMAGE_ANNOTATION = "gpulab.io/upstream-image"
NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "DaemonSet"}
DRIVER_DAEMONSET = "nvidia-driver-daemonset"

# DaemonSet name -> the ClusterPolicy section configuring it (preProcessDaemonSet's map)
OPERANDS = {
    DRIVER_DAEMONSET: "driver",
    "nvidia-container-toolkit-daemonset": "toolkit",
    "nvidia-operator-validator": "validator",
    "nvidia-device-plugin-daemonset": "devicePlugin",
    "nvidia-dcgm": "dcgm",
    "nvidia-dcgm-exporter": "dcgmExporter",
    "gpu-feature-discovery": "gfd",
    "nvidia-mig-manager": "migManager",
}
MIG_CONFIG_DIR = "/mig-parted-config"
METRICS_CONFIG_FILE = "dcgm-metrics.csv"
METRICS_CONFIG_PATH = "/etc/dcgm-exporter/" + METRICS_CONFIG_FILE
DCGM_REMOTE_HOSTENGINE = "DCGM_REMOTE_HOSTENGINE_INFO"
FILLED_BY_OPERATOR = "FILLED_BY_OPERATOR"
DEFAULT_RUNTIME_CLASS = "nvidia"  # DefaultRuntimeClass
# the RuntimeClasses of pre-requisites that exist only while CDI is enabled (RuntimeClasses)
CDI_RUNTIME_CLASSES = ("nvidia-cdi", "nvidia-legacy")


class AssetError(ValueError):
    """A template the operator cannot use; names the file."""


@dataclass(frozen=True)
class Context:
    """What rendering needs besides the template: the operator's namespace, the image the
    lab runs operands with, and the ClusterPolicy (its spec, its identity for ownership)."""

    namespace: str
    image: str
    policy: Mapping[str, Any]

    @property
    def spec(self) -> Mapping[str, Any]:
        return api.spec_of(self.policy)


def load_state(state: str, assets: Path = ASSETS, openshift: bool = False) -> list[Obj]:
    """``getAssetsFrom``: every document of the state's files, in file-name order; a
    state the lab ships no assets for has none."""
    directory = assets / state
    if not directory.is_dir():
        return []
    docs: list[Obj] = []
    for path in sorted(directory.iterdir()):
        if path.suffix not in (".yaml", ".yml") or ("openshift" in path.name and not openshift):
            continue
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            raise AssetError(f"{path}: not valid YAML ({exc})") from exc
        for doc in loaded:
            if not isinstance(doc, dict) or "kind" not in doc:
                raise AssetError(f"{path}: every document needs a kind")
            docs.append(doc)
    return docs


def object_hash(obj: Mapping[str, Any]) -> str:
    """``utils.GetObjectHash``: a digest of the rendered object (without the hash itself)."""
    clean = copy.deepcopy(dict(obj))
    meta = clean.get("metadata") or {}
    meta.get("annotations", {}).pop(HASH_ANNOTATION, None)
    if meta.get("annotations") == {}:
        del meta["annotations"]
    data = json.dumps(clean, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def render(doc: Mapping[str, Any], ctx: Context) -> Obj:
    """The object to apply for one asset document under the ClusterPolicy."""
    obj = copy.deepcopy(dict(doc))
    kind = obj["kind"]
    meta = obj.setdefault("metadata", {})
    if kind in NAMESPACED:
        meta["namespace"] = ctx.namespace
    for subject in obj.get("subjects") or []:  # RoleBinding / ClusterRoleBinding
        if subject.get("kind") == "ServiceAccount":
            subject["namespace"] = ctx.namespace
    if kind == "DaemonSet":
        transform_daemonset(obj, ctx)
    elif kind == "Service" and meta.get("name") == "nvidia-dcgm-exporter":
        _dcgm_exporter_service(obj, ctx.spec)
    elif kind == "RuntimeClass" and meta.get("name") == FILLED_BY_OPERATOR:
        meta["name"] = obj["handler"] = runtime_class_name(ctx.spec)
    meta["ownerReferences"] = [owner_reference(ctx.policy)]
    meta.setdefault("annotations", {})[HASH_ANNOTATION] = object_hash(obj)
    return obj


def runtime_class_name(spec: Mapping[str, Any]) -> str:
    """``getRuntimeClassName``: ``operator.runtimeClass``, else ``nvidia``."""
    return str(api.component(spec, "operator").get("runtimeClass") or DEFAULT_RUNTIME_CLASS)


def _dcgm_exporter_service(obj: Obj, spec: Mapping[str, Any]) -> None:
    """``TransformDCGMExporterService``: the ClusterPolicy's ``dcgmExporter.service``
    type and internalTrafficPolicy."""
    service = api.component(spec, "dcgmExporter").get("service") or {}
    if service.get("type"):
        obj["spec"]["type"] = service["type"]
    if service.get("internalTrafficPolicy"):
        obj["spec"]["internalTrafficPolicy"] = service["internalTrafficPolicy"]


def owner_reference(policy: Mapping[str, Any]) -> Obj:
    """``controllerutil.SetControllerReference`` to the ClusterPolicy: its objects are
    garbage-collected with it."""
    meta = policy.get("metadata") or {}
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


# ---------------------------------------------------------------- DaemonSets


def _containers(obj: Obj, init: bool = False) -> list[Obj]:
    pod = obj["spec"]["template"]["spec"]
    return pod.setdefault("initContainers" if init else "containers", [])


def _find(containers: Sequence[Obj], name: str) -> Obj | None:
    return next((c for c in containers if c.get("name") == name), None)


def set_env(container: Obj, name: str, value: str) -> None:
    """``setContainerEnv``: replace the variable's value, or add it."""
    env = container.setdefault("env", [])
    for item in env:
        if item.get("name") == name:
            item.pop("valueFrom", None)
            item["value"] = value
            return
    env.append({"name": name, "value": value})


def _apply_env(container: Obj, env: Sequence[Mapping[str, Any]] | None) -> None:
    for item in env or []:
        set_env(container, str(item["name"]), str(item.get("value", "")))


def _apply_resources(container: Obj, resources: Mapping[str, Any] | None) -> None:
    """``applyResourceRequirements``."""
    if resources:
        container["resources"] = {
            k: v for k, v in (("requests", resources.get("requests")),
                              ("limits", resources.get("limits"))) if v
        }  # fmt: skip


def apply_mig_configuration(container: Obj, strategy: str) -> None:
    """``applyMIGConfiguration``: MIG_STRATEGY for the plugin and GFD (unset: let each
    node decide), and NVIDIA_MIG_MONITOR_DEVICES=all unless the strategy is none."""
    if not strategy:
        set_env(container, "NVIDIA_MIG_MONITOR_DEVICES", "all")
        return
    set_env(container, "MIG_STRATEGY", strategy)
    if strategy != "none":
        set_env(container, "NVIDIA_MIG_MONITOR_DEVICES", "all")


def _update_strategy(obj: Obj, spec: Mapping[str, Any]) -> None:
    """``applyUpdateStrategyConfig``."""
    ds = api.component(spec, "daemonsets")
    if ds.get("updateStrategy") == "OnDelete":
        obj["spec"]["updateStrategy"] = {"type": "OnDelete"}
        return
    unavailable = str((ds.get("rollingUpdate") or {}).get("maxUnavailable") or "")
    if not unavailable or obj["metadata"]["name"].startswith(DRIVER_DAEMONSET):
        return
    if not unavailable.endswith("%"):
        try:
            value: int | str = int(unavailable)
        except ValueError:
            raise AssetError(
                f"daemonsets.rollingUpdate.maxUnavailable {unavailable!r}: use a number or a "
                "percentage"
            ) from None
    else:
        value = unavailable
    obj["spec"]["updateStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": value},
    }


def _common(obj: Obj, spec: Mapping[str, Any]) -> None:
    """``applyCommonDaemonsetConfig``."""
    _update_strategy(obj, spec)
    ds = api.component(spec, "daemonsets")
    pod = obj["spec"]["template"]["spec"]
    if ds.get("priorityClassName"):
        pod["priorityClassName"] = ds["priorityClassName"]
    if ds.get("tolerations"):
        pod["tolerations"] = copy.deepcopy(ds["tolerations"])


def _common_metadata(obj: Obj, spec: Mapping[str, Any]) -> None:
    """``applyCommonDaemonsetMetadata`` and DaemonSet()'s labels/annotations: the
    ClusterPolicy's ``daemonsets.labels``/``annotations`` on the DaemonSet and its pods
    (never ``app`` or ``app.kubernetes.io/part-of``, which the selectors use)."""
    ds = api.component(spec, "daemonsets")
    labels = dict(ds.get("labels") or {})
    annotations = dict(ds.get("annotations") or {})
    meta = obj["metadata"]
    meta.setdefault("labels", {}).update(labels)
    meta.setdefault("annotations", {}).update(annotations)
    template = obj["spec"]["template"].setdefault("metadata", {})
    pod_labels = {k: v for k, v in labels.items() if k not in ("app", "app.kubernetes.io/part-of")}
    if pod_labels:
        template.setdefault("labels", {}).update(pod_labels)
    if annotations:
        template.setdefault("annotations", {}).update(annotations)


def _validation_init_containers(obj: Obj, spec: Mapping[str, Any]) -> None:
    """``transformValidationInitContainer``: the validator's env for the operands'
    driver-/toolkit-validation init containers, and its resources."""
    validator = api.component(spec, "validator")
    for c in _containers(obj, init=True):
        if "validation" not in c["name"]:
            continue
        if c["name"].startswith("driver"):
            _apply_env(c, (validator.get("driver") or {}).get("env"))
        if c["name"].startswith("toolkit"):
            _apply_env(c, (validator.get("toolkit") or {}).get("env"))
        _apply_resources(c, validator.get("resources"))


def _main_container_settings(obj: Obj, comp: Mapping[str, Any]) -> Obj:
    """Pull policy, args and resources from the operand's ClusterPolicy section on its
    main container (the first); resources on every container, as upstream. Its ``env``
    is the caller's to apply: where it goes decides who wins (:func:`transform_daemonset`)."""
    main = _containers(obj)[0]
    if comp.get("imagePullPolicy"):
        main["imagePullPolicy"] = comp["imagePullPolicy"]
    if comp.get("args"):
        main["args"] = list(comp["args"])
    for c in _containers(obj):
        _apply_resources(c, comp.get("resources"))
    return main


def _device_plugin_config(obj: Obj, spec: Mapping[str, Any], main: Obj) -> None:
    """``handleDevicePluginConfig``: without a custom config ConfigMap the config-manager
    containers go; with one, the ConfigMap and an emptyDir reach the main container
    (CONFIG_FILE=/config/config.yaml) and the config-manager init container picks it."""
    config = api.component(spec, "devicePlugin").get("config") or {}
    pod = obj["spec"]["template"]["spec"]
    if not config.get("name"):
        pod["initContainers"] = [
            c for c in _containers(obj, init=True) if c["name"] != "config-manager-init"
        ]
        pod["containers"] = [c for c in _containers(obj) if c["name"] != "config-manager"]
        return
    mounts = [
        {"name": "config", "mountPath": "/config"},
        {"name": str(config["name"]), "mountPath": "/available-configs"},
    ]
    set_env(main, "CONFIG_FILE", "/config/config.yaml")
    main.setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))
    pod.setdefault("volumes", []).extend(
        [{"name": str(config["name"]), "configMap": {"name": str(config["name"])}},
         {"name": "config", "emptyDir": {}}]
    )  # fmt: skip
    init = _find(_containers(obj, init=True), "config-manager-init")
    if init is not None:
        set_env(init, "DEFAULT_CONFIG", str(config.get("default") or ""))
        set_env(init, "FALLBACK_STRATEGIES", "empty")
        init.setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))


def _validator(obj: Obj, spec: Mapping[str, Any]) -> None:
    """``TransformValidatorShared`` + ``TransformValidatorComponent``: each component's
    env; the plugin validation removed when the device plugin is disabled, and told the
    MIG strategy."""
    validator = api.component(spec, "validator")
    pod = obj["spec"]["template"]["spec"]
    for c in list(_containers(obj, init=True)):
        component = c["name"].removesuffix("-validation")
        _apply_resources(c, validator.get("resources"))
        if component == "plugin":
            if not api.enabled(spec, "devicePlugin"):
                pod["initContainers"].remove(c)
                continue
            set_env(c, "MIG_STRATEGY", api.mig_strategy(spec))
        _apply_env(c, (validator.get(component) or {}).get("env"))


def _mig_manager(obj: Obj, spec: Mapping[str, Any], main: Obj) -> None:
    """``TransformMIGManager``'s ConfigMaps: the mig-parted config (the shipped one's
    config.yaml is mounted as config-default.yaml and named by DEFAULT_CONFIG_FILE; a
    custom one's config.yaml by CONFIG_FILE) and the GPU clients list."""
    mig = api.component(spec, "migManager")
    config_name, custom = api.configmap_name(mig.get("config"), api.MIG_PARTED_DEFAULT_CONFIGMAP)
    clients_name, _ = api.configmap_name(
        mig.get("gpuClientsConfig"), api.MIG_DEFAULT_GPU_CLIENTS_CONFIGMAP
    )
    for volume in obj["spec"]["template"]["spec"].get("volumes") or []:
        if "mig-parted-config" in volume["name"]:
            volume["configMap"] = {"name": config_name}
            if not custom:
                volume["configMap"]["items"] = [
                    {"key": "config.yaml", "path": "config-default.yaml"}
                ]
        elif "gpu-clients" in volume["name"]:
            volume["configMap"] = {"name": clients_name}
    if custom:
        set_env(main, "CONFIG_FILE", f"{MIG_CONFIG_DIR}/config.yaml")
    else:
        set_env(main, "DEFAULT_CONFIG_FILE", f"{MIG_CONFIG_DIR}/config-default.yaml")


def _dcgm_exporter(obj: Obj, spec: Mapping[str, Any], main: Obj) -> None:
    """``TransformDCGMExporter``: the standalone host engine's address when
    ``dcgm.enabled``, a custom metrics CSV (``dcgmExporter.config.name``) mounted and
    named by DCGM_EXPORTER_COLLECTORS."""
    if api.enabled(spec, "dcgm"):
        set_env(main, DCGM_REMOTE_HOSTENGINE, "nvidia-dcgm:5555")
    name = str((api.component(spec, "dcgmExporter").get("config") or {}).get("name") or "")
    if not name:
        return
    main.setdefault("volumeMounts", []).append(
        {"name": "metrics-config", "readOnly": True, "mountPath": METRICS_CONFIG_PATH,
         "subPath": METRICS_CONFIG_FILE}
    )  # fmt: skip
    obj["spec"]["template"]["spec"].setdefault("volumes", []).append(
        {
            "name": "metrics-config",
            "configMap": {
                "name": name,
                "items": [{"key": METRICS_CONFIG_FILE, "path": METRICS_CONFIG_FILE}],
            },
        }
    )
    set_env(main, "DCGM_EXPORTER_COLLECTORS", METRICS_CONFIG_PATH)


def transform_daemonset(obj: Obj, ctx: Context) -> None:
    """``preProcessDaemonSet`` (in place)."""
    name = obj["metadata"]["name"]
    key = OPERANDS.get(name)
    if key is None:
        return  # upstream: "No transformation for Daemonset"
    spec = ctx.spec
    comp = api.component(spec, key)
    _common(obj, spec)
    for c in _containers(obj) + _containers(obj, init=True):
        c["image"] = ctx.image
    upstream = api.image_path(comp)
    if upstream:
        obj["metadata"].setdefault("annotations", {})[UPSTREAM_IMAGE_ANNOTATION] = upstream
    if key == "validator":
        main = _main_container_settings(obj, comp)
        _apply_env(main, comp.get("env"))
        _validator(obj, spec)
    elif key == "gfd":
        # TransformGPUDiscoveryPlugin: the user's env first, then the plugin config and
        # MIG_STRATEGY - the operator's values win for GFD (and only there)
        _validation_init_containers(obj, spec)
        main = _main_container_settings(obj, comp)
        _apply_env(main, comp.get("env"))
        _device_plugin_config(obj, spec, main)
        apply_mig_configuration(main, api.mig_strategy(spec))
    else:
        # every other Transform* sets the ClusterPolicy's env last: the user's value of
        # MIG_STRATEGY, CONFIG_FILE, DCGM_EXPORTER_COLLECTORS ... wins over the operator's
        _validation_init_containers(obj, spec)
        main = _main_container_settings(obj, comp)
        if key == "devicePlugin":
            _device_plugin_config(obj, spec, main)
            apply_mig_configuration(main, api.mig_strategy(spec))
        elif key == "migManager":
            _mig_manager(obj, spec, main)
        elif key == "dcgmExporter":
            _dcgm_exporter(obj, spec, main)
        _apply_env(main, comp.get("env"))
    _common_metadata(obj, spec)
