"""Loading a Kubernetes API client from a kubeconfig (the one place that does it)."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

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


def in_pod() -> bool:
    """Running as a pod (kind/k3d) with no kubeconfig given: use the ServiceAccount."""
    return "KUBERNETES_SERVICE_HOST" in os.environ and "KUBECONFIG" not in os.environ


def api_client(kubeconfig: str | Path | None = None) -> client.ApiClient:
    """A client from ``kubeconfig``; without one, the pod's ServiceAccount when in a pod,
    else $KUBECONFIG, the local cluster's kubeconfig or ~/.kube/config."""
    if kubeconfig is None and in_pod():
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    path = Path(kubeconfig) if kubeconfig else default_kubeconfig()
    if path is None or not path.exists():
        raise KubeconfigError(
            f"no kubeconfig at {path or '$KUBECONFIG / ~/.kube/config'}; "
            "run `gpulab up` first or pass --kubeconfig"
        )
    return config.new_client_from_config(config_file=str(path))
