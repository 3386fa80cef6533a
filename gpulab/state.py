"""Where the lab keeps things on the host.

- cache (survives across clusters and CI runs): ``$XDG_CACHE_HOME/gpulab`` (built binaries)
- state (one directory per cluster: certificates, kubeconfig, etcd data, logs, pids):
  ``$XDG_STATE_HOME/gpulab/<cluster>``; on the local backend each simulated node's
  filesystem is ``<cluster>/nodes/<node>/rootfs`` (what its hostPath volumes see)
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CLUSTER = "gpulab"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpulab"


def state_root() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpulab"


def cluster_dir(name: str) -> Path:
    return state_root() / name


def node_root(cluster: Path, node: str) -> Path:
    """A local-backend node's filesystem root (harness/podrunner/volumes.py)."""
    return cluster / "nodes" / node / "rootfs"


def default_cluster_kubeconfig() -> Path | None:
    path = cluster_dir(DEFAULT_CLUSTER) / "kubeconfig"
    return path if path.exists() else None
