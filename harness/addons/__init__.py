"""Components the local backend starts with a cluster: a spec's ``addons`` list.

On kind the same components run as the workloads in ``manifests/``; on the local
backend each addon starts them as host processes of the cluster (so `gpulab down` stops
them), then applies its ``manifests/<addon>/`` with the local transform, so the real API
server still validates every object and webhooks point at the host process.

Each addon module exposes ``start(cluster: LocalCluster, progress) -> None``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.local import LocalCluster

# addon name -> module in this package (started in this order)
ADDONS = {
    "device-plugin": "harness.addons.device_plugin",
    "hami": "harness.addons.hami",
    "kueue": "harness.addons.kueue",
    "scheduling": "harness.addons.scheduling",
    "volcano": "harness.addons.volcano",
}


def start(name: str, cluster: LocalCluster, progress: Callable[[str], None]) -> None:
    importlib.import_module(ADDONS[name]).start(cluster, progress)
