"""pytest plugin: a GPU lab cluster in any test suite, as a pytest-kubernetes cluster.

Installed with the lab (entry point ``gpulab`` in ``pytest11``; ``pytest -p gpulab`` loads
it where plugin autoloading is off). It gives

- the fixture ``gpulab_cluster``: a :class:`GpulabManager`, a pytest-kubernetes
  ``AClusterManager`` with the API of its ``k8s`` fixture (``kubeconfig``, ``kubectl()``,
  ``apply()``, ``wait()``, ``logs()``, ``version()``, ``load_image()``, ``create()``,
  ``delete()``) for a lab cluster (a spec of ``harness/clusters``) on the chosen backend,
  with the spec's chapter addons; plus the lab's own ``spec``, ``api``, ``backend``;
- options ``--gpulab-spec NAME|PATH``, ``--gpulab-backend local|kind|k3d|external`` and
  ``--gpulab-kubeconfig PATH`` (an existing cluster; pytest-kubernetes'
  ``--k8s-kubeconfig-override`` does the same): the chapters are deployed onto it by the
  external backend and removed again afterwards, the cluster itself is left alone;
- the marker ``local_backend`` for tests that need the local backend's host processes
  (fault injection through the NVML shim's files, killing and restarting a component's
  process, reading its state directory); they are skipped, with the reason, when the run
  targets another backend or an existing cluster.

Mirrors pytest-kubernetes 0.9.0 ``pytest_kubernetes/providers/base.py`` (AClusterManager)
and ``plugin.py`` (the ``k8s`` fixture). Differences, upstream -> here:

- ``create()``: a cluster that already answers is used and left running by ``delete()``
  -> the same, decided by the backend (``running()``); ``create(fresh=True)`` replaces it
- ``delete()`` removes the kubeconfig file -> the kubeconfig belongs to the backend's
  state (or is the user's, for an existing cluster) and is kept
- ``kubectl()`` runs ``kubectl`` from PATH through a shell -> the lab's own v1.36.3
  kubectl when built, argv without a shell (arguments with spaces survive)
- ``apply()`` is ``kubectl apply -f`` -> the backend's server-side apply, so webhooks are
  wired for the backend as the lab's own manifests are
- ``ready()`` polls kubectl once a second -> ``/readyz`` and the default ServiceAccount
  through the API client
- ``@pytest.mark.k8s(...)`` -> ``@pytest.mark.gpulab(spec=..., addons=..., keep=...)``
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pytest_kubernetes.options import ClusterOptions
from pytest_kubernetes.providers.base import AClusterManager

Progress = Callable[[str], None]

LOCAL_ONLY_REASON = (
    "needs the local backend's host processes (fault injection, process control); "
    "this run targets {target}"
)


@dataclass(frozen=True)
class LabOptions:
    """Where a test run's lab clusters live: the spec, the backend, an existing cluster."""

    spec: str = "default"
    backend: str | None = None  # None: $GPULAB_BACKEND, else local
    kubeconfig: Path | None = None  # an existing cluster: the external backend

    @property
    def backend_name(self) -> str:
        if self.kubeconfig is not None:
            return "external"
        if self.backend:
            return self.backend
        from harness.backends import default_backend

        return default_backend()


def lab_options(config: pytest.Config) -> LabOptions:
    kubeconfig = config.getoption("gpulab_kubeconfig") or config.getoption(
        "k8s_kubeconfig_override", default=None
    )
    return LabOptions(
        spec=config.getoption("gpulab_spec"),
        backend=config.getoption("gpulab_backend"),
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
    )


class GpulabManager(AClusterManager):
    """A lab cluster (harness/clusters spec) managed the pytest-kubernetes way.

    ``provider_config`` names the spec (a name in harness/clusters or a YAML path); the
    cluster's name is the spec's. ``kubeconfig`` given means an existing cluster: the
    external backend deploys the chapters onto it.
    """

    def __init__(
        self,
        cluster_name: str | None = None,
        provider_config: str | None = None,
        kubeconfig: Path | None = None,
        backend: str | None = None,
        progress: Progress = print,
    ) -> None:
        self._spec_ref = provider_config or cluster_name or "default"
        self._external = Path(kubeconfig) if kubeconfig else None
        self._backend_choice = "external" if kubeconfig else backend
        self.progress = progress
        self._api: Any = None
        super().__init__(cluster_name, None, None)
        self._cluster_options.kubeconfig_path = self.backend.kubeconfig

    # ------------------------------------------------------------ pytest-kubernetes hooks

    def _set_cluster_name(self, cluster_name: str | None, provider_config: Any) -> str:
        from harness.spec import load

        self.spec = load(self._spec_ref)
        self._cluster_options.cluster_name = self.spec.name
        return self.spec.name

    @classmethod
    def get_binary_name(cls) -> str:
        return "gpulab"

    def _ensure_executable(self) -> None:
        """Nothing to find on PATH: the lab brings clusters up in this process."""

    @property
    def backend_name(self) -> str:
        return LabOptions(self.spec.name, self._backend_choice, self._external).backend_name

    @property
    def backend(self) -> Any:
        """The cluster's harness.backends Backend (local, kind, k3d or external)."""
        if getattr(self, "_backend", None) is None:
            from harness.backends import get_backend

            self._backend = get_backend(self.backend_name, self.spec, self._external)
        return self._backend

    def _on_create(self, cluster_options: ClusterOptions, **kwargs: Any) -> None:
        if self.backend_name == "external":
            self.backend.up(self.progress)
            return
        from harness.backends import ensure_up

        ensure_up(self.spec, self.backend_name, self.progress)

    def _on_delete(self) -> None:
        self.backend.down(self.progress)
        if self.backend_name != "external":
            from harness.backends import forget

            forget(self.spec)

    # ------------------------------------------------------------ lifecycle

    def create(
        self,
        cluster_options: ClusterOptions | None = None,
        timeout: int = 90,
        fresh: bool = False,
        addons: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        """Bring the cluster up with its spec's addons and ``addons``, unless it runs.

        A cluster that already runs is used and left running by :meth:`delete`;
        ``fresh=True`` takes it down first (on an existing cluster: removes what a
        previous ``create`` deployed) and this manager owns the new one.
        """
        if cluster_options:
            self._cluster_options = self._cluster_options | cluster_options
        if self.backend.running() and fresh:
            self._on_delete()
        if self.backend.running():
            self._created = False
            self.progress(f"using the running cluster {self.cluster_name} ({self.backend_name})")
        else:
            self._on_create(self._cluster_options, **kwargs)
            self._created = True
        for addon in addons:
            self.backend.ensure_addon(addon, self.progress)
        self._cluster_options.kubeconfig_path = self.backend.kubeconfig
        if not self.ready(timeout):
            raise RuntimeError(f"Cluster '{self.cluster_name}' is not ready.")

    def ready(self, timeout: int = 20) -> bool:
        """/readyz answers ok and the default ServiceAccount exists (what
        pytest-kubernetes checks, through the API instead of kubectl)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from gpulab.wait import WaitTimeout, wait_for

        def ok() -> bool:
            try:
                readyz = self.api.call_api(
                    "/readyz",
                    "GET",
                    auth_settings=["BearerToken"],
                    _return_http_data_only=True,
                    _preload_content=False,
                )
                client.CoreV1Api(self.api).read_namespaced_service_account("default", "default")
            except (ApiException, OSError, ValueError):
                return False
            return readyz.status == 200

        try:
            wait_for(ok, timeout, f"cluster {self.cluster_name} to be ready", interval=0.5)
        except WaitTimeout:
            return False
        return True

    def delete(self) -> None:
        """Take down what this manager brought up; a cluster it found running stays.
        (The kubeconfig belongs to the backend, not to a temp file: it is not removed.)"""
        if self._created:
            self._on_delete()
            self._created = False
        self._api = None

    # ------------------------------------------------------------ the k8s fixture's API

    def kubectl(self, args: list[str], as_dict: bool = True, timeout: int = 60) -> dict | str:
        """kubectl against this cluster: the lab's own v1.36.3 kubectl when it is built,
        else the one on PATH. Raises RuntimeError with kubectl's stderr when it fails."""
        argv = [self._kubectl(), "--kubeconfig", str(self.kubeconfig), *args]
        if as_dict:
            argv += ["-o", "json"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.strip() or f"kubectl exited {proc.returncode}")
        if as_dict:
            return json.loads(proc.stdout)
        return proc.stdout

    @staticmethod
    def _kubectl() -> str:
        from harness import binaries

        built = binaries.binary("kubectl")
        if built.exists():
            return str(built)
        found = shutil.which("kubectl")
        if found is None:
            raise RuntimeError("no kubectl: run `make binaries` or put kubectl on PATH")
        return found

    def apply(self, input: Path | str | dict) -> None:
        """Apply a YAML file/directory or one object (dict) the way this backend applies
        the lab's manifests: server-side apply, webhooks wired for the backend."""
        if isinstance(input, dict):
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "object.yaml"
                path.write_text(yaml.safe_dump(input))
                self.backend.apply([path], self.progress)
            return
        if isinstance(input, str | Path):
            self.backend.apply([Path(input)], self.progress)
            return
        raise RuntimeError(f"Input must be of type Path or dict, was {type(input)}")

    def load_image(self, image: str) -> None:
        """kind/k3d: load a local Docker image into the nodes. The local backend needs
        none (its pod runner runs ``gpulab:dev`` from this checkout, kwok simulates other
        images); an existing cluster pulls from its registries."""
        from harness.docker import DockerCluster

        if isinstance(self.backend, DockerCluster):
            self.backend.load_image(image, self.progress)

    # ------------------------------------------------------------ the lab's own

    @property
    def api(self) -> Any:
        """A kubernetes ApiClient for this cluster."""
        if self._api is None:
            from gpulab.kube import api_client

            self._api = api_client(self.kubeconfig)
        return self._api

    @property
    def local(self) -> Any:
        """The LocalCluster (host processes, state directory) behind this cluster."""
        from harness.errors import HarnessError
        from harness.local import LocalCluster

        if not isinstance(self.backend, LocalCluster):
            raise HarnessError(
                f"this test reaches into the local backend, but the cluster runs on "
                f"{self.backend_name}; mark it @pytest.mark.local_backend"
            )
        return self.backend


@contextlib.contextmanager
def lab_cluster(
    options: LabOptions, spec: str | None = None, fresh: bool = True, progress: Progress = print
) -> Iterator[GpulabManager]:
    """A lab cluster for the block: created (fresh by default) and deleted after."""
    manager = GpulabManager(
        provider_config=spec or options.spec,
        kubeconfig=options.kubeconfig,
        backend=options.backend,
        progress=progress,
    )
    try:
        manager.create(fresh=fresh)
        yield manager
    finally:
        manager.delete()


# ---------------------------------------------------------------- pytest hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpulab", "GPU Scheduling Lab clusters")
    group.addoption(
        "--gpulab-spec",
        default=os.environ.get("GPULAB_SPEC", "default"),
        help="lab cluster spec: a name in harness/clusters or a YAML path (default: default)",
    )
    group.addoption(
        "--gpulab-backend",
        default=os.environ.get("GPULAB_BACKEND"),
        choices=("local", "kind", "k3d", "external"),
        help="backend for lab clusters (default: $GPULAB_BACKEND, else local)",
    )
    group.addoption(
        "--gpulab-kubeconfig",
        default=None,
        help="run against an existing cluster (external backend; like --k8s-kubeconfig-override)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "local_backend: needs the local backend's host processes; skipped on other backends",
    )
    config.addinivalue_line(
        "markers", "gpulab(spec=None, addons=(), keep=False): the gpulab_cluster to create"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("local_backend")]
    if not marked:
        return
    options = lab_options(config)
    if options.backend_name == "local":
        return
    target = (
        f"the existing cluster of {options.kubeconfig}"
        if options.kubeconfig
        else f"the {options.backend_name} backend"
    )
    skip = pytest.mark.skip(reason=LOCAL_ONLY_REASON.format(target=target))
    for item in marked:
        item.add_marker(skip)


_kept: dict[str, GpulabManager] = {}


@pytest.fixture
def gpulab_cluster(request: pytest.FixtureRequest) -> Iterator[GpulabManager]:
    """A lab cluster with the API of pytest-kubernetes' ``k8s`` fixture.

    ``@pytest.mark.gpulab(spec=..., addons=[...], keep=True)`` chooses the spec, extra
    chapter addons, and keeps the cluster for later tests (deleted at session end).
    """
    marker = request.node.get_closest_marker("gpulab")
    kwargs = dict(marker.kwargs) if marker else {}
    options = lab_options(request.config)
    spec = kwargs.get("spec") or options.spec
    key = f"{spec}:{options.backend_name}"
    manager = _kept.pop(key, None)
    if manager is None:
        manager = GpulabManager(
            provider_config=spec, kubeconfig=options.kubeconfig, backend=options.backend
        )
        try:
            manager.create(addons=tuple(kwargs.get("addons", ())))
        except BaseException:
            manager.delete()  # what it brought up before failing
            raise
    yield manager
    if kwargs.get("keep"):
        _kept[key] = manager
    else:
        manager.delete()


@pytest.fixture(scope="session", autouse=True)
def _gpulab_kept_clusters() -> Iterator[None]:
    yield
    while _kept:
        _kept.popitem()[1].delete()
