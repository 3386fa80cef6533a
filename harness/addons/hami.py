"""Addon ``hami``: the HAMi chapter as HAMi's chart deploys it, on every backend.

Applies ``manifests/hami/``: the HAMi device plugin DaemonSet (nodes labelled ``gpu=on``),
the ``hami-scheduler`` Deployment (the stock kube-scheduler with the ``hami-scheduler``
profile and the extender container ``gpulab extender`` in one pod), its Service, RBAC,
ConfigMaps and the mutating webhook. On the local backend the pod runner runs both
containers (kube-scheduler through the adapter in harness/pod-images.yaml; the extender's
``urlPrefix`` https://127.0.0.1:9443 becomes the pod's own address by the runner's
loopback rule) and the webhook calls the Service's address with the
``hami-scheduler-tls`` certificate the apply step creates. Returns once the nodes
advertise their vGPU shares, the scheduler pod is Ready and the extender has registered
every GPU.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client

from gpulab.fakegpu import profiles
from gpulab.wait import WaitTimeout, wait_for
from harness.addons import device_plugin
from harness.apply import MANIFESTS
from harness.backends import SYSTEM_NAMESPACE, Backend
from harness.errors import HarnessError

Progress = Callable[[str], None]
COMPONENT = "hami-scheduler"  # the Deployment, its pods' app.kubernetes.io/name, the Service
WEBHOOK = "gpulab-hami-webhook"
DEVICE_PLUGIN = "hami-device-plugin"
READY_TIMEOUT = 120.0
METRIC_PER_GPU = "hami_gpu_core_limit_ratio"


def deploy(backend: Backend, progress: Progress) -> None:
    backend.apply([MANIFESTS / "hami"], progress)


def wait(backend: Backend, progress: Progress) -> None:
    nodes = [n for n in backend.spec.nodes if n.profile and n.device_plugin.hami]
    device_plugin.wait_advertised(backend, nodes, progress, DEVICE_PLUGIN)
    wait_ready(backend, progress)
    wait_registered(backend, sum(len(profiles.load(n.profile).gpus) for n in nodes), progress)


def wait_ready(backend: Backend, progress: Progress) -> None:
    """Until the hami-scheduler pod (kube-scheduler + extender) is Ready."""
    apps = client.AppsV1Api(backend.api())

    def ready() -> bool:
        status = apps.read_namespaced_deployment(COMPONENT, SYSTEM_NAMESPACE).status
        return bool(status.ready_replicas) and not status.unavailable_replicas

    try:
        wait_for(ready, READY_TIMEOUT, f"the {COMPONENT} Deployment to be Ready", 0.25)
    except WaitTimeout:
        raise HarnessError(
            f"Deployment {SYSTEM_NAMESPACE}/{COMPONENT} not Ready after {READY_TIMEOUT:g}s; "
            f"see `gpulab kubectl -n {SYSTEM_NAMESPACE} describe pods -l "
            f"app.kubernetes.io/name={COMPONENT}` and its logs (--all-containers)"
        ) from None
    progress(f"hami: {COMPONENT} pod Ready (kube-scheduler + extender), webhook registered")


def wait_registered(backend: Backend, gpus: int, progress: Progress) -> None:
    """Until the extender's books hold ``gpus`` cards (one ``hami_gpu_core_limit_ratio``
    series each). As upstream, a node whose plugin registers after the extender saw it is
    picked up by the 15 s ticker, not by the annotation's update: without this wait a
    demo's first pod could meet nodes still "unregistered"."""

    def registered() -> int:
        metrics = backend.service_get(SYSTEM_NAMESPACE, COMPONENT, "metrics", "/metrics")
        return metrics.count(METRIC_PER_GPU + "{")

    try:
        wait_for(lambda: registered() == gpus, READY_TIMEOUT, "the extender to register", 0.5)
    except WaitTimeout:
        raise HarnessError(
            f"the extender registered {registered()} of {gpus} GPUs after {READY_TIMEOUT:g}s; "
            f"see `gpulab kubectl -n {SYSTEM_NAMESPACE} logs -l "
            f"app.kubernetes.io/name={COMPONENT} -c extender`"
        ) from None
    progress(f"hami: the extender registered {gpus} GPUs")


@dataclass(frozen=True)
class Extender:
    """Where a client outside the cluster reaches the extender: its Service's https port
    (routes, with the CA of the webhook's caBundle) and metrics port."""

    routes: str
    metrics: str
    ca: ssl.SSLContext


def extender(backend: Backend) -> Extender | None:
    """The extender through its Service where the backend serves Service addresses to the
    host (the local backend's loopback block); None elsewhere (kubectl port-forward)."""
    api = backend.api()
    svc = client.CoreV1Api(api).read_namespaced_service(COMPONENT, SYSTEM_NAMESPACE)
    address = backend.service_host(svc.spec.cluster_ip or "")
    if address is None:
        return None
    hook = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(WEBHOOK)
    ca = base64.b64decode(hook.webhooks[0].client_config.ca_bundle).decode()
    ports = {p.name: p.port for p in svc.spec.ports}
    return Extender(
        f"https://{address}:{ports['https']}",
        f"http://{address}:{ports['metrics']}",
        ssl.create_default_context(cadata=ca),
    )


def extender_pid(backend: Backend) -> int:
    """The host process of the running extender container (local backend's pod runner:
    containerID ``gpulab://<pid>``)."""
    for pod in backend.component_pods(COMPONENT):
        if pod.metadata.deletion_timestamp:
            continue
        for status in pod.status.container_statuses or []:
            cid = status.container_id or ""
            if status.name == "extender" and status.state.running and cid.startswith("gpulab://"):
                return int(cid.removeprefix("gpulab://"))
    raise HarnessError(f"no running extender container in a {COMPONENT} pod of this backend")
