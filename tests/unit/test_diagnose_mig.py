"""gpulab diagnose's mig link reads the mig-parted config the node's MIG manager uses:
the ConfigMap the ClusterPolicy names in ``spec.migManager.config.name`` (gpu-operator
v26.7.0 hands it over as CONFIG_FILE); without one, mig-parted v0.15.0 builds it from the
GPUs and publishes it as ``<node>-mig-config``; gpu-operator v26.7.0's
``default-mig-parted-config`` is only its fallback."""

from __future__ import annotations

from typing import Any

import pytest
from test_diagnose import MIG_CONFIGMAP, _mig_node
from test_gpuoperator_migparted import a100_40

from gpulab.diagnose import reader
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


MINE = {
    "metadata": {"name": "mine", "namespace": "gpu-operator"},
    "data": {"config.yaml": "version: v1\nmig-configs:\n  all-disabled: []\n  my-split: []\n"},
}


def _policy(config: str | None, name: str = "cluster-policy", created: str = "2026-01-01") -> dict:
    mig = {"config": {"name": config}} if config is not None else {}
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": name, "creationTimestamp": f"{created}T00:00:00Z"},
        "spec": {"migManager": mig},
    }


def _mig_link(config: str, configmaps: list[dict], policies: list[dict] | None = None) -> Any:
    objs = ObjectSet(
        Target("node", "mig"),
        nodes=[_mig_node(config, "failed")],
        configmaps=configmaps,
        cluster_policies=policies or [],
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


def test_the_clusterpolicys_custom_config_is_the_one_in_force() -> None:
    """With spec.migManager.config.name the MIG manager reads that ConfigMap (CONFIG_FILE)
    and builds none: neither the default nor a <node>-mig-config is read."""
    link = _mig_link("all-1g.10gb", [MIG_CONFIGMAP, GENERATED, MINE], [_policy("mine")])
    assert link.state == BROKEN
    assert link.summary == "nvidia.com/mig.config=all-1g.10gb names no config in ConfigMap mine"
    link = _mig_link("my-split", [MIG_CONFIGMAP, GENERATED, MINE], [_policy("mine")])
    assert "failed to apply my-split" in link.summary  # found in mine, only there
    # only the singleton (the oldest) ClusterPolicy counts; an empty name is the default
    newer = _policy("mine", "later", "2026-02-01")
    link = _mig_link("my-split", [MIG_CONFIGMAP, MINE], [newer, _policy("")])
    assert "names no config in ConfigMap default-mig-parted-config" in link.summary


def test_a_custom_config_that_was_not_read_stands_for_no_other() -> None:
    link = _mig_link("my-split", [MIG_CONFIGMAP, GENERATED], [_policy("mine")])
    assert "names no config" not in link.summary and "failed to apply my-split" in link.summary


class FakeApis:
    """Every API the reader calls: empty lists, but the ClusterPolicy and the ConfigMaps
    it is asked for by name or label (recorded in ``asked``)."""

    def __init__(self, policies: list[dict], configmaps: list[dict]) -> None:
        self.policies, self.configmaps = policies, configmaps
        self.asked: list[str] = []

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> dict:
        found = plural == "clusterpolicies" and (group, version) == ("nvidia.com", "v1")
        return {"items": self.policies if found else []}

    def list_config_map_for_all_namespaces(self, **selector: str) -> dict:
        (how,) = selector.values()
        self.asked.append(how)
        if how.startswith("metadata.name="):
            name = how.removeprefix("metadata.name=")
            return {"items": [c for c in self.configmaps if c["metadata"]["name"] == name]}
        return {"items": [c for c in self.configmaps if c["metadata"].get("labels")]}

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: {"items": []}


def test_the_reader_fetches_the_clusterpolicy_and_the_configmap_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    apis = FakeApis([_policy("mine")], [MIG_CONFIGMAP, GENERATED, MINE])
    for name in ("CoreV1Api", "BatchV1Api", "AdmissionregistrationV1Api", "CoordinationV1Api",
                 "CustomObjectsApi"):  # fmt: skip
        monkeypatch.setattr(reader.client, name, lambda _api: apis)
    objs = reader.read(None, Target("node", "mig"))  # type: ignore[arg-type]
    assert objs.cluster_policies == [_policy("mine")]
    assert "nvidia.com/v1" in objs.installed
    assert "metadata.name=mine" in apis.asked
    assert sorted(c["metadata"]["name"] for c in objs.configmaps) == [
        "default-mig-parted-config",
        "mig-mig-config",
        "mine",
    ]
    objs.nodes = [_mig_node("my-split", "failed")]
    link = next(link for link in diagnose(objs).links if link.name == "mig")
    assert "failed to apply my-split" in link.summary
