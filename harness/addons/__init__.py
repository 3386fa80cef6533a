"""A chapter's components on a cluster: a spec's ``addons`` list, or what a demo needs.

An addon deploys ``manifests/<addon>/`` through the backend (every backend runs the same
manifests: the local backend's pod runner runs the lab's own pods) and then waits until
the chapter works (e.g. nodes advertise their GPUs); what is left here is what differs
from a plain apply. Each addon module exposes ``deploy(backend, progress)`` (apply) and
``wait(backend, progress)`` (until it works).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# addon name -> module in this package (started in this order)
ADDONS = {
    "device-plugin": "harness.addons.device_plugin",
    "hami": "harness.addons.hami",
    "kueue": "harness.addons.kueue",
    "scheduling": "harness.addons.scheduling",
    "volcano": "harness.addons.volcano",
    "gpu-operator": "harness.addons.gpu_operator",
}
# addons that deploy a device plugin: their nodes start without GPU capacity (kubelet
# learns it from the plugin's ListAndWatch)
DEVICE_PLUGINS = {"device-plugin", "hami", "gpu-operator"}


def for_real_kubelets(names: list[str], gpu_nodes: bool) -> list[str]:
    """The addons a cluster of real kubelets (kind, k3d) needs for ``names``: a real kubelet
    advertises GPUs only through a device plugin, so a spec with GPU nodes and none of the
    DEVICE_PLUGINS (the local backend writes their GPUs into the kwok Node instead) gets
    NVIDIA's, first, as a GPU cluster has it before any scheduler is installed."""
    if gpu_nodes and not DEVICE_PLUGINS & set(names):
        return ["device-plugin", *names]
    return list(names)


# addons whose webhooks admit other chapters' pods with failurePolicy Fail (Kueue's pod
# webhook): deployed once the others run, else their pods are refused while it starts
AFTER_OTHERS = {"kueue"}


def start(name: str, backend: Any, progress: Callable[[str], None]) -> None:
    start_all([name], backend, progress)


def start_all(names: list[str], backend: Any, progress: Callable[[str], None]) -> None:
    """Start several addons: deploy them all, then wait for each, so that their components
    start side by side (AFTER_OTHERS in a second round, once the others run)."""
    for group in (
        [n for n in names if n not in AFTER_OTHERS],
        [n for n in names if n in AFTER_OTHERS],
    ):
        modules = [importlib.import_module(ADDONS[n]) for n in group]
        for module in modules:
            module.deploy(backend, progress)
        for module in modules:
            module.wait(backend, progress)


def wait_deployment(
    backend: Any, namespace: str, name: str, timeout: float, progress: Callable[[str], None]
) -> None:
    """Until Deployment ``name`` has an available replica; one line naming what to look at
    when it does not come."""
    from kubernetes import client

    from gpulab.wait import WaitTimeout, wait_for
    from harness.errors import HarnessError

    apps = client.AppsV1Api(backend.api())

    def available() -> bool:
        status = apps.read_namespaced_deployment(name, namespace).status
        return (status.available_replicas or 0) >= 1

    progress(f"waiting for the {name} Deployment in {namespace}")
    try:
        wait_for(available, timeout, f"the {name} Deployment", 0.5)
    except WaitTimeout:
        raise HarnessError(
            f"the {name} Deployment is not available after {timeout:g}s; see "
            f"`gpulab kubectl -n {namespace} describe pods` and `... logs deploy/{name}`"
        ) from None
