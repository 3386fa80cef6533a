"""The cluster backends and what every one of them offers demos, tests and commands.

    local   real upstream binaries as host processes, kwok nodes, the pod runner (the
            default: fast, no Docker needed)
    kind    Docker containers as nodes: a real kubelet and containerd (GPULAB_BACKEND=kind)
    k3d     the same with k3s
    external  an existing cluster from a kubeconfig: the chapters' manifests applied to it

Demos and tests talk to a :class:`Backend` only, never to one backend's class: bring it
up or down, reach its API server, restart a component (delete its pods; the DaemonSet or
Deployment brings new ones, on every backend), inject GPU faults into a node's NVML shim.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import httpx
from kubernetes import client

from gpulab.kube import api_client
from gpulab.state import cluster_dir
from gpulab.wait import wait_for
from harness.errors import HarnessError
from harness.spec import SPEC_DIR, ClusterSpec

BACKENDS = ("local", "kind", "k3d", "external")
COMPONENT_LABEL = "app.kubernetes.io/name"
SYSTEM_NAMESPACE = "gpulab-system"


class Progress(Protocol):
    def __call__(self, message: str) -> None: ...


class Backend(Protocol):
    spec: ClusterSpec
    kubeconfig: Path
    # a real kubelet runs the workload pods' containers (kind, k3d, external); on the local
    # backend kwok simulates them and only the lab's own pods run (the pod runner)
    runs_containers: bool

    def up(self, progress: Progress) -> None: ...

    def down(self, progress: Progress) -> None: ...

    def running(self) -> bool: ...

    def ensure_addon(self, name: str, progress: Progress) -> None:
        """Deploy a chapter's components (manifests/<name>/) unless they run already."""
        ...

    def apply(self, paths: list[Path], progress: Progress) -> None:
        """Apply manifests the way this backend needs them (harness/apply.py)."""
        ...

    def api(self) -> client.ApiClient: ...

    def processes(self) -> list[Any]:
        """Host processes of the cluster (local backend; empty elsewhere)."""
        ...

    def component_pods(
        self, component: str, node: str | None = None, namespace: str = SYSTEM_NAMESPACE
    ) -> list[Any]:
        """The pods of a component (label app.kubernetes.io/name) in ``namespace``."""
        ...

    def restart(
        self,
        component: str,
        node: str | None = None,
        timeout: float = 90,
        namespace: str = SYSTEM_NAMESPACE,
    ) -> Any:
        """Delete a component's pods (on ``node``) and wait for a Ready replacement."""
        ...

    def service_host(self, cluster_ip: str) -> str | None:
        """Where this host reaches a Service's ClusterIP directly, if it does."""
        ...

    def service_get(self, namespace: str, name: str, port: str, path: str) -> str:
        """GET ``path`` from a Service's named port (directly or through the API server)."""
        ...

    def inject_fault(self, node: str, gpu: int, xid: int) -> None:
        """An Xid on one GPU of ``node``, delivered by its NVML shim as an event."""
        ...

    def allocation(self, namespace: str, pod: str, container: str) -> dict[str, str] | None:
        """The variables the device plugin's Allocate gave a container (None until known):
        read inside the running container where containers run, from the node agent's
        record of the response on kwok nodes."""
        ...

    def exec(self, namespace: str, pod: str, container: str, argv: list[str]) -> str:
        """Run ``argv`` in a running container (`kubectl exec`); its output."""
        ...

    def clear_faults(self, node: str, gpu: int | None = None) -> None:
        """Clear injected faults in the shim (the device plugin sees them once only)."""
        ...


def ready_nodes(api: client.ApiClient) -> set[str]:
    return {
        n.metadata.name
        for n in client.CoreV1Api(api).list_node().items
        if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
    }


def pod_ready(pod: client.V1Pod) -> bool:
    return not pod.metadata.deletion_timestamp and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []
    )


# What Allocate sets in a container's environment (the device plugin's and HAMi's envs)
ALLOCATE_ENV_PREFIXES = ("NVIDIA_", "CUDA_", "FAKE_GPU_")


class ClusterAPI:
    """What every backend does the same way, through the API server."""

    kubeconfig: Path
    runs_containers = True

    def exec(self, namespace: str, pod: str, container: str, argv: list[str]) -> str:
        from kubernetes.stream import stream

        core = client.CoreV1Api(self.api())
        return str(
            stream(
                core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=container,
                command=argv,
                stderr=True,
                stdout=True,
                stdin=False,
                tty=False,
            )
        )

    def allocation(self, namespace: str, pod: str, container: str) -> dict[str, str] | None:
        """The container's environment, as kubelet started it with Allocate's envs."""
        status = client.CoreV1Api(self.api()).read_namespaced_pod(pod, namespace).status
        running = any(
            s.name == container and s.state is not None and s.state.running is not None
            for s in status.container_statuses or []
        )
        if not running:
            return None
        lines = self.exec(namespace, pod, container, ["env"]).splitlines()
        pairs = (line.split("=", 1) for line in lines if "=" in line)
        return {k: v for k, v in pairs if k.startswith(ALLOCATE_ENV_PREFIXES)}

    def api(self) -> client.ApiClient:
        return api_client(self.kubeconfig)

    def component_pods(
        self, component: str, node: str | None = None, namespace: str = SYSTEM_NAMESPACE
    ) -> list[client.V1Pod]:
        fields = f"spec.nodeName={node}" if node else None
        return (
            client.CoreV1Api(self.api())
            .list_namespaced_pod(
                namespace,
                label_selector=f"{COMPONENT_LABEL}={component}",
                field_selector=fields,
            )
            .items
        )

    def service_host(self, cluster_ip: str) -> str | None:
        """Where this host reaches a Service's ClusterIP directly (the local backend serves
        them on its loopback block); None where only the API server's proxy reaches it."""
        return None

    def service_get(self, namespace: str, name: str, port: str, path: str) -> str:
        """GET ``path`` from a Service's named ``port`` (plain HTTP, e.g. /metrics):
        directly where the host reaches Services, else through the API server's proxy."""
        api = self.api()
        svc = client.CoreV1Api(api).read_namespaced_service(name, namespace)
        host = self.service_host(svc.spec.cluster_ip or "")
        if host is not None:
            number = next(p.port for p in svc.spec.ports if p.name == port)
            return httpx.get(f"http://{host}:{number}{path}", timeout=5).text
        proxy = f"/api/v1/namespaces/{namespace}/services/{name}:{port}/proxy{path}"
        response = api.call_api(
            proxy,
            "GET",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
        )
        return response.data.decode()

    def restart(
        self,
        component: str,
        node: str | None = None,
        timeout: float = 90,
        namespace: str = SYSTEM_NAMESPACE,
    ) -> client.V1Pod:
        """As `kubectl delete pod` does for a DaemonSet's or Deployment's pod: the
        controller creates a new one, which runs from the start (re-registers ...)."""
        core = client.CoreV1Api(self.api())
        old = self.component_pods(component, node, namespace)
        where = f" on {node}" if node else ""
        if not old:
            raise HarnessError(f"no {component} pod runs{where} in {namespace}")
        gone = {p.metadata.uid for p in old}
        for pod in old:
            core.delete_namespaced_pod(pod.metadata.name, namespace)

        def replacement() -> client.V1Pod | None:
            return next(
                (
                    p
                    for p in self.component_pods(component, node, namespace)
                    if p.metadata.uid not in gone and pod_ready(p)
                ),
                None,
            )

        return wait_for(replacement, timeout, f"a new Ready {component} pod{where}")


def default_backend() -> str:
    """$GPULAB_BACKEND if set, else local: the fast path for demos and tests. kind (a real
    kubelet and container runtime, in Docker) is chosen by name: GPULAB_BACKEND=kind or
    --backend kind."""
    chosen = os.environ.get("GPULAB_BACKEND")
    if chosen:
        if chosen not in BACKENDS:
            raise HarnessError(f"GPULAB_BACKEND={chosen!r}: use one of {', '.join(BACKENDS)}")
        return chosen
    return "local"


def _recorded(spec: ClusterSpec) -> Path:
    return cluster_dir(spec.name) / "backend"


def backend_for(
    spec: ClusterSpec, explicit: str | None = None, kubeconfig: Path | None = None
) -> tuple[str, Backend]:
    """The backend named (``explicit``, else $GPULAB_BACKEND), else the one this cluster
    was brought up on, else local. ``kubeconfig`` is the existing cluster's, for the
    external backend. Naming another backend than the one the cluster runs on is an error:
    one name, one cluster, so a demo never runs on a backend it was not asked for."""
    named = explicit or (default_backend() if os.environ.get("GPULAB_BACKEND") else None)
    recorded = _recorded(spec).read_text().strip() if _recorded(spec).exists() else None
    if named and recorded and named != recorded:
        if get_backend(recorded, spec, kubeconfig).running():
            raise HarnessError(
                f"cluster {spec.name!r} runs on the {recorded} backend, not {named}: "
                f"`gpulab down --spec {_spec_arg(spec)}` it first, or ask for {recorded}"
            )
        forget(spec)
    name = named or recorded or default_backend()
    return name, get_backend(name, spec, kubeconfig)


def _spec_arg(spec: ClusterSpec) -> str:
    """What --spec takes for this spec: a shipped one's file name, else its path."""
    if spec.path is None:
        return spec.name
    shipped = SPEC_DIR / spec.path.name
    return spec.path.stem if spec.path.resolve() == shipped.resolve() else str(spec.path)


def ensure_up(
    spec: ClusterSpec, explicit: str | None, progress: Progress, kubeconfig: Path | None = None
) -> Backend:
    """The cluster, brought up on its backend unless it already runs."""
    name, backend = backend_for(spec, explicit, kubeconfig)
    if not backend.running():
        progress(f"bringing up cluster {spec.name!r} on the {name} backend")
        # recorded first: `gpulab down` finds what a failed `up` left (kind's containers)
        _recorded(spec).parent.mkdir(parents=True, exist_ok=True)
        _recorded(spec).write_text(name)
        backend.up(progress)
    return backend


def forget(spec: ClusterSpec) -> None:
    _recorded(spec).unlink(missing_ok=True)


def get_backend(name: str, spec: ClusterSpec, kubeconfig: Path | None = None) -> Backend:
    if name == "local":
        from harness.local import LocalCluster

        return LocalCluster(spec)
    if name in ("kind", "k3d"):
        from harness.docker import DockerCluster

        return DockerCluster(name, spec)
    if name == "external":
        from harness.external import ExternalCluster, kubeconfig_for

        return ExternalCluster(spec, kubeconfig_for(spec, kubeconfig))
    raise HarnessError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
