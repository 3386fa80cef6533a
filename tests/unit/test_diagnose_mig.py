"""gpulab diagnose's mig link reads the mig-parted config the node's MIG manager uses:
mig-parted v0.15.0 builds it from the GPUs and publishes it as ``<node>-mig-config``;
gpu-operator v26.7.0's ``default-mig-parted-config`` is only its fallback."""

from __future__ import annotations

from test_diagnose import MIG_CONFIGMAP, _mig_node
from test_gpuoperator_migparted import a100_40

from gpulab.diagnose.chain import BROKEN, diagnose
from gpulab.diagnose.objects import ObjectSet, Target
from gpulab.gpuoperator import migmanager, migparted

GENERATED = {
    "metadata": {
        "name": migmanager.node_configmap_name("mig"),
        "namespace": "gpu-operator",
        "labels": {**migmanager.NODE_CONFIGMAP_LABELS, migmanager.NODE_NAME_LABEL: "mig"},
    },
    "data": {"config.yaml": migparted.config_yaml(migparted.build_config([a100_40(0)]))},
}


def _mig_link(config: str, configmaps: list[dict]) -> object:
    objs = ObjectSet(
        Target("node", "mig"), nodes=[_mig_node(config, "failed")], configmaps=configmaps
    )
    return next(link for link in diagnose(objs).links if link.name == "mig")


def test_the_nodes_generated_config_is_the_one_in_force() -> None:
    """all-balanced exists only in the generated config; all-1g.10gb in both."""
    link = _mig_link("all-balanced", [MIG_CONFIGMAP, GENERATED])
    assert link.state == BROKEN and "failed to apply all-balanced" in link.summary
    typo = _mig_link("all-1g-10gb", [MIG_CONFIGMAP, GENERATED])
    assert (
        typo.summary
        == "nvidia.com/mig.config=all-1g-10gb names no config in ConfigMap mig-mig-config"
    )
    assert "did you mean all-1g.10gb?" in typo.fix


def test_without_a_generated_config_the_default_one_is_read() -> None:
    link = _mig_link("all-balanced", [MIG_CONFIGMAP])
    assert link.state == BROKEN
    assert "names no config in ConfigMap default-mig-parted-config" in link.summary
    other_node = {**GENERATED, "metadata": {**GENERATED["metadata"], "name": "b-mig-config"}}
    link = _mig_link("all-balanced", [MIG_CONFIGMAP, other_node])  # another node's: not read
    assert "names no config in ConfigMap default-mig-parted-config" in link.summary
