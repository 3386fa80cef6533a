"""Addon ``scheduling``: the scheduling-framework chapter's components as host processes:
gpulab-scheduler (gpulab/framework + gpulab/schedulerplugins) and the PodGroup
controller.

On kind these are the Deployments in ``manifests/scheduling/``. Here gpulab-scheduler
reads the ConfigMap's KubeSchedulerConfiguration (``clientConnection.kubeconfig``
pointed at the cluster) and serves /healthz on a free loopback port. The CRDs
(PodGroup, NodeResourceTopology) are applied first, so the informers find them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yaml

from harness.addons.device_plugin import GPULAB
from harness.apply import MANIFESTS, apply, load_documents
from harness.errors import HarnessError
from harness.local import ProcessRecord, pid_alive
from harness.ports import free_port

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
SCHEDULER = "gpulab-scheduler"
CONTROLLER = "podgroup-controller"
MANIFEST_DIR = MANIFESTS / "scheduling"


def start(cluster: LocalCluster, progress: Progress) -> None:
    apply(cluster.api(), [MANIFEST_DIR], progress, cluster.apply_transform())
    port = free_port()
    start_scheduler(cluster, port)
    cluster.start_process(
        CONTROLLER, [*GPULAB, "podgroup-controller", "--kubeconfig", str(cluster.kubeconfig)]
    )
    progress(f"scheduling: {SCHEDULER} (healthz on 127.0.0.1:{port}) and {CONTROLLER} running")


def scheduler_config(cluster: LocalCluster) -> dict[str, Any]:
    """manifests/scheduling's KubeSchedulerConfiguration, pointed at this cluster."""
    configmap = next(
        d
        for d in load_documents([MANIFEST_DIR / "scheduler-config.yaml"])
        if d["kind"] == "ConfigMap"
    )
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    config["clientConnection"] = {"kubeconfig": str(cluster.kubeconfig)}
    return config


def start_scheduler(cluster: LocalCluster, port: int) -> ProcessRecord:
    """Start gpulab-scheduler; return once /healthz answers (its informers synced)."""
    path = cluster.dir / f"{SCHEDULER}-config.yaml"
    path.write_text(yaml.safe_dump(scheduler_config(cluster), sort_keys=False))
    record = cluster.start_process(
        SCHEDULER,
        [*GPULAB, "scheduler", "--config", str(path), "--healthz-bind", f"127.0.0.1:{port}"],
        ports=[port],
    )
    cluster.wait_http(f"http://127.0.0.1:{port}/healthz", SCHEDULER, tls=False)
    return record


def restart_scheduler(cluster: LocalCluster) -> ProcessRecord:
    """Start gpulab-scheduler again on its port after it was stopped or killed."""
    record = process(cluster, SCHEDULER)
    if pid_alive(record.pid, record.exe):
        raise HarnessError(f"{SCHEDULER} still runs (pid {record.pid}); stop it first")
    return start_scheduler(cluster, record.ports[0])


def process(cluster: LocalCluster, name: str) -> ProcessRecord:
    for record in cluster.processes():
        if record.name == name:
            return record
    raise HarnessError(f"cluster {cluster.spec.name} runs no {name} (addon scheduling not started)")
