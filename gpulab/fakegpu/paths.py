"""Where the NVML shim and each simulated node's fake-gpu state live.

Every simulated node owns one directory, ``<state root>/<node>/``, holding ``config``
(the rendered profile the shim reads, see :mod:`gpulab.fakegpu.render`), ``mig-minors``
(the driver's ``/proc/driver/nvidia-caps/mig-minors``, read by the device plugin) and
``faults.log`` (injected faults, see :mod:`gpulab.fakegpu.faults`). Several nodes on one
machine therefore never share fault state.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpulab.fakegpu.profiles import ProfileError
from gpulab.state import DEFAULT_CLUSTER, cluster_dir

SHIM_DIR = Path(__file__).resolve().parents[2] / "fake-gpu"
SHIM_BUILD_DIR = SHIM_DIR / "build"
SHIM_LIB = SHIM_BUILD_DIR / "libnvidia-ml.so.1"

ENV_STATE_ROOT = "GPULAB_FAKE_GPU_STATE"  # overrides DEFAULT_STATE_ROOT for the CLI
# The default cluster's: `gpulab fake-gpu inject --node gpu-a100 ...` reaches the GPUs of
# the cluster `gpulab up` started, with no flags. Other clusters pass --state-dir.
DEFAULT_STATE_ROOT = cluster_dir(DEFAULT_CLUSTER) / "fake-gpu"
CONFIG_NAME = "config"
FAULT_LOG_NAME = "faults.log"
MIG_MINORS_NAME = "mig-minors"  # the node's /proc/driver/nvidia-caps/mig-minors

# A Kubernetes node name (DNS-1123 subdomain): also safe as a directory name.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def state_root(explicit: str | Path | None = None) -> Path:
    """The directory holding one subdirectory per simulated node."""
    if explicit is not None:
        return Path(explicit).resolve()
    return Path(os.environ.get(ENV_STATE_ROOT, DEFAULT_STATE_ROOT)).resolve()


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
