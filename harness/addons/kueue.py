"""Addon ``kueue``: the Kueue counterpart (``gpulab kueue-controller``, mirroring
kubernetes-sigs/kueue v0.19.2), deployed as pods on every backend.

Applies ``manifests/kueue/`` (the release's CRDs, RBAC, the Configuration ConfigMap, the
``kueue-controller-manager`` Deployment, its webhook and metrics Services, the webhook
configurations) through the backend: on the local backend the pod runner runs the
Deployment (image ``gpulab:dev``) as a host process talking as its ServiceAccount, and
the webhooks and the CRDs' conversion call ``kueue-webhook-service``'s address with the
``kueue-webhook-service-tls`` certificate the apply path creates. Returns once the
Deployment is available: from then on v1beta1 requests are converted and Jobs admitted.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.addons import wait_deployment
from harness.apply import MANIFESTS
from harness.backends import Backend

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
    progress(f"kueue: {DEPLOYMENT} Ready in {NAMESPACE}; CRDs, webhooks and metrics served")


def metrics(backend: Backend) -> str:
    """The controller's Prometheus text, scraped through its metrics Service."""
    return backend.service_get(NAMESPACE, METRICS_SERVICE, "metrics", "/metrics")
