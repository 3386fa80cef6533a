"""`gpulab kueue-controller`: the Kueue counterpart's process (kubernetes-sigs/kueue
v0.19.2 cmd/kueue/main.go): read the Configuration, serve the webhooks, the metrics and
(VisibilityOnDemand) the visibility API, run the manager (informers, reconcilers,
scheduler) until interrupted.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException

from gpulab.informer import JOBS
from gpulab.kube import api_client
from gpulab.kueue import api, visibility, webhook
from gpulab.kueue.config import Configuration
from gpulab.kueue.controllers import client as kc
from gpulab.kueue.controllers.client import KubeClient
from gpulab.kueue.controllers.manager import Manager
from gpulab.kueue.metrics import Metrics
from gpulab.trace import Tracer

_log = logging.getLogger("gpulab.kueue")


def lookups(manager: Manager, kube: KubeClient) -> webhook.Lookups:
    """The webhooks' view of the cluster: the manager's informer caches."""

    def statefulset(ns: str, name: str) -> dict[str, Any] | None:
        found = manager.store(kc.STATEFULSETS).get(f"{ns}/{name}")
        if found is not None:
            return found
        try:  # created a moment ago: the informer may not have it yet
            return kube.get(kc.STATEFULSETS, ns, name)
        except ApiException:
            return None

    def job_queued(ns: str, name: str) -> bool:
        job = manager.store(JOBS).get(f"{ns}/{name}") or {}
        return bool(((job.get("metadata") or {}).get("labels") or {}).get(api.QUEUE_LABEL))

    return webhook.Lookups(
        local_queue_exists=lambda ns, n: (
            manager.store(kc.LOCAL_QUEUES).get(f"{ns}/{n}") is not None
        ),
        priority_class_exists=lambda n: (
            manager.store(kc.WORKLOAD_PRIORITY_CLASSES).get(n) is not None
        ),
        statefulset=statefulset,
        job_queued=job_queued,
        gates=manager.config.feature_gates,
    )


def start_visibility(
    manager: Manager, client: Any, bind: tuple[str, int], cert_file: str, key_file: str
) -> None:
    """CreateAndStartVisibilityServer, with the webhooks' serving certificate (the
    APIServices skip TLS verification, as upstream's). Without the front proxy's CA
    (a kube-apiserver started without --requestheader-client-ca-file) nothing is served."""
    try:
        client_ca, allowed = visibility.request_header_config(client)
    except ApiException as exc:
        _log.warning("visibility API not served: %s", exc.reason)
        return
    if not client_ca:
        _log.warning("visibility API not served: kube-apiserver has no front-proxy CA")
        return
    visibility.serve_in_thread(
        manager.queues,
        *bind,
        cert_file,
        key_file,
        client_ca,
        allowed,
        visibility.subject_access_review(client),
    )


def run(
    kubeconfig: str | None,
    config: Configuration,
    webhook_bind: str | None,
    cert_file: Path | None,
    key_file: Path | None,
    metrics_bind: tuple[str, int] | None,
) -> int:
    for name in config.not_applicable:
        _log.info("Configuration %s: not applicable to the lab's single replica", name)
    client = api_client(kubeconfig)
    kube = KubeClient(client)
    tracer = Tracer("kueue-controller", client)
    metrics = Metrics()
    manager = Manager(kube, tracer, config, metrics)
    server = None
    if webhook_bind is not None:
        assert cert_file is not None and key_file is not None
        server = webhook.serve_in_thread(
            webhook_bind, str(cert_file), str(key_file), lookups(manager, kube), manager.stop
        )
        if config.gate("VisibilityOnDemand"):
            host = config.visibility_bind[0] or webhook.parse_bind(webhook_bind)[0]
            bind = (host, config.visibility_bind[1])
            start_visibility(manager, client, bind, str(cert_file), str(key_file))
    if metrics_bind is not None:
        metrics.serve(*metrics_bind)
    signal.signal(signal.SIGTERM, lambda *_: manager.stop.set())
    runner = threading.Thread(target=manager.run, args=(client,), name="manager", daemon=True)
    runner.start()
    try:
        while runner.is_alive():
            runner.join(1.0)
    except KeyboardInterrupt:
        manager.stop.set()
        runner.join(10)
    finally:
        tracer.flush(timeout=2.0)
        if server is not None:
            server.should_exit = True
    return 0
