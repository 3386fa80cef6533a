"""The HTTP(S) side of the Volcano processes: healthz, metrics, admission routes.

vc-scheduler and vc-controller-manager serve ``/healthz`` (``--healthz-address``) and
Prometheus ``/metrics`` (``--listen-address``); vc-webhook-manager serves its admission
paths over HTTPS (``--port``, ``--tls-cert-file``, ``--tls-private-key-file``), as
upstream's ``cmd/*/app/server.go`` do. One small Starlette app each, run by uvicorn on a
socket bound before anything else starts (a port in use is one clear line). Idle
connections stay open 120 s (HAMi's ``UVICORN`` settings): kube-apiserver reuses its
kept-alive connections to a webhook for up to 90 s, and one closed under it fails the
admission with EOF (uvicorn's default closes them after 5 s; upstream's Go server never
does).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from gpulab.hami.server import UVICORN, listen, parse_bind

Handler = Callable[[Request], Awaitable[Response]]


def healthz(ready: threading.Event) -> Handler:
    async def handle(_: Request) -> Response:
        if ready.is_set():
            return PlainTextResponse("ok")
        return PlainTextResponse("informers not synced", status_code=503)

    return handle


def metrics(registry: CollectorRegistry) -> Handler:
    async def handle(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return handle


def serve(
    bind: str,
    flag: str,
    routes: list[Route],
    cert_file: str | None = None,
    key_file: str | None = None,
) -> uvicorn.Server:
    """Serve ``routes`` on ``bind`` (HOST:PORT, ``:PORT`` for all addresses) from a daemon
    thread; return once it listens. Raises StartError (one line) if it cannot bind."""
    host, port = parse_bind(bind, flag)
    sock = listen((host, port), flag)
    config = uvicorn.Config(
        Starlette(routes=routes), ssl_certfile=cert_file, ssl_keyfile=key_file, **UVICORN
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"http{flag}", daemon=True
    )
    thread.start()
    started = threading.Event()
    for _ in range(200):
        if server.started or not thread.is_alive():
            break
        started.wait(0.05)
    return server
