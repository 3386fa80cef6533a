"""Addon ``gpu-operator``: the lab's NVIDIA gpu-operator v26.7.0 (``manifests/gpu-operator/``:
the ClusterPolicy CRD, the operator's namespace, RBAC and Deployment), on every backend.

It deploys the operator only: the operands (driver, toolkit, validator, device plugin,
GFD, dcgm-exporter, MIG manager) come when a ClusterPolicy is created, rendered by the
operator from ``manifests/gpu-operator/assets/`` (which ``apply`` leaves out, as it does
``samples/``). A spec with this addon must not also list ``device-plugin``: the
operator's device-plugin DaemonSet is the one that advertises the GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.addons import wait_deployment
from harness.apply import MANIFESTS
from harness.backends import Backend
from harness.errors import HarnessError

Progress = Callable[[str], None]
NAMESPACE = "gpu-operator"
DEPLOYMENT = "gpu-operator"
READY_TIMEOUT = 90.0


def deploy(backend: Backend, progress: Progress) -> None:
    """Apply the operator's manifests."""
    if "device-plugin" in backend.spec.addons:
        raise HarnessError(
            f"cluster spec {backend.spec.name}: the gpu-operator addon deploys the device "
            "plugin itself; remove `device-plugin` from its addons"
        )
    backend.apply([MANIFESTS / "gpu-operator"], progress)


def wait(backend: Backend, progress: Progress) -> None:
    """Until the operator's Deployment is available."""
    wait_deployment(backend, NAMESPACE, DEPLOYMENT, READY_TIMEOUT, progress)
    progress("GPU Operator running: create a ClusterPolicy to deploy its operands")
