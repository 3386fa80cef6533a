"""The object controls (object_controls.go of gpu-operator v26.7.0) against an in-memory
cluster: what each step creates, updates, deletes and reports."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpulab.gpuoperator import api, controls, render, states
from gpulab.gpuoperator.states import ClusterPolicyController

Obj = dict[str, Any]
NS = "gpu-operator"


class FakeCluster:
    """Objects by (kind, namespace, name); every write is recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], Obj] = {}
        self.writes: list[tuple[str, str, str]] = []

    def cached(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        return self.objects.get((kind, namespace, name))

    def create(self, kind: str, obj: Obj) -> Obj:
        meta = obj["metadata"]
        self.objects[(kind, meta.get("namespace"), meta["name"])] = copy.deepcopy(obj)
        self.writes.append(("create", kind, meta["name"]))
        return obj

    def replace(self, kind: str, obj: Obj) -> Obj:
        meta = obj["metadata"]
        self.objects[(kind, meta.get("namespace"), meta["name"])] = copy.deepcopy(obj)
        self.writes.append(("replace", kind, meta["name"]))
        return obj

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        self.objects.pop((kind, namespace, name))
        self.writes.append(("delete", kind, name))


def state_controller(
    state: str, cluster: FakeCluster, spec: Obj | None = None, gpu_nodes: bool = True
) -> ClusterPolicyController:
    ctrl = ClusterPolicyController(
        singleton={"metadata": {"name": "cp", "uid": "u"}, "spec": spec or {}},
        has_gpu_nodes=gpu_nodes,
        has_nfd_labels=True,
    )
    docs = render.load_state(state)
    observed: list[tuple[str, str, str]] = []
    ctrl.add_state(
        state,
        controls.add_resources_controls(
            docs,
            cluster,
            NS,
            "gpulab:dev",
            lambda v, k, o: observed.append((v, k, o["metadata"]["name"])),
        ),
    )
    return ctrl


def step(ctrl: ClusterPolicyController) -> str:
    ctrl.idx = 0
    return ctrl.step()


def test_first_pass_creates_every_object_and_the_new_daemonset_is_not_ready() -> None:
    cluster = FakeCluster()
    ctrl = state_controller("state-device-plugin", cluster)
    assert step(ctrl) == api.NOT_READY
    assert cluster.writes == [
        ("create", "ServiceAccount", "nvidia-device-plugin"),
        ("create", "ClusterRole", "nvidia-device-plugin"),
        ("create", "ClusterRoleBinding", "nvidia-device-plugin"),
        ("create", "DaemonSet", "nvidia-device-plugin-daemonset"),
    ]


def _set_status(cluster: FakeCluster, name: str, **status: int) -> None:
    ds = cluster.objects[("DaemonSet", NS, name)]
    ds["metadata"]["generation"] = 1
    ds["status"] = {"observedGeneration": 1, **status}


def test_an_unchanged_pass_writes_nothing_and_reads_readiness() -> None:
    cluster = FakeCluster()
    ctrl = state_controller("state-device-plugin", cluster)
    step(ctrl)
    cluster.writes.clear()
    _set_status(cluster, "nvidia-device-plugin-daemonset", desiredNumberScheduled=2,
                updatedNumberScheduled=2, numberAvailable=1, numberUnavailable=1)  # fmt: skip
    assert step(ctrl) == api.NOT_READY
    _set_status(cluster, "nvidia-device-plugin-daemonset", desiredNumberScheduled=2,
                updatedNumberScheduled=2, numberAvailable=2)  # fmt: skip
    assert step(ctrl) == api.READY
    assert cluster.writes == []


def test_a_changed_clusterpolicy_updates_its_objects_but_not_service_accounts() -> None:
    cluster = FakeCluster()
    step(state_controller("state-device-plugin", cluster, {"mig": {"strategy": "single"}}))
    cluster.objects[("ServiceAccount", NS, "nvidia-device-plugin")]["metadata"]["annotations"][
        render.HASH_ANNOTATION
    ] = "stale"
    cluster.writes.clear()
    ctrl = state_controller("state-device-plugin", cluster, {"mig": {"strategy": "mixed"}})
    assert step(ctrl) == api.NOT_READY  # "DaemonSet is different, updating"
    assert cluster.writes == [("replace", "DaemonSet", "nvidia-device-plugin-daemonset")]


def test_disabling_a_state_deletes_what_exists() -> None:
    cluster = FakeCluster()
    step(state_controller("state-device-plugin", cluster))
    cluster.writes.clear()
    ctrl = state_controller("state-device-plugin", cluster, {"devicePlugin": {"enabled": False}})
    assert step(ctrl) == api.DISABLED
    assert sorted(cluster.writes) == [
        ("delete", "ClusterRole", "nvidia-device-plugin"),
        ("delete", "ClusterRoleBinding", "nvidia-device-plugin"),
        ("delete", "DaemonSet", "nvidia-device-plugin-daemonset"),
        ("delete", "ServiceAccount", "nvidia-device-plugin"),
    ]
    cluster.writes.clear()
    assert step(ctrl) == api.DISABLED and cluster.writes == []


def test_no_daemonset_before_there_are_gpu_nodes() -> None:
    cluster = FakeCluster()
    assert step(state_controller("state-driver", cluster, gpu_nodes=False)) == api.READY
    assert [w[1] for w in cluster.writes] == ["ServiceAccount"]


def test_a_custom_mig_parted_configmap_replaces_the_default_one() -> None:
    cluster = FakeCluster()
    step(
        state_controller("state-mig-manager", cluster, {"migManager": {"config": {"name": "mine"}}})
    )
    made = {name for verb, kind, name in cluster.writes if kind == "ConfigMap"}
    assert made == {"default-gpu-clients"}


def test_the_runtime_classes_and_the_cdi_ones_only_while_cdi_is_enabled() -> None:
    cluster = FakeCluster()
    assert step(state_controller("pre-requisites", cluster, {})) == api.READY
    made = {(name, cluster.objects[("RuntimeClass", None, name)]["handler"])
            for _v, _k, name in cluster.writes}  # fmt: skip
    assert made == {("nvidia", "nvidia"), ("nvidia-cdi", "nvidia-cdi"),
                    ("nvidia-legacy", "nvidia-legacy")}  # fmt: skip
    cluster.writes.clear()
    off = state_controller("pre-requisites", cluster, {"cdi": {"enabled": False}})
    assert step(off) == api.READY
    assert sorted(cluster.writes) == [
        ("delete", "RuntimeClass", "nvidia-cdi"),
        ("delete", "RuntimeClass", "nvidia-legacy"),
    ]
    cluster.writes.clear()
    assert step(off) == api.READY and cluster.writes == []
    renamed = FakeCluster()
    step(state_controller("pre-requisites", renamed, {"operator": {"runtimeClass": "nv"}}))
    assert renamed.objects[("RuntimeClass", None, "nv")]["handler"] == "nv"


def test_every_asset_kind_is_managed() -> None:
    for state in states.STATES:
        for doc in render.load_state(state):
            assert doc["kind"] in controls.RESOURCES
    with pytest.raises(render.AssetError, match=r"\['PodDisruptionBudget'\]"):
        controls.add_resources_controls(
            [{"kind": "PodDisruptionBudget"}], FakeCluster(), NS, "i", lambda *a: None
        )


@pytest.mark.parametrize(
    ("status", "strategy", "ready"),
    [
        ({"desiredNumberScheduled": 0}, "RollingUpdate", True),
        ({"desiredNumberScheduled": 2, "numberUnavailable": 1}, "RollingUpdate", False),
        ({"desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2,
          "observedGeneration": 3}, "RollingUpdate", True),
        ({"desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2,
          "observedGeneration": 2}, "RollingUpdate", False),  # generation 3 not observed yet
        ({"desiredNumberScheduled": 2, "updatedNumberScheduled": 1, "numberAvailable": 2,
          "observedGeneration": 3}, "RollingUpdate", False),
        ({"desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberReady": 2},
         "OnDelete", True),
        ({"desiredNumberScheduled": 2, "updatedNumberScheduled": 1, "numberReady": 2},
         "OnDelete", False),  # a pod still runs the old template
    ],
)  # fmt: skip
def test_daemonset_ready(status: dict, strategy: str, ready: bool) -> None:
    ds = {"metadata": {"generation": 3, "name": "ds"},
          "spec": {"updateStrategy": {"type": strategy}}, "status": status}  # fmt: skip
    assert (controls.daemonset_ready(ds) == api.READY) is ready
    # the trace says why: nothing when every pod is there, a reason otherwise (a ready
    # DaemonSet with no node selected is why a state goes ready -> notReady -> ready)
    why = controls.daemonset_why(ds)
    assert bool(why) is (not ready or status["desiredNumberScheduled"] == 0)
    assert why == "" or why.startswith("DaemonSet ds: ")
