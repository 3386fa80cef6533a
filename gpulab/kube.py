"""Loading a Kubernetes API client from a kubeconfig (the one place that does it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.incluster_config import InClusterConfigLoader

from gpulab.errors import UserError


class KubeconfigError(UserError, RuntimeError):
    pass


def default_kubeconfig() -> Path | None:
    """$KUBECONFIG, else the running local-backend cluster's kubeconfig, else ~/.kube/config."""
    if os.environ.get("KUBECONFIG"):
        return Path(os.environ["KUBECONFIG"].split(os.pathsep)[0])
    from gpulab.state import default_cluster_kubeconfig

    local = default_cluster_kubeconfig()
    if local is not None and local.exists():
        return local
    home = Path.home() / ".kube" / "config"
    return home if home.exists() else None


SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Set by the local backend's pod runner, which runs pods as host processes: where each of
# the container's mount paths is on the host (harness/podrunner/container.py).
MOUNTS_ENV = "GPULAB_MOUNTS"


def mounted(path: str) -> str:
    """Where an in-container ``path`` is: itself in a real container, the host directory
    behind its mount when the local backend's pod runner runs the pod."""
    try:
        mounts: dict[str, str] = json.loads(os.environ.get(MOUNTS_ENV) or "{}")
    except ValueError:
        return path
    for mount in sorted(mounts, key=len, reverse=True):
        root = mount.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return mounts[mount] + path[len(root) :]
    return path


def in_pod() -> bool:
    """Running as a pod (kind/k3d) with no kubeconfig given: use the ServiceAccount."""
    return "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ


# Requests in flight at once that keep their connection. client-go multiplexes any number
# of requests over one HTTP/2 connection; urllib3 needs a connection per request in flight,
# and past its pool size (the client's default: 5 per CPU, 10 here) it opens a new TLS
# connection for each further request and closes it afterwards: a handshake per request
# once a component's watches, Event writer and concurrent handlers (an extender's parallel
# Binds) fill the pool.
CONNECTIONS = 64


def own_pod() -> tuple[str, str] | None:
    """(namespace, name) of the pod this process runs in, from the downward API's
    POD_NAMESPACE and POD_NAME; None outside a pod or where the manifest sets neither."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    return (namespace, name) if name and namespace else None


def api_client(
    kubeconfig: str | Path | None = None, connections: int = CONNECTIONS
) -> client.ApiClient:
    """A client from ``kubeconfig``; without one, the pod's ServiceAccount when in a pod,
    else $KUBECONFIG, the local cluster's kubeconfig or ~/.kube/config. It keeps up to
    ``connections`` connections open for reuse."""
    cfg = client.Configuration()
    if kubeconfig is None and in_pod():
        InClusterConfigLoader(
            token_filename=mounted(f"{SERVICEACCOUNT_DIR}/token"),
            cert_filename=mounted(f"{SERVICEACCOUNT_DIR}/ca.crt"),
        ).load_and_set(client_configuration=cfg)
    else:
        path = Path(kubeconfig) if kubeconfig else default_kubeconfig()
        if path is None or not path.exists():
            raise KubeconfigError(
                f"no kubeconfig at {path or '$KUBECONFIG / ~/.kube/config'}; "
                "run `gpulab up` first or pass --kubeconfig"
            )
        config.load_kube_config(config_file=str(path), client_configuration=cfg)
    cfg.connection_pool_maxsize = connections
    return client.ApiClient(cfg)


def drain(resp: Any) -> None:
    """Read an answer we do not use to its end and give its connection back to the pool.
    Left unread (``_preload_content=False``), the response keeps its connection until it
    is garbage, and the next call opens a new TLS connection: a handshake per call."""
    resp.read()
    resp.release_conn()
