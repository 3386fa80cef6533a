"""A chapter's components on a cluster: a spec's ``addons`` list, or what a demo needs.

An addon deploys ``manifests/<addon>/`` through the backend (every backend runs the same
manifests: the local backend's pod runner runs the lab's own pods) and then waits until
the chapter works (e.g. nodes advertise their GPUs); what is left here is what differs
from a plain apply. Each addon module exposes ``start(backend, progress) -> None``.
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


def start(name: str, backend: Any, progress: Callable[[str], None]) -> None:
    importlib.import_module(ADDONS[name]).start(backend, progress)
