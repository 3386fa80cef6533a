"""Addon ``kueue``: the Kueue counterpart (``gpulab kueue-controller``, mirroring
kubernetes-sigs/kueue v0.19.2), deployed as pods on every backend.

Applies ``manifests/kueue/`` (the release's CRDs, RBAC, the Configuration ConfigMap, the
``kueue-controller-manager`` Deployment, its webhook and metrics Services, the webhook
configurations) through the backend: on the local backend the pod runner runs the
Deployment (image ``gpulab:dev``) as a host process talking as its ServiceAccount, and
the webhooks and the CRDs' conversion call ``kueue-webhook-service``'s address with the
``kueue-webhook-service-tls`` certificate the apply path creates. Returns once the
Deployment is available and a request through kube-apiserver reaches the webhooks (a
server-side dry run: on kind a Ready pod is reached through the Service only once
kube-proxy has its endpoint, and before that every call is refused): from then on
v1beta1 requests are converted and Jobs admitted.
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.kueue import api as kueue_api
from gpulab.wait import WaitTimeout, wait_for
from harness.addons import wait_deployment
from harness.apply import MANIFESTS
from harness.backends import Backend
from harness.errors import HarnessError

Progress = Callable[[str], None]
NAMESPACE = "kueue-system"
DEPLOYMENT = "kueue-controller-manager"
COMPONENT = "kueue"  # the pods' app.kubernetes.io/name
METRICS_SERVICE = "kueue-controller-manager-metrics-service"
METRICS_PORT = 8443
MANIFEST_DIR = MANIFESTS / "kueue"  # samples/ is left out by load_documents
READY_TIMEOUT = 120.0


def deploy(backend: Backend, progress: Progress) -> None:
    backend.apply([MANIFEST_DIR], progress)


def wait(backend: Backend, progress: Progress) -> None:
    wait_deployment(backend, NAMESPACE, DEPLOYMENT, READY_TIMEOUT, progress)
    _wait_webhooks(backend)
    progress(f"kueue: {DEPLOYMENT} Ready in {NAMESPACE}; CRDs, webhooks and metrics served")


def _wait_webhooks(backend: Backend) -> None:
    """Until kube-apiserver reaches the validating webhook: a dry-run ResourceFlavor
    (nothing is stored) that the webhook must answer."""
    custom = client.CustomObjectsApi(backend.api())
    flavor = {
        "apiVersion": f"{kueue_api.GROUP}/{kueue_api.VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": "gpulab-webhook-probe"},
    }
    last: list[str] = []

    def answered() -> bool:
        try:
            custom.create_cluster_custom_object(
                kueue_api.GROUP, kueue_api.VERSION, "resourceflavors", flavor, dry_run="All"
            )
        except ApiException as exc:
            last[:] = [str(exc.body or exc.reason)[:200]]
            return exc.status not in (500, 502, 503, 504)  # a webhook refusal answers
        return True

    try:
        wait_for(answered, READY_TIMEOUT, "Kueue's webhooks to answer through kube-apiserver")
    except WaitTimeout as exc:
        raise HarnessError(
            f"kueue: {DEPLOYMENT} is Ready but kube-apiserver cannot reach its webhooks "
            f"({last[0] if last else exc}); check `kubectl -n {NAMESPACE} get endpoints`"
        ) from exc


def metrics(backend: Backend) -> str:
    """The controller's Prometheus text, scraped through its metrics Service."""
    return backend.service_get(NAMESPACE, METRICS_SERVICE, "metrics", "/metrics")
