"""Which labels the operator writes on a node (state_manager.go + nodelabeling_controller.go
of gpu-operator v26.7.0): GPU nodes found by NFD, deploy labels per operand, the user's
and the MIG manager's values honoured."""

from __future__ import annotations

import pytest

from gpulab.gpuoperator import nodelabels as nl

NFD = {"feature.node.kubernetes.io/pci-10de.present": "true"}
HELM = {"migManager": {"config": {"default": "all-disabled"}}}
CONTAINER_OPERANDS = {
    "driver", "gpu-feature-discovery", "container-toolkit", "device-plugin", "dcgm",
    "dcgm-exporter", "node-status-exporter", "operator-validator", "client",
}  # fmt: skip


def deploy(labels: dict[str, str]) -> dict[str, str]:
    return {
        k.removeprefix(nl.DEPLOY_PREFIX): v
        for k, v in labels.items()
        if k.startswith(nl.DEPLOY_PREFIX)
    }


def test_an_nfd_gpu_node_gets_gpu_present_and_every_container_operand() -> None:
    out = nl.gpu_node_labels(NFD, {})
    assert out[nl.COMMON_GPU_LABEL] == "true"
    assert deploy(out) == dict.fromkeys(CONTAINER_OPERANDS, "true")
    assert nl.MIG_CONFIG_LABEL not in out


def test_a_node_without_nfd_gpu_labels_gets_nothing() -> None:
    labels = {"feature.node.kubernetes.io/kernel-version.full": "6.8.0"}
    assert nl.gpu_node_labels(labels, {}) == labels


@pytest.mark.parametrize("value", ["false", "paused-for-mig-change"])
def test_a_set_deploy_label_is_honoured(value: str) -> None:
    labels = {**NFD, nl.DEPLOY_PREFIX + "device-plugin": value}
    out = nl.gpu_node_labels(labels, {})
    assert out[nl.DEPLOY_PREFIX + "device-plugin"] == value
    assert out[nl.DEPLOY_PREFIX + "driver"] == "true"


def test_an_empty_deploy_label_is_set_again() -> None:
    out = nl.gpu_node_labels({**NFD, nl.DEPLOY_PREFIX + "driver": ""}, {})
    assert out[nl.DEPLOY_PREFIX + "driver"] == "true"


def test_operands_disabled_on_a_node_removes_every_deploy_label() -> None:
    labelled = nl.gpu_node_labels(NFD, {})
    off = nl.gpu_node_labels({**labelled, nl.COMMON_OPERANDS_LABEL: "false"}, {})
    assert deploy(off) == {"operands": "false"}
    assert off[nl.COMMON_GPU_LABEL] == "true"


def test_a_node_whose_gpus_are_gone_loses_its_labels() -> None:
    labelled = nl.gpu_node_labels(NFD, {})
    gone = {k: v for k, v in labelled.items() if k not in NFD}
    out = nl.gpu_node_labels(gone, {})
    assert out[nl.COMMON_GPU_LABEL] == "false"
    assert deploy(out) == {}


@pytest.mark.parametrize(
    ("gfd", "capable"),
    [
        ({nl.MIG_CAPABLE_LABEL: "true"}, True),
        ({nl.MIG_CAPABLE_LABEL: "false", nl.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}, False),
        ({nl.GPU_PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}, True),
        ({nl.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}, True),
        ({nl.GPU_PRODUCT_LABEL: "Tesla-T4"}, False),
        ({nl.MIG_CAPABLE_LABEL: "true", nl.VGPU_HOST_DRIVER_LABEL: "550"}, False),
    ],
)
def test_mig_manager_and_the_default_mig_config_go_to_mig_capable_nodes(
    gfd: dict, capable: bool
) -> None:
    out = nl.gpu_node_labels({**NFD, **gfd}, HELM)
    assert (nl.MIG_MANAGER_LABEL in out) is capable
    assert (out.get(nl.MIG_CONFIG_LABEL) == nl.MIG_CONFIG_DISABLED) is capable


def test_the_default_mig_config_never_replaces_a_users() -> None:
    labels = {**NFD, nl.MIG_CAPABLE_LABEL: "true", nl.MIG_CONFIG_LABEL: "all-1g.10gb"}
    assert nl.gpu_node_labels(labels, HELM)[nl.MIG_CONFIG_LABEL] == "all-1g.10gb"


def test_no_default_mig_config_without_config_default_or_with_mig_manager_off() -> None:
    labels = {**NFD, nl.MIG_CAPABLE_LABEL: "true"}
    assert nl.MIG_CONFIG_LABEL not in nl.gpu_node_labels(labels, {})
    off = {**HELM, "migManager": {"enabled": False, **HELM["migManager"]}}
    assert nl.MIG_CONFIG_LABEL not in nl.gpu_node_labels(labels, off)


def test_sandbox_workloads_use_the_nodes_workload_config() -> None:
    spec = {"sandboxWorkloads": {"enabled": True, "mode": "kata"}}
    out = nl.gpu_node_labels({**NFD, nl.GPU_WORKLOAD_CONFIG_LABEL: "vm-passthrough"}, spec)
    assert deploy(out) == {
        "sandbox-validator": "true", "vfio-manager": "true", "kata-manager": "true",
        "cc-manager": "true", "client": "true", "kata-sandbox-device-plugin": "true",
    }  # fmt: skip
    assert nl.workload_config({nl.GPU_WORKLOAD_CONFIG_LABEL: "bogus"}, True) == (
        "container",
        "invalid GPU workload config: bogus",
    )


def test_label_patch_sets_changes_and_deletes() -> None:
    old = {"a": "1", "b": "2", "c": "3"}
    new = {"a": "1", "b": "x", "d": "4"}
    assert nl.label_patch(old, new) == {"b": "x", "d": "4", "c": None}
    assert nl.label_patch(old, old) == {}


def test_which_node_changes_call_for_relabelling() -> None:
    labelled = nl.gpu_node_labels(NFD, {})
    assert nl.relabel_needed(labelled, {**labelled, nl.MIG_CAPABLE_LABEL: "true"})
    assert nl.relabel_needed(
        labelled, {k: v for k, v in labelled.items() if k != nl.COMMON_GPU_LABEL}
    )
    assert not nl.relabel_needed(labelled, {**labelled, nl.MIG_CONFIG_LABEL: "all-1g.10gb"})
    assert nl.cluster_policy_wanted({}, {nl.COMMON_GPU_LABEL: "true"})
    assert nl.cluster_policy_wanted(labelled, {**labelled, nl.COMMON_OPERANDS_LABEL: "false"})
    assert not nl.cluster_policy_wanted(labelled, {**labelled, "unrelated": "x"})
