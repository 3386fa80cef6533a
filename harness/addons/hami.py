"""Addon ``hami``: the HAMi scheduler as HAMi deploys it — a second kube-scheduler named
``hami-scheduler`` whose extender (``gpulab extender``) filters and binds vGPU pods, and
the extender's mutating webhook that sends GPU pods to it.

On kind this is the Deployment in ``manifests/hami/`` (stock kube-scheduler image + the
extender container in one pod). Here both are host processes: the upstream kube-scheduler
binary with the ConfigMap's KubeSchedulerConfiguration (urlPrefix pointed at the host
process, the cluster CA instead of ``insecure``), and the extender serving HTTPS with a
certificate from the cluster CA. Needs the ``device-plugin`` addon with ``hami: true`` on
the GPU nodes (their devices registry comes from the plugins' node annotations).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yaml

from harness import binaries
from harness.addons import device_plugin
from harness.apply import MANIFESTS, apply, load_documents
from harness.local import GPULAB
from harness.ports import free_port

if TYPE_CHECKING:
    from harness.local import LocalCluster

Progress = Callable[[str], None]
SERVICE = "hami-scheduler"  # the Service the webhook names in manifests/hami
SCHEDULER_NAME = "hami-scheduler"
EXTENDER = "hami-extender"  # its ProcessRecord: ports [routes, metrics]


def start(cluster: LocalCluster, progress: Progress) -> None:
    port, metrics_port, scheduler_port = free_port(), free_port(), free_port()
    start_extender(cluster, port, metrics_port)
    cluster.wait_http(f"https://127.0.0.1:{port}/readyz", "hami extender")
    config = cluster.dir / "hami-scheduler-config.yaml"
    config.write_text(yaml.safe_dump(scheduler_config(cluster, port), sort_keys=False))
    cluster.start_process(
        SCHEDULER_NAME,
        [
            str(binaries.binary("kube-scheduler")),
            f"--config={config}",
            f"--authentication-kubeconfig={cluster.dir / 'scheduler.kubeconfig'}",
            f"--authorization-kubeconfig={cluster.dir / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={scheduler_port}",
        ],
        ports=[scheduler_port],
    )
    cluster.wait_http(f"https://127.0.0.1:{scheduler_port}/healthz", SCHEDULER_NAME, verify=False)
    apply(
        cluster.api(),
        [MANIFESTS / "hami"],
        progress,
        cluster.apply_transform(dry_run_workloads=True),
    )
    # HAMi's device plugin runs as pods already (the extender and its scheduler not yet)
    cluster.apply([MANIFESTS / "hami" / "device-plugin.yaml"], progress)
    hami_nodes = [n for n in cluster.spec.nodes if n.profile and n.device_plugin.hami]
    device_plugin.wait_advertised(cluster, hami_nodes, progress, "hami-device-plugin")
    progress(
        f"hami: extender on 127.0.0.1:{port} (metrics :{metrics_port}), kube-scheduler "
        f"{SCHEDULER_NAME!r} on :{scheduler_port}, webhook registered"
    )


def start_extender(cluster: LocalCluster, port: int, metrics_port: int) -> None:
    """Start (or restart, after a kill) the extender process on fixed ports, serving a
    certificate from the cluster CA (the webhook's caBundle and the scheduler trust it)."""
    cert = cluster.issue_serving_cert("hami-scheduler", SERVICE)
    cluster.start_process(
        EXTENDER,
        [
            *GPULAB,
            "extender",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--http-bind",
            f"127.0.0.1:{port}",
            "--metrics-bind",
            f"127.0.0.1:{metrics_port}",
            "--cert-file",
            str(cert.cert),
            "--key-file",
            str(cert.key),
        ],
        ports=[port, metrics_port],
        service=SERVICE,
    )


def scheduler_config(cluster: LocalCluster, extender_port: int) -> dict[str, Any]:
    """manifests/hami's KubeSchedulerConfiguration, adapted to host processes."""
    configmap = next(
        d
        for d in load_documents([MANIFESTS / "hami" / "scheduler-config.yaml"])
        if d["kind"] == "ConfigMap"
    )
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    config["clientConnection"] = {"kubeconfig": str(cluster.dir / "scheduler.kubeconfig")}
    for extender in config["extenders"]:
        extender["urlPrefix"] = f"https://127.0.0.1:{extender_port}"
        # the extender's certificate comes from the cluster CA: verify it instead of insecure
        extender["tlsConfig"] = {"caFile": str(cluster.pki / "ca.crt")}
    return config
