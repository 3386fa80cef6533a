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

import argparse
import contextlib
import io
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
from kubernetes import client

from harness.local import LocalCluster
from harness.pytest_plugin import GpulabManager, LabOptions, lab_cluster, lab_options
from harness.spec import load

# What the tests' `cluster` is: spec, api, kubeconfig, local (the LocalCluster) and the
# k8s fixture's kubectl()/apply()/wait()/logs().
Cluster = GpulabManager


def pytest_configure(config: pytest.Config) -> None:
    # The suite's default is the verified local backend, even where Docker answers.
    if config.getoption("gpulab_backend") is None:
        config.option.gpulab_backend = "local"


# `make test` runs on three pytest-xdist workers (`-n 3 --dist loadgroup`), two of them
# for the e2e units (see pytest_xdist_make_scheduler). Each e2e module
# brings up its own cluster (its spec's ports), except modules that share a session
# cluster: those are one unit of work, run by one worker in order.
SHARED_CLUSTERS = {
    "e2e": ("test_cluster.py", "test_device_plugin.py", "test_kueue_e2e.py", "test_pod_runner.py"),
    "scheduling-e2e": (
        "test_scheduling_coscheduling.py",
        "test_scheduling_crosscheck.py",
        "test_scheduling_numa.py",
        "test_scheduling_upstream_peer.py",
    ),
}
SESSION_CLUSTER_FIXTURES = {"cluster": "e2e", "scheduling_e2e": "scheduling-e2e"}
# Seconds each unit took in one serial run (pytest --durations=0, 2026-12-01), only to
# start the longest first so that both workers finish at about the same time.
SECONDS = {
    "test_kind.py": 600,  # measured 2026-12-02 under load: a kind cluster and 5 chapters
    "test_kind_gpu_operator.py": 475,
    "test_labs.py": 244,
    "e2e": 195,
    "test_hami_e2e.py": 173,
    "scheduling-e2e": 113,
    "test_gpu_operator.py": 110,
    "test_volcano_e2e.py": 101,
    "test_reliability.py": 150,  # measured 2026-12-07, with the GPU Operator module: 187
    "test_lab_mig.py": 89,
    "test_scheduling_demos.py": 70,
    "test_kueue_visibility.py": 56,
    "test_reliability_gpu_operator.py": 45,
    "test_dashboard_browser.py": 72,
    "test_lab_volcano.py": 41,
    "test_volcano_demo.py": 30,
    "test_device_plugin_demo.py": 30,  # was part of "e2e"
    "test_external_backend.py": 28,
    "test_lifecycle.py": 17,
    "test_plugin_in_a_project.py": 14,
}


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its e2e cluster group, else its module."""
    module = nodeid.split("::", 1)[0]
    if not module.startswith("tests/e2e/"):
        return module
    name = Path(module).name
    return next((group for group, mods in SHARED_CLUSTERS.items() if name in mods), name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)
            _check_shared_cluster(item)
    if hasattr(config, "workerinput"):  # an xdist worker: longest units first
        items.sort(key=lambda item: -SECONDS.get(work_unit(item.nodeid), 0))


def _check_shared_cluster(item: pytest.Item) -> None:
    """A test on a session cluster must be in that cluster's group, else two workers
    would bring the same spec (the same ports) up at once."""
    info = getattr(item, "_fixtureinfo", None)
    for fixture, group in SESSION_CLUSTER_FIXTURES.items():
        defs = info.name2fixturedefs.get(fixture) if info else None
        if defs and defs[-1].scope == "session" and work_unit(item.nodeid) != group:
            raise pytest.UsageError(
                f"{item.nodeid} uses the session fixture `{fixture}`: add its module to "
                f'SHARED_CLUSTERS["{group}"] in tests/e2e/conftest.py'
            )


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest -n 3 --dist loadgroup` (make test): one unit of work per cluster group
    (work_unit), handed out in collection order (longest first). With three workers or
    more the last one runs only unit and component tests, from the start, beside the
    others' clusters: they fill the CPU the clusters leave idle while they wait, and no
    more than two clusters run at once. Grouped by path here: pytest 9.2 no longer sees
    the `@group` suffix pytest-xdist 3.8 writes into node ids for `xdist_group` marks."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByCluster(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.e2e_units: set[str] = set()

        def _split_scope(self, nodeid: str) -> str:
            unit = work_unit(nodeid)
            if nodeid.startswith("tests/e2e/"):
                self.e2e_units.add(unit)
            return unit

        def _next_unit(self, node: Any) -> str | None:
            light = len(self.nodes) >= 3 and node is self.nodes[-1]
            return next((u for u in self.workqueue if not (light and u in self.e2e_units)), None)

        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if self._next_unit(node) is None:
                node.shutdown()
            elif self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)

        def _assign_work_unit(self, node: Any) -> None:
            unit = self._next_unit(node)
            if unit is None:
                node.shutdown()
                return
            tests = self.workqueue.pop(unit)
            self.assigned_work.setdefault(node, {})[unit] = tests
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(t) for t, done in tests.items() if not done])

    config.option.loadscopereorder = False  # keep the longest-first order
    return ByCluster(config, log)


@contextlib.contextmanager
def running_cluster(spec_name: str, options: LabOptions | None = None) -> Iterator[Cluster]:
    """A fresh lab cluster from harness/clusters/<spec_name>.yaml, up for the block (a
    cluster left over from an interrupted run is replaced). Without ``options``: the
    local backend."""
    options = options or LabOptions(backend="local")
    with lab_cluster(options, spec_name) as c:
        yield c


class _Tee(io.StringIO):
    """Keeps what is written and passes it on (pytest still shows it on a failure)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text)
        return super().write(text)


def run_demo_from_stopped(spec_name: str, run: Callable[[argparse.Namespace], int]) -> str:
    """`gpulab down; make demo-X` on a local cluster of the demo's shape, stopped after;
    what the demo printed (for tests/e2e/golden.py's assert_shape)."""
    local = LocalCluster(load(spec_name))
    local.down(print)
    assert not local.running()
    # the demos' console writes to whatever sys.stdout is, from every thread
    tee = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            assert run(argparse.Namespace(spec=spec_name, backend="local")) == 0
    finally:
        local.down(print)
    return tee.getvalue()


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


# Each session cluster stops after the last test of its group (not at the end of the
# session): an idle cluster keeps taking CPU (about a tenth of a core for the e2e spec)
# that the other worker's clusters need.
_LAST_OF_GROUP: dict[str, str] = {}
_OPEN_GROUPS: dict[str, contextlib.ExitStack] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    _LAST_OF_GROUP.clear()
    for item in session.items:
        group = work_unit(item.nodeid)
        if group in SHARED_CLUSTERS:
            _LAST_OF_GROUP[group] = item.nodeid


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    group = work_unit(item.nodeid)
    if _LAST_OF_GROUP.get(group) == item.nodeid and group in _OPEN_GROUPS:
        _OPEN_GROUPS.pop(group).close()


@contextlib.contextmanager
def group_cluster(group: str, options: LabOptions | None = None) -> Iterator[Cluster]:
    """The session cluster of SHARED_CLUSTERS[group] (spec harness/clusters/<group>.yaml),
    stopped after the group's last test or at the end of the session, whichever is first."""
    with contextlib.ExitStack() as stack:
        _OPEN_GROUPS[group] = stack
        yield stack.enter_context(running_cluster(group, options))
    _OPEN_GROUPS.pop(group, None)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with group_cluster("e2e", lab_options(request.config)) as c:
        yield c


@pytest.fixture(scope="session")
def scheduling_e2e() -> Iterator[Cluster]:
    """The scheduling chapter's cluster (harness/clusters/scheduling-e2e.yaml), shared by
    its four test modules: one start instead of four. Each module undoes what it changes
    (node taints, peer schedulers, RBAC) and each test's namespace is empty before the
    next starts."""
    with group_cluster("scheduling-e2e") as c:
        yield c


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster.api, "e2e") as name:
        yield name
