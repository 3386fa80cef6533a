"""The scheduling chapter's harness parts: specs, the addon's files, the shipped profile,
the test peer's build recipe (pure, no cluster)."""

from __future__ import annotations

import io

import yaml

from gpulab.framework import config
from gpulab.framework.runtime import Framework
from gpulab.informer import Store
from gpulab.nodeagent.topology import MachineInfo
from gpulab.schedulerplugins.commands import registry
from gpulab.trace import Tracer
from harness import binaries
from harness.addons import scheduling
from harness.apply import MANIFESTS, load_documents
from harness.spec import load


def test_scheduling_specs_have_their_own_ports_and_the_addon(monkeypatch) -> None:
    monkeypatch.delenv("GPULAB_PORT_OFFSET", raising=False)
    workshop, e2e = load("scheduling"), load("scheduling-e2e")
    assert workshop.ports["apiserver"] == 11443 and e2e.ports["apiserver"] == 12443
    assert set(workshop.ports.values()) == {11443, 11379, 11380, 11257, 11259}
    assert set(e2e.ports.values()) == {12443, 12379, 12380, 12257, 12259}
    assert workshop.addons == e2e.addons == ("scheduling", "device-plugin")
    assert [n.name for n in workshop.nodes] == [n.name for n in e2e.nodes]


def test_the_shipped_profile_builds_with_both_plugins() -> None:
    cfg = config.parse(scheduling.profile_config())
    assert cfg.kubeconfig is None  # in a pod: its ServiceAccount

    class Informers:
        def store(self, resource, handlers=None):
            return Store()

    fwk = Framework(
        cfg.profiles[0], registry(), informers=Informers(), tracer=Tracer("t", stream=io.StringIO())
    )
    assert fwk.profile_name == "gpulab-scheduler"
    assert [p.name for p in fwk.points["queueSort"]] == ["Coscheduling"]
    assert [p.name for p in fwk.points["permit"]] == ["Coscheduling"]
    assert "NodeResourceTopologyMatch" in [p.name for p in fwk.points["filter"]]
    assert fwk.plugins["Coscheduling"].pg_reject_threshold == 0.5


def test_kubelet_config_and_machine_files_for_a_node() -> None:
    data = yaml.safe_load(load("scheduling").kubelet.to_yaml())
    assert data["kind"] == "KubeletConfiguration"
    assert data["topologyManagerPolicy"] == "single-numa-node"
    h100 = MachineInfo.of("gpu-h100", "h100-80gb-x8", 16, 256 * 2**30)
    assert [(n.id, n.cpus) for n in h100.numa_nodes] == [(0, 8), (1, 8)]


def test_manifests_are_complete_documents() -> None:
    docs = load_documents([MANIFESTS / "scheduling"])
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("CustomResourceDefinition", "podgroups.scheduling.x-k8s.io") in kinds
    assert ("CustomResourceDefinition", "noderesourcetopologies.topology.node.k8s.io") in kinds
    assert ("DaemonSet", "topology-updater") in kinds
    assert {"gpulab-scheduler", "podgroup-controller"} <= {n for k, n in kinds if k == "Deployment"}


def test_peer_build_mirrors_version_replaces() -> None:
    gomod = "replace (\n\tk8s.io/api => k8s.io/api v0.35.4\n\tk8s.io/x => ../x\n)\n"
    assert binaries._version_replaces(gomod) == [("k8s.io/api", "k8s.io/api", "v0.35.4")]
    assert binaries.SCHEDULER_PLUGINS not in binaries.COMPONENTS  # not in `make binaries`
