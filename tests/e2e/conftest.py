"""e2e fixtures: one local-backend cluster (harness/clusters/e2e.yaml) for the session.

Every test in this directory is marked `e2e`; `make test` runs them after the unit and
component tests, against real kube-apiserver / controller-manager / scheduler and kwok.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from gpulab.kube import api_client
from harness.local import LocalCluster
from harness.spec import ClusterSpec, load


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Cluster:
    spec: ClusterSpec
    local: LocalCluster
    kubeconfig: Path
    api: client.ApiClient


@contextlib.contextmanager
def running_cluster(spec_name: str) -> Iterator[Cluster]:
    """A local-backend cluster from harness/clusters/<spec_name>.yaml, up for the block."""
    spec = load(spec_name)
    local = LocalCluster(spec)
    local.down(print)  # a cluster left over from an interrupted run
    local.up(print)
    try:
        yield Cluster(spec, local, local.kubeconfig, api_client(local.kubeconfig))
    finally:
        local.down(print)


@contextlib.contextmanager
def fresh_namespace(api: client.ApiClient, prefix: str) -> Iterator[str]:
    """A new namespace whose default ServiceAccount exists (pods are admitted); its pods
    are gone (their devices free) before the next test starts."""
    from gpulab.wait import wait_for

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    wait_for(lambda: core.list_namespaced_service_account(name).items, 30, "default ServiceAccount")
    try:
        yield name
    finally:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        wait_for(lambda: not core.list_namespaced_pod(name).items, 60, f"pods of {name} to go")
        core.delete_namespace(name)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with running_cluster("e2e") as c:
        yield c


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster.api, "e2e") as name:
        yield name
