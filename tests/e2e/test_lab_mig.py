"""lab-mig on its own cluster (harness/clusters/labs-mig.yaml: the GPU Operator deploys
the device plugin, GFD and the MIG manager; on gpu-mig-b the device-plugin chapter's
DaemonSet runs instead): the broken state is diagnosed naming the mig link on gpu-mig and
the node link on both pods; the documented fixes make `gpulab lab check mig` pass; after
the first, inference's diagnosis moves from the unapplied layout to the MIG strategy; the
config in force is the one the MIG manager built from the node's GPUs; the "for good" fix
of not-paused (the standalone plugin's DaemonSet selects nvidia.com/gpu.deploy.client)
makes the MIG manager pause that plugin around the next change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Cluster, running_cluster
from kubernetes import client
from labs_helpers import first_broken, run_lab

from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import nodelabels as nl
from gpulab.wait import wait_for
from harness.labs import mig, newest_pod

pytestmark = pytest.mark.local_backend  # the NVML shim's MIG state


@pytest.fixture(scope="module")
def labs_mig() -> Iterator[Cluster]:
    with running_cluster(mig.SPEC) as c:
        yield c


def test_lab_mig(labs_mig: Cluster) -> None:
    def fix(api: client.ApiClient) -> None:
        core = client.CoreV1Api(api)
        pod = newest_pod(api, mig.NS, mig.APP)
        assert pod is not None
        ref = f"{mig.NS}/{pod.metadata.name}"
        link, answer = first_broken(api, "pod", ref)
        assert link == "node" and f"names no config in ConfigMap {mig.NODE_CONFIGMAP}" in answer
        generated = core.read_namespaced_config_map(mig.NODE_CONFIGMAP, mig.OPERATOR_NS)
        (owner,) = generated.metadata.owner_references
        assert owner.kind == "Pod" and owner.name.startswith("nvidia-mig-manager-")
        assert mig.CONFIG in mig.config_names(generated)
        core.patch_node(mig.NODE, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: mig.CONFIG}}})

        def strategy_named() -> str | None:
            answer = first_broken(api, "pod", ref)[1]
            return answer if "MIG strategy is single" in answer else None

        answer = wait_for(strategy_named, 90, "the layout applied under strategy single", 1)
        assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-40GB-MIG-1g.10gb" in answer
        assert [s.fixed for s in mig.LAB.check(api)] == [True, False, False]  # config only
        # not-paused, for good: the standalone plugin selects nvidia.com/gpu.deploy.client
        client.AppsV1Api(api).patch_namespaced_daemon_set(
            mig.STANDALONE, "gpulab-system", mig.CLIENT_SELECTOR
        )
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            cp.GROUP,
            cp.VERSION,
            "clusterpolicies",
            "cluster-policy",
            {"spec": {"mig": {"strategy": "mixed"}}},
        )

    run_lab(labs_mig, mig.NAME, fix)
    # run_lab stopped the lab: the nodes are back to whole GPUs ...
    core = client.CoreV1Api(labs_mig.api)
    for node in (mig.NODE, mig.NODE_B):
        labels = core.read_node(node).metadata.labels
        assert labels[nl.MIG_CONFIG_LABEL] == nl.MIG_CONFIG_DISABLED
        assert labels[nl.MIG_CONFIG_STATE_LABEL] == "success"
    # ... and the MIG manager paused the standalone plugin (it selects gpu.deploy.client
    # now) for that change: only a plugin started after it lists 8 whole GPUs (NVML is
    # read once; without the pause it keeps advertising the 32 MIG devices)
    wait_for(
        lambda: core.read_node(mig.NODE_B).status.allocatable.get("nvidia.com/gpu") == "8",
        90,
        f"the standalone plugin on {mig.NODE_B} to come back on whole GPUs",
        1,
    )


def test_lab_mig_starts_again_from_its_fixed_state(labs_mig: Cluster) -> None:
    """A second start (after the fixes: strategy mixed, the standalone plugin restarted on
    MIG devices) breaks the same three things again."""
    lab = mig.LAB
    lab.start(labs_mig.backend, print)
    try:
        api = labs_mig.api
        for case in lab.cases(api):
            link, answer = first_broken(api, *case.target)
            assert link == case.link, f"{case.name}: {answer}"
        assert not any(s.fixed for s in lab.check(api))
    finally:
        lab.stop(labs_mig.backend, print)
