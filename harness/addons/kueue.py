"""Addon ``kueue``: the Kueue counterpart (``gpulab kueue-controller``) with its webhooks.

On kind this is the Deployment in ``manifests/kueue/`` behind Service
``kueue-webhook-service``. Here the controller is a host process serving the Job
mutating webhook and the CRD conversion webhook over HTTPS with a certificate from the
cluster CA; the local transform points both (Service form in the manifests) at it. The
controller must answer before the CRDs are applied: the API server calls ``/convert``
for every v1beta1 request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.apply import MANIFESTS, apply
from harness.errors import HarnessError
from harness.local import GPULAB, ProcessRecord, pid_alive
from harness.ports import free_port

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
NAME = "kueue-controller"
SERVICE = "kueue-webhook-service"  # the Service both webhooks name in manifests/kueue
CERT_STEM = "kueue-webhook"
# load_documents leaves samples/ out: those are for the reader to apply
MANIFEST_DIR = MANIFESTS / "kueue"


def start(cluster: LocalCluster, progress: Progress) -> None:
    cluster.issue_serving_cert(CERT_STEM, SERVICE)
    port = free_port()
    start_controller(cluster, port)
    apply(cluster.api(), [MANIFEST_DIR], progress, cluster.apply_transform(dry_run_workloads=True))
    progress(f"kueue: controller on 127.0.0.1:{port}, CRDs and Job webhook registered")


def start_controller(cluster: LocalCluster, port: int) -> ProcessRecord:
    """Start the controller serving the webhooks on ``port``; return once /readyz answers
    (a controller that dies fails here with one line naming its log)."""
    record = cluster.start_process(
        NAME,
        [
            *GPULAB,
            "kueue-controller",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--webhook-bind",
            f"127.0.0.1:{port}",
            "--cert-file",
            str(cluster.pki / f"{CERT_STEM}.crt"),
            "--key-file",
            str(cluster.pki / f"{CERT_STEM}.key"),
        ],
        ports=[port],
        service=SERVICE,
    )
    cluster.wait_http(f"https://127.0.0.1:{port}/readyz", NAME)
    return record


def restart(cluster: LocalCluster) -> ProcessRecord:
    """Start the controller again on its port after it was stopped or killed (the
    webhook configurations keep pointing there)."""
    record = controller(cluster)
    if pid_alive(record.pid, record.exe):
        raise HarnessError(f"{NAME} still runs (pid {record.pid}); stop it first")
    return start_controller(cluster, record.ports[0])


def controller(cluster: LocalCluster) -> ProcessRecord:
    """The controller's process record."""
    for record in cluster.processes():
        if record.name == NAME:
            return record
    raise HarnessError(f"cluster {cluster.spec.name} runs no {NAME} (addon kueue not started)")
