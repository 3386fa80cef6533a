"""`gpulab kueue-controller`: the Kueue counterpart's process (cmd/kueue/main.go).

Starts the webhook server (Job defaulting, CRD conversion) when asked to, then the
manager loop with its informers, until interrupted.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpulab.kube import api_client
from gpulab.kueue import webhook
from gpulab.kueue.controllers.client import KubeClient
from gpulab.kueue.controllers.manager import Manager
from gpulab.trace import Tracer

_log = logging.getLogger("gpulab.kueue")


def run(
    kubeconfig: str | None,
    webhook_bind: str | None,
    cert_file: Path | None,
    key_file: Path | None,
    resync_seconds: float = 5.0,
) -> int:
    server = None
    if webhook_bind is not None:
        assert cert_file is not None and key_file is not None
        server = webhook.serve_in_thread(webhook_bind, str(cert_file), str(key_file))
    api = api_client(kubeconfig)
    tracer = Tracer("kueue-controller", api)
    manager = Manager(KubeClient(api), tracer, resync_seconds=resync_seconds)
    try:
        manager.run()
    finally:
        manager.stop.set()
        tracer.flush(timeout=2.0)
        if server is not None:
            server.should_exit = True
    return 0
