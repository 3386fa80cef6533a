"""e2e fixtures: one lab cluster (harness/clusters/e2e.yaml) for the session, through the
lab's pytest-kubernetes cluster manager (harness/pytest_plugin.py).

Every test in this directory is marked `e2e`; `make test` runs them after the unit and
component tests, on the local backend: real kube-apiserver / controller-manager /
scheduler and kwok.
`--gpulab-backend kind` runs them on kind, `--k8s-kubeconfig-override PATH` (or
`--gpulab-kubeconfig PATH`) on an existing cluster brought up from the e2e spec; tests
marked `local_backend` (host processes, fault files) are skipped there.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from harness.pytest_plugin import GpulabManager, LabOptions, lab_cluster, lab_options

# What the tests' `cluster` is: spec, api, kubeconfig, local (the LocalCluster) and the
# k8s fixture's kubectl()/apply()/wait()/logs().
Cluster = GpulabManager


def pytest_configure(config: pytest.Config) -> None:
    # The suite's default is the verified local backend, even where Docker answers.
    if config.getoption("gpulab_backend") is None:
        config.option.gpulab_backend = "local"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@contextlib.contextmanager
def running_cluster(spec_name: str, options: LabOptions | None = None) -> Iterator[Cluster]:
    """A fresh lab cluster from harness/clusters/<spec_name>.yaml, up for the block (a
    cluster left over from an interrupted run is replaced). Without ``options``: the
    local backend."""
    options = options or LabOptions(backend="local")
    with lab_cluster(options, spec_name) as c:
        yield c


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
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with running_cluster("e2e", lab_options(request.config)) as c:
        yield c


@pytest.fixture(scope="session")
def scheduling_e2e() -> Iterator[Cluster]:
    """The scheduling chapter's cluster (harness/clusters/scheduling-e2e.yaml), shared by
    its four test modules: one start instead of four. Each module undoes what it changes
    (node taints, peer schedulers, RBAC) and each test's namespace is empty before the
    next starts."""
    with running_cluster("scheduling-e2e") as c:
        yield c


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster.api, "e2e") as name:
        yield name
