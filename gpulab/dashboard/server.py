"""The dashboard's HTTP side: a Starlette app served by uvicorn on 127.0.0.1.

GET /                       the page (static/index.html)
GET /static/...             its scripts and styles; vendor/ is filled by `make dashboard-web`
GET /api/stream             server-sent events: ``snapshot`` (every view, the recent
                            calls), then ``patch`` batches ({"k", "v"} view changes,
                            {"call"} new calls) as the cluster changes
GET /api/explain/{ns}/{pod} a pending pod's per-node table, scheduler reasons, Events
GET /api/diagram            the recent call chain as a Markdown Mermaid block
                            (``?namespace=`` keeps one namespace's calls)
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gpulab.dashboard import chain
from gpulab.dashboard.hub import Hub
from gpulab.errors import UserError

STATIC = Path(__file__).parent / "static"
VENDORED = (
    "preact.mjs",
    "hooks.mjs",
    "signals-core.mjs",
    "signals.mjs",
    "htm.mjs",
    "mermaid.min.js",
)
KEEPALIVE = 15.0  # seconds between comments on an idle stream (proxies, dead peers)
BATCH = 1000  # patches sent in one message at most
RETRY_MS = 1000  # how soon EventSource reconnects after the stream drops

_log = logging.getLogger("gpulab.dashboard")


class DashboardError(UserError):
    """The dashboard cannot start; the message says what to do."""


def check_assets() -> None:
    missing = [name for name in VENDORED if not (STATIC / "vendor" / name).exists()]
    if missing:
        raise DashboardError(
            f"the dashboard's front-end files are missing ({', '.join(missing)}): "
            "run `make dashboard-web`"
        )


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def app(hub: Hub) -> Starlette:
    async def index(_request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def stream(request: Request) -> StreamingResponse:
        snapshot, queue = hub.fanout.subscribe(asyncio.get_running_loop())

        async def events() -> AsyncIterator[str]:
            try:
                yield f"retry: {RETRY_MS}\n" + _sse("snapshot", snapshot)
                while True:
                    try:
                        first = await asyncio.wait_for(queue.get(), KEEPALIVE)
                    except TimeoutError:
                        yield ": keepalive\n\n"
                        continue
                    batch = [first]
                    while len(batch) < BATCH and not queue.empty():
                        batch.append(queue.get_nowait())
                    if None in batch:  # dropped for falling behind: the page reconnects
                        return
                    yield _sse("patch", batch)
            finally:
                hub.fanout.unsubscribe(queue)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def explain(request: Request) -> JSONResponse:
        ns, name = request.path_params["namespace"], request.path_params["name"]
        found = hub.explain(ns, name)
        if found is None:
            return JSONResponse({"error": f"pod {ns}/{name} not found"}, status_code=404)
        return JSONResponse(found)

    async def diagram(request: Request) -> PlainTextResponse:
        ns = request.query_params.get("namespace")
        calls = [c for c in hub.fanout.calls() if not ns or chain.namespace_of(c.regarding) == ns]
        return PlainTextResponse(chain.markdown(chain.collapse(calls)), media_type="text/markdown")

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/stream", stream),
            Route("/api/explain/{namespace}/{name}", explain),
            Route("/api/diagram", diagram),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )


@dataclass
class Dashboard:
    """A running dashboard: the hub and the HTTP server (in this thread or another)."""

    hub: Hub
    server: uvicorn.Server
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def stop(self) -> None:
        self.server.should_exit = True
        self.hub.stop()


def _server(hub: Hub, port: int) -> uvicorn.Server:
    config = uvicorn.Config(
        app(hub), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    return uvicorn.Server(config)


def serve(hub: Hub, port: int) -> None:
    """Serve until interrupted (the `gpulab dashboard` command)."""
    check_assets()
    server = _server(hub, port)
    try:
        server.run()
    finally:
        hub.stop()
    if not server.started:
        raise DashboardError(f"could not listen on 127.0.0.1:{port}: pass another --port")


def start(hub: Hub, port: int, timeout: float = 10.0) -> Dashboard:
    """Serve from a background thread (demos' --dashboard, tests); returns once listening."""
    from gpulab.wait import wait_for

    check_assets()
    server = _server(hub, port)
    thread = threading.Thread(target=server.run, name="dashboard-http", daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), timeout, f"the dashboard on :{port}")
    if not server.started:
        hub.stop()
        raise DashboardError(f"could not listen on 127.0.0.1:{port}: pass another port")
    return Dashboard(hub, server, port)
