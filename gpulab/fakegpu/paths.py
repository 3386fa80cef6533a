"""Where the NVML shim and each simulated node's fake-gpu state live.

Every simulated node owns one directory, ``<state root>/<node>/``, holding ``config``
(the rendered profile the shim reads, see :mod:`gpulab.fakegpu.render`), ``mig-minors``
(the driver's ``/proc/driver/nvidia-caps/mig-minors``, read by the device plugin),
``faults.log`` (injected faults, see :mod:`gpulab.fakegpu.faults`) and ``mig-state`` (MIG
mode and instances changed through NVML, written by the shim; fake-gpu/README.md).
Several nodes on one machine therefore never share fault or MIG state.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpulab.fakegpu.profiles import ProfileError
from gpulab.state import DEFAULT_CLUSTER, cluster_dir, node_root

SHIM_DIR = Path(__file__).resolve().parents[2] / "fake-gpu"
SHIM_BUILD_DIR = SHIM_DIR / "build"
SHIM_LIB = SHIM_BUILD_DIR / "libnvidia-ml.so.1"

ENV_STATE_ROOT = "GPULAB_FAKE_GPU_STATE"  # overrides the default state root for the CLI
# Where the device plugin's DaemonSet keeps the shim's state on a node (its hostPath).
NODE_STATE_DIR = "/var/lib/fake-gpu"
CONFIG_NAME = "config"
FAULT_LOG_NAME = "faults.log"
MIG_MINORS_NAME = "mig-minors"  # the node's /proc/driver/nvidia-caps/mig-minors
MIG_STATE_NAME = "mig-state"  # MIG changes made through the shim (nvmlDeviceSetMigMode ...)

# A Kubernetes node name (DNS-1123 subdomain): also safe as a directory name.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def state_root(explicit: str | Path | None, node: str) -> Path:
    """The directory holding the node's subdirectory: ``explicit``, else
    $GPULAB_FAKE_GPU_STATE, else where the default cluster's device plugin keeps it on the
    node (so `gpulab fake-gpu inject --node gpu-a100 ...` reaches the GPUs of the cluster
    `gpulab up` started, with no flags; other clusters pass --state-dir)."""
    if explicit is not None:
        return Path(explicit).resolve()
    if os.environ.get(ENV_STATE_ROOT):
        return Path(os.environ[ENV_STATE_ROOT]).resolve()
    return node_root(cluster_dir(DEFAULT_CLUSTER), node) / NODE_STATE_DIR.lstrip("/")


def node_dir(root: str | Path, node: str) -> Path:
    if not _NODE_NAME.match(node):
        raise ProfileError(f"node name {node!r} is not a valid Kubernetes node name")
    return Path(root).resolve() / node


def config_path(root: str | Path, node: str) -> Path:
    return node_dir(root, node) / CONFIG_NAME


def existing_config(root: str | Path, node: str) -> Path:
    """The node's rendered config, or a ProfileError telling how to create it."""
    path = config_path(root, node)
    if not path.is_file():
        raise ProfileError(
            f"node {node!r} has no fake-gpu config at {path}; create it with "
            f"`gpulab fake-gpu render --profile PROFILE --node {node}`"
        )
    return path
