"""Which labels the operator puts on a node: ``nvidia.com/gpu.present`` and one
``nvidia.com/gpu.deploy.<operand>`` per operand, which the operands' DaemonSets select.

Mirrors NVIDIA gpu-operator v26.7.0 ``controllers/state_manager.go`` (``gpuStateLabels``,
``hasGPULabels``, ``hasMIGCapableGPU``, ``getWorkloadConfig``, ``addGPUStateLabels`` /
``removeGPUStateLabels`` / ``removeAllGPUStateLabels``) and
``controllers/nodelabeling_controller.go`` (``labelGPUNodes``: ``reconcileCommonGPULabel``,
``updateGPUStateLabels`` with the default ``nvidia.com/mig.config``;
``getNodeLabelUpdateReasons``, which node changes call for relabelling). Pure: every
function takes a node's labels and returns new ones.

A value already set on a deploy label is honoured: a user's ``false`` keeps that operand
off the node, and the MIG manager's ``paused-for-mig-change`` keeps a GPU client away
while it repartitions; only an absent or empty label gets ``true``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulab.gpuoperator import api

Labels = dict[str, str]

COMMON_GPU_LABEL = "nvidia.com/gpu.present"
COMMON_OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
MIG_MANAGER_LABEL = "nvidia.com/gpu.deploy.mig-manager"
MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_CONFIG_DISABLED = "all-disabled"
VGPU_HOST_DRIVER_LABEL = "nvidia.com/vgpu.host-driver-version"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_WORKLOAD_CONFIG_LABEL = "nvidia.com/gpu.workload.config"
NFD_LABEL_PREFIX = "feature.node.kubernetes.io/"
NFD_OSTREE_LABEL = "feature.node.kubernetes.io/system-os_release.OSTREE_VERSION"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."

# NFD's PCI labels for an NVIDIA device (vendor 10de; classes 0302 3D, 0300 VGA)
GPU_NODE_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/pci-0302_10de.present": "true",
    "feature.node.kubernetes.io/pci-0300_10de.present": "true",
}

CONTAINER, VM_PASSTHROUGH, VM_VGPU = "container", "vm-passthrough", "vm-vgpu"
KUBEVIRT_DEVICE_PLUGIN = DEPLOY_PREFIX + "sandbox-device-plugin"
KATA_DEVICE_PLUGIN = DEPLOY_PREFIX + "kata-sandbox-device-plugin"


def _deploy(*operands: str) -> Labels:
    return {DEPLOY_PREFIX + o: "true" for o in operands}


# gpuStateLabels: the deploy labels of each GPU workload configuration
GPU_STATE_LABELS: dict[str, Labels] = {
    CONTAINER: _deploy(
        "driver",
        "gpu-feature-discovery",
        "container-toolkit",
        "device-plugin",
        "dcgm",
        "dcgm-exporter",
        "node-status-exporter",
        "operator-validator",
        "client",
    ),
    VM_PASSTHROUGH: _deploy(
        "sandbox-device-plugin",
        "sandbox-validator",
        "vfio-manager",
        "kata-manager",
        "cc-manager",
        "client",
    ),
    VM_VGPU: _deploy(
        "sandbox-device-plugin",
        "vgpu-manager",
        "vgpu-device-manager",
        "sandbox-validator",
        "cc-manager",
        "client",
    ),
}
# gpuClusterStateLabels: the DRA (GPUCluster) stack's deploy labels, removed with the rest
GPU_CLUSTER_STATE_LABELS = _deploy("driver", "dra-driver", "dra-validator", "dcgm-dra")
GPU_CLUSTER_STATE_LABELS.update(_deploy("dcgm-exporter-dra"))


def all_state_label_keys() -> set[str]:
    """``clusterPolicyStateLabelKeys`` plus the DRA stack's keys."""
    keys = {k for labels in GPU_STATE_LABELS.values() for k in labels}
    keys |= {KUBEVIRT_DEVICE_PLUGIN, KATA_DEVICE_PLUGIN, MIG_MANAGER_LABEL}
    return keys | set(GPU_CLUSTER_STATE_LABELS)


def has_common_gpu_label(labels: Mapping[str, str]) -> bool:
    return labels.get(COMMON_GPU_LABEL) == "true"


def has_gpu_labels(labels: Mapping[str, str]) -> bool:
    """``hasGPULabels``: NFD found an NVIDIA PCI device."""
    return any(labels.get(k) == v for k, v in GPU_NODE_LABELS.items())


def has_nfd_labels(labels: Mapping[str, str]) -> bool:
    return any(k.startswith(NFD_LABEL_PREFIX) for k in labels)


def has_operands_disabled(labels: Mapping[str, str]) -> bool:
    return labels.get(COMMON_OPERANDS_LABEL) == "false"


def has_mig_config_label(labels: Mapping[str, str]) -> bool:
    return bool(labels.get(MIG_CONFIG_LABEL))


def has_mig_capable_gpu(labels: Mapping[str, str]) -> bool:
    """``hasMIGCapableGPU``: GFD's ``nvidia.com/mig.capable``, else a product name that
    says H100, A100 or A30; never on a vGPU host."""
    if labels.get(VGPU_HOST_DRIVER_LABEL):
        return False
    if MIG_CAPABLE_LABEL in labels:
        return labels[MIG_CAPABLE_LABEL] == "true"
    product = labels.get(GPU_PRODUCT_LABEL, "").lower()
    return any(model in product for model in ("h100", "a100", "a30"))


def workload_config(labels: Mapping[str, str], sandbox_enabled: bool) -> tuple[str, str | None]:
    """``getWorkloadConfig``: (the node's GPU workload config, why the default was used)."""
    if not sandbox_enabled:
        return CONTAINER, None
    value = labels.get(GPU_WORKLOAD_CONFIG_LABEL)
    if value is None:
        return CONTAINER, "no GPU workload config found"
    if value in GPU_STATE_LABELS:
        return value, None
    return CONTAINER, f"invalid GPU workload config: {value}"


def effective_state_labels(config: str, sandbox_mode: str) -> Labels:
    """``getEffectiveStateLabels``: vm-passthrough uses the kata or the KubeVirt device
    plugin according to ``sandboxWorkloads.mode``."""
    labels = dict(GPU_STATE_LABELS[config])
    if config == VM_PASSTHROUGH:
        if sandbox_mode == "kata":
            labels.pop(KUBEVIRT_DEVICE_PLUGIN, None)
            labels[KATA_DEVICE_PLUGIN] = "true"
        elif sandbox_mode == "kubevirt":
            labels.pop(KATA_DEVICE_PLUGIN, None)
            labels[KUBEVIRT_DEVICE_PLUGIN] = "true"
    return labels


def remove_all_gpu_state_labels(labels: Labels) -> bool:
    """``removeAllGPUStateLabels`` (in place); True if something was removed."""
    doomed = all_state_label_keys() & set(labels)
    for key in doomed:
        del labels[key]
    return bool(doomed)


def _update_state_labels(labels: Labels, config: str, sandbox_mode: str) -> bool:
    """``gpuWorkloadConfiguration.updateGPUStateLabels`` (in place)."""
    if has_operands_disabled(labels):
        return remove_all_gpu_state_labels(labels)
    effective = effective_state_labels(config, sandbox_mode)
    modified = False
    for key in sorted(all_state_label_keys() & set(labels)):  # removeGPUStateLabels
        if key == MIG_MANAGER_LABEL and config == CONTAINER:
            continue  # managed per MIG capability below
        if key not in effective:
            del labels[key]
            modified = True
    for key, value in effective.items():  # addGPUStateLabels: a set value is honoured
        if not labels.get(key):
            labels[key] = value
            modified = True
    if config == CONTAINER and has_mig_capable_gpu(labels) and MIG_MANAGER_LABEL not in labels:
        labels[MIG_MANAGER_LABEL] = "true"
        modified = True
    return modified


def gpu_node_labels(labels: Mapping[str, str], spec: Mapping[str, Any]) -> Labels:
    """``labelGPUNodes`` for one node: the labels it should carry under the ClusterPolicy
    ``spec`` (``reconcileCommonGPULabel``, then ``updateGPUStateLabels``)."""
    out = dict(labels)
    if not has_common_gpu_label(out) and has_gpu_labels(out):
        out[COMMON_GPU_LABEL] = "true"
    elif has_common_gpu_label(out) and not has_gpu_labels(out):
        out[COMMON_GPU_LABEL] = "false"  # the node's GPUs are gone
    if not has_common_gpu_label(out):
        remove_all_gpu_state_labels(out)
        return out
    sandbox = api.enabled(spec, "sandboxWorkloads")
    sandbox_mode = str(api.component(spec, "sandboxWorkloads").get("mode") or "")
    config, _why = workload_config(out, sandbox)
    _update_state_labels(out, config, sandbox_mode)
    if api.enabled(spec, "migManager") and has_mig_capable_gpu(out):
        default = str((api.component(spec, "migManager").get("config") or {}).get("default", ""))
        if not has_mig_config_label(out) and default == MIG_CONFIG_DISABLED:
            out[MIG_CONFIG_LABEL] = MIG_CONFIG_DISABLED
    return out


def label_patch(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str | None]:
    """A merge patch of ``metadata.labels`` turning ``old`` into ``new`` (None deletes)."""
    patch: dict[str, str | None] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new})
    return patch


def relabel_needed(old: Mapping[str, str], new: Mapping[str, str]) -> bool:
    """The NodeLabelingReconciler's node predicate (``getNodeLabelUpdateReasons``)."""
    old_config, _ = workload_config(old, True)
    new_config, _ = workload_config(new, True)
    return (
        (has_gpu_labels(new) and not has_common_gpu_label(new))
        or (not has_gpu_labels(new) and has_common_gpu_label(new))
        or old.get(COMMON_GPU_LABEL) != new.get(COMMON_GPU_LABEL)
        or has_operands_disabled(old) != has_operands_disabled(new)
        or old_config != new_config
        or has_mig_capable_gpu(old) != has_mig_capable_gpu(new)
        or old.get(NFD_OSTREE_LABEL) != new.get(NFD_OSTREE_LABEL)
    )


def cluster_policy_wanted(old: Mapping[str, str], new: Mapping[str, str]) -> bool:
    """The ClusterPolicy controller's node predicate (``addWatchNewGPUNode`` UpdateFunc):
    a node became a GPU node, its operands were switched on or off, its workload config
    or its OS tree changed."""
    old_config, _ = workload_config(old, True)
    new_config, _ = workload_config(new, True)
    return (
        (not has_common_gpu_label(old) and has_common_gpu_label(new))
        or has_operands_disabled(old) != has_operands_disabled(new)
        or old_config != new_config
        or old.get(NFD_OSTREE_LABEL) != new.get(NFD_OSTREE_LABEL)
    )
