"""ClusterPolicy (``nvidia.com/v1``, cluster-scoped) as the lab's operator reads it: plain
dicts as the API server serves them.

Mirrors NVIDIA gpu-operator v26.7.0 ``api/nvidia/v1/clusterpolicy_types.go``: the states
(``ready``, ``notReady``, ``ignored``, ``disabled``), each component's ``IsEnabled``
default (``ENABLED_BY_DEFAULT``), ``MIGStrategy``, ``ImagePath`` and ``GetConfigMapName``,
and ``internal/conditions`` (condition types ``Ready``/``Error`` and their reasons). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.informer import Resource

Obj = dict[str, Any]

GROUP, VERSION, KIND = "nvidia.com", "v1", "ClusterPolicy"
CLUSTERPOLICIES = Resource(GROUP, VERSION, "clusterpolicies", KIND, namespaced=False)

# gpuv1.State
READY, NOT_READY, IGNORED, DISABLED = "ready", "notReady", "ignored", "disabled"

# internal/conditions: the two condition types and their reasons
COND_READY, COND_ERROR = "Ready", "Error"
RECONCILED = "Reconciled"
RECONCILE_FAILED = "ReconcileFailed"
NFD_LABELS_MISSING = "NFDLabelsMissing"
NO_GPU_NODES = "NoGPUNodes"
OPERAND_NOT_READY = "OperandNotReady"

# spec key -> what IsEnabled() returns when `enabled` is not set
ENABLED_BY_DEFAULT = {
    "driver": True,
    "toolkit": True,
    "devicePlugin": True,
    "dcgm": True,
    "dcgmExporter": True,
    "gfd": True,
    "migManager": True,
    "cdi": True,
    "nodeStatusExporter": False,
    "sandboxWorkloads": False,
    "vfioManager": False,
    "vgpuManager": False,
    "vgpuDeviceManager": False,
    "sandboxDevicePlugin": False,
    "kataSandboxDevicePlugin": False,
    "kataManager": False,
    "ccManager": False,
    "psa": False,
    "gds": False,
    "gdrcopy": False,
}

# the mig-parted ConfigMaps the operator ships (object_controls.go)
MIG_PARTED_DEFAULT_CONFIGMAP = "default-mig-parted-config"
MIG_DEFAULT_GPU_CLIENTS_CONFIGMAP = "default-gpu-clients"


def spec_of(policy: Mapping[str, Any]) -> Obj:
    return dict(policy.get("spec") or {})


def component(spec: Mapping[str, Any], key: str) -> Obj:
    return dict(spec.get(key) or {})


def enabled(spec: Mapping[str, Any], key: str) -> bool:
    """``<Component>Spec.IsEnabled()``: ``enabled`` if set, else the component's default."""
    value = component(spec, key).get("enabled")
    return ENABLED_BY_DEFAULT[key] if value is None else bool(value)


def nri_plugin_enabled(spec: Mapping[str, Any]) -> bool:
    """``CDIConfigSpec.IsNRIPluginEnabled``."""
    return bool(component(spec, "cdi").get("nriPluginEnabled", False))


def mig_strategy(spec: Mapping[str, Any]) -> str:
    """``spec.mig.strategy``; "" when unset (the operator then lets the plugin decide)."""
    return str(component(spec, "mig").get("strategy") or "")


def image_path(comp: Mapping[str, Any]) -> str:
    """``gpuv1.ImagePath``: ``repository/image:version`` (``@`` for a digest), or ``image``
    alone when neither repository nor version is given; "" when nothing is set."""
    repository = str(comp.get("repository") or "")
    image = str(comp.get("image") or "")
    version = str(comp.get("version") or "")
    if not repository and not version:
        return image
    if not image:
        return ""
    sep = "@" if version.startswith("sha256:") else ":"
    return f"{repository}/{image}{sep}{version}" if repository else f"{image}{sep}{version}"


def configmap_name(config: Mapping[str, Any] | None, default: str) -> tuple[str, bool]:
    """``gpuv1.GetConfigMapName``: (the ConfigMap to use, whether it is a custom one)."""
    name = str((config or {}).get("name") or "")
    return (name, True) if name else (default, False)


def creation_key(policy: Mapping[str, Any]) -> tuple[str, str]:
    meta = policy.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def singleton(policies: list[Obj]) -> Obj | None:
    """``getSingletonClusterPolicy`` (active_config.go): the oldest creationTimestamp,
    lowest name as the tie-breaker, so every controller and every restart picks the same
    one. RFC 3339 timestamps of one precision sort as strings."""
    return min(policies, key=creation_key, default=None)
