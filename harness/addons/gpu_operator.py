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

from kubernetes import client

from gpulab.wait import WaitTimeout, wait_for
from harness.apply import MANIFESTS
from harness.backends import Backend
from harness.errors import HarnessError

Progress = Callable[[str], None]
NAMESPACE = "gpu-operator"
DEPLOYMENT = "gpu-operator"
READY_TIMEOUT = 90.0


def start(backend: Backend, progress: Progress) -> None:
    """Apply the operator's manifests and wait until its Deployment is available."""
    if "device-plugin" in backend.spec.addons:
        raise HarnessError(
            f"cluster spec {backend.spec.name}: the gpu-operator addon deploys the device "
            "plugin itself; remove `device-plugin` from its addons"
        )
    backend.apply([MANIFESTS / "gpu-operator"], progress)
    apps = client.AppsV1Api(backend.api())

    def available() -> bool:
        status = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).status
        return (status.available_replicas or 0) >= 1

    progress(f"waiting for the {DEPLOYMENT} Deployment in {NAMESPACE}")
    try:
        wait_for(available, READY_TIMEOUT, f"the {DEPLOYMENT} Deployment", 0.5)
    except WaitTimeout:
        raise HarnessError(
            f"the {DEPLOYMENT} Deployment is not available after {READY_TIMEOUT:g}s; see "
            f"`gpulab kubectl -n {NAMESPACE} describe pods` and `... logs deploy/{DEPLOYMENT}`"
        ) from None
    progress("GPU Operator running: create a ClusterPolicy to deploy its operands")
