"""Addon ``volcano``: the Volcano chapter's three components, deployed as pods.

Applies ``manifests/volcano/`` (CRDs, RBAC, the scheduler ConfigMap, the Deployments and
Services of vc-scheduler, vc-controller-manager and vc-webhook-manager, the webhook
configurations) through the backend, so on the local backend the pod
runner runs the three Deployments (image ``gpulab:dev``) as host processes and the webhooks
call the admission Service with the ``volcano-admission-service-tls`` certificate the
harness creates. Returns once the three Deployments are Ready and the scheduler has
created the ``default`` queue (Open).
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.volcano import apis
from gpulab.wait import WaitTimeout, wait_for
from harness.apply import MANIFESTS
from harness.backends import Backend
from harness.errors import HarnessError

Progress = Callable[[str], None]
NAMESPACE = "volcano-system"
DEPLOYMENTS = ("volcano-scheduler", "volcano-controllers", "volcano-admission")
MANIFEST_DIR = MANIFESTS / "volcano"
READY_TIMEOUT = 120.0


def deploy(backend: Backend, progress: Progress) -> None:
    backend.apply([MANIFEST_DIR], progress)


def wait(backend: Backend, progress: Progress) -> None:
    wait_ready(backend.api(), progress)


def wait_ready(api: client.ApiClient, progress: Progress) -> None:
    """Wait for the Deployments to be Ready and the default queue to be Open."""
    apps = client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)

    def not_ready() -> list[str]:
        waiting = []
        for name in DEPLOYMENTS:
            status = apps.read_namespaced_deployment(name, NAMESPACE).status
            if not status.ready_replicas:
                waiting.append(name)
        return waiting

    def default_queue_open() -> bool:
        try:
            queue = custom.get_cluster_custom_object(
                apis.SCHEDULING_GROUP, apis.SCHEDULING_VERSION, "queues", apis.DEFAULT_QUEUE
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return (queue.get("status") or {}).get("state") == apis.QUEUE_OPEN

    try:
        wait_for(lambda: not not_ready(), READY_TIMEOUT, "the Volcano Deployments to be Ready")
        wait_for(default_queue_open, 60, "the default queue to be Open")
    except WaitTimeout as exc:
        raise HarnessError(
            f"{exc}; still waiting: {', '.join(not_ready()) or 'default queue'} "
            f"(gpulab kubectl -n {NAMESPACE} get pods,events)"
        ) from None
    progress(f"volcano: {', '.join(DEPLOYMENTS)} Ready in {NAMESPACE}; queue default Open")
