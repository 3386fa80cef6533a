"""Addon ``kueue``: the Kueue counterpart (``gpulab kueue-controller``, mirroring
kubernetes-sigs/kueue v0.19.2) with its webhooks and metrics.

On kind this is the Deployment in ``manifests/kueue/`` behind Service
``kueue-webhook-service``. Here the controller is a host process serving the webhooks
over HTTPS with a certificate from the cluster CA (the local transform points every
webhook of the manifests at it) and its Prometheus metrics over HTTP on a port of its
own; its Configuration is the one in ``manifests/kueue/configmap.yaml``. The controller
must answer before the CRDs are applied: the API server calls ``/convert`` for every
v1beta1 request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.apply import MANIFESTS, apply, load_documents
from harness.errors import HarnessError
from harness.local import GPULAB, ProcessRecord, pid_alive
from harness.ports import free_port

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
NAME = "kueue-controller"
SERVICE = "kueue-webhook-service"  # the Service the webhooks name in manifests/kueue
CERT_STEM = "kueue-webhook"
# load_documents leaves samples/ out: those are for the reader to apply
MANIFEST_DIR = MANIFESTS / "kueue"
CONFIG_KEY = "controller_manager_config.yaml"


def write_config(cluster: LocalCluster) -> Path:
    """The Configuration of the kueue-manager-config ConfigMap, as a file for --config."""
    [configmap] = [
        d
        for d in load_documents([MANIFEST_DIR / "configmap.yaml"])
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kueue-manager-config"
    ]
    path = cluster.dir / "kueue-config.yaml"
    path.write_text(configmap["data"][CONFIG_KEY])
    return path


def start(cluster: LocalCluster, progress: Progress) -> None:
    cluster.issue_serving_cert(CERT_STEM, SERVICE)
    webhook_port, metrics_port = free_port(), free_port()
    start_controller(cluster, webhook_port, metrics_port)
    apply(cluster.api(), [MANIFEST_DIR], progress, cluster.apply_transform(dry_run_workloads=True))
    progress(
        f"kueue: controller on 127.0.0.1:{webhook_port} (webhooks), "
        f"127.0.0.1:{metrics_port} (metrics); CRDs and webhooks registered"
    )


def start_controller(cluster: LocalCluster, webhook_port: int, metrics_port: int) -> ProcessRecord:
    """Start the controller; return once /readyz answers (a controller that dies fails
    here with one line naming its log)."""
    record = cluster.start_process(
        NAME,
        [
            *GPULAB,
            "kueue-controller",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--config",
            str(write_config(cluster)),
            "--webhook-bind",
            f"127.0.0.1:{webhook_port}",
            "--metrics-bind",
            f"127.0.0.1:{metrics_port}",
            "--cert-file",
            str(cluster.pki / f"{CERT_STEM}.crt"),
            "--key-file",
            str(cluster.pki / f"{CERT_STEM}.key"),
        ],
        ports=[webhook_port, metrics_port],
        service=SERVICE,
    )
    cluster.wait_http(f"https://127.0.0.1:{webhook_port}/readyz", NAME)
    return record


def restart(cluster: LocalCluster) -> ProcessRecord:
    """Start the controller again on its ports after it was stopped or killed (the
    webhook configurations keep pointing there)."""
    record = controller(cluster)
    if pid_alive(record.pid, record.exe):
        raise HarnessError(f"{NAME} still runs (pid {record.pid}); stop it first")
    return start_controller(cluster, *record.ports[:2])


def controller(cluster: LocalCluster) -> ProcessRecord:
    """The controller's process record."""
    for record in cluster.processes():
        if record.name == NAME:
            return record
    raise HarnessError(f"cluster {cluster.spec.name} runs no {NAME} (addon kueue not started)")


def metrics_url(cluster: LocalCluster) -> str:
    return f"http://127.0.0.1:{controller(cluster).ports[1]}/metrics"
