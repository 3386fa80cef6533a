"""A MIG reconfiguration hurt mid-flow (docs/reliability.md): kube-apiserver frozen while
the MIG manager applies a layout, then the operator and the MIG manager killed while it
applies the next one, on a GPU Operator cluster of its own
(harness/clusters/reliability-gpuop-e2e.yaml). Each layout ends applied and advertised,
the ClusterPolicy ready again, the operands restarted only as the test expects."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import yaml
from conftest import Cluster, running_cluster
from kubernetes import client
from test_reliability import FREEZE_SECONDS, components, frozen, restarts_since

from gpulab.gpuoperator import api as cp
from gpulab.gpuoperator import nodelabels as nl
from gpulab.wait import WaitTimeout, wait_for
from harness.apply import MANIFESTS

SPEC = "reliability-gpuop-e2e"
NS = ("gpu-operator",)
A100 = "gpu-a100"


@pytest.fixture(scope="module")
def gcluster() -> Iterator[Cluster]:
    with running_cluster(SPEC) as c:
        yield c


def _labels(c: Cluster) -> dict[str, str]:
    return client.CoreV1Api(c.api).read_node(A100).metadata.labels or {}


def _allocatable(c: Cluster) -> dict[str, str]:
    return client.CoreV1Api(c.api).read_node(A100).status.allocatable or {}


def _policy_state(c: Cluster, name: str) -> str | None:
    body = client.CustomObjectsApi(c.api).get_cluster_custom_object(
        cp.GROUP, cp.VERSION, "clusterpolicies", name
    )
    return (body.get("status") or {}).get("state")


def _reconfigure(c: Cluster, config: str) -> None:
    """Ask for MIG layout ``config`` and wait until the MIG manager has taken it up."""
    client.CoreV1Api(c.api).patch_node(
        A100, {"metadata": {"labels": {nl.MIG_CONFIG_LABEL: config}}}
    )
    wait_for(
        lambda: _labels(c).get(nl.MIG_CONFIG_STATE_LABEL) == "pending",
        60,
        f"the MIG manager to start applying {config}",
        0.1,
    )


def _applied(c: Cluster, policy: str, resource: str, count: str) -> None:
    seen: list[tuple[str | None, str | None, str | None]] = [(None, None, None)]

    def applied() -> bool:
        seen[0] = (
            _labels(c).get(nl.MIG_CONFIG_STATE_LABEL),
            _allocatable(c).get(resource),
            _policy_state(c, policy),
        )
        return seen[0] == ("success", count, cp.READY)

    try:
        wait_for(applied, 180, f"{resource}={count} advertised", 0.5)
    except WaitTimeout:
        pytest.fail(f"(mig.config.state, {resource}, ClusterPolicy state) stayed {seen[0]}")


def test_a_mig_reconfiguration_survives_an_outage_and_the_operators_kill(
    gcluster: Cluster,
) -> None:
    body = yaml.safe_load((MANIFESTS / "gpu-operator/samples/clusterpolicy.yaml").read_text())
    client.CustomObjectsApi(gcluster.api).create_cluster_custom_object(
        cp.GROUP, cp.VERSION, "clusterpolicies", body
    )
    policy = body["metadata"]["name"]
    _applied(gcluster, policy, "nvidia.com/gpu", "8")
    before = components(gcluster.api, NS)

    _reconfigure(gcluster, "all-1g.5gb")
    with frozen(gcluster.local, "kube-apiserver"):
        time.sleep(FREEZE_SECONDS)
    _applied(gcluster, policy, "nvidia.com/mig-1g.5gb", "56")
    assert _allocatable(gcluster).get("nvidia.com/gpu") == "0"
    after_outage = components(gcluster.api, NS)
    # the MIG manager restarts the device plugin (a GPU client) on purpose; nothing else
    assert all(n <= 1 for n in restarts_since(gcluster.api, before, NS).values())

    _reconfigure(gcluster, "all-disabled")
    killed = [key for key in after_outage if "/gpu-operator/" in key or "mig-manager" in key]
    assert len(killed) >= 2, sorted(after_outage)
    for key in killed:
        os.kill(after_outage[key][2], signal.SIGKILL)
    _applied(gcluster, policy, "nvidia.com/gpu", "8")
    restarts = restarts_since(gcluster.api, after_outage, NS, killed)
    assert {key: restarts[key] for key in killed} == dict.fromkeys(killed, 1), restarts
    assert all(n <= 1 for n in restarts.values()), restarts
