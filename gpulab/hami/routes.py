"""The HTTP routes: /filter, /prioritize, /bind, /webhook, /healthz, /readyz.

Mirrors HAMi ``pkg/scheduler/routes/route.go`` (``PredicateRoute``, ``Bind``,
``WebHookRoute``, ``HealthzRoute``, ``ReadyzRoute``) and the router of
``cmd/scheduler/main.go``. Bodies are capped at 1 MB as HAMi does; a body that is not the
expected JSON gets HTTP 400 with a message, never a crash.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpulab.hami import webhook
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.scheduler import BadRequest, Scheduler, filter_error
from gpulab.hami.webhook import ReviewError, WebhookConfig
from gpulab.trace import ObjectRef

_log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
# Filter waits this long for the caches to sync before answering with an error.
SYNC_WAIT = 3.0


class _TooLarge(Exception):
    pass


async def _read_json(request: Request) -> Any:
    """The body as JSON; _TooLarge beyond 1 MB, BadRequest when not JSON."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise _TooLarge()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _TooLarge()
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"body is not JSON: {str(exc)[:200]}") from exc


def build_app(
    scheduler: Scheduler, webhook_cfg: WebhookConfig, metrics: ExtenderMetrics
) -> Starlette:
    async def guarded(
        route: str, request: Request, call: Callable[[Any], Awaitable[Response]]
    ) -> Response:
        try:
            body = await _read_json(request)
            response = await call(body)
        except _TooLarge:
            metrics.requests.labels(route, "bad_request").inc()
            return JSONResponse({"Error": f"request body exceeds {MAX_BODY} bytes"}, 413)
        except (BadRequest, ReviewError) as exc:
            metrics.requests.labels(route, "bad_request").inc()
            return JSONResponse({"Error": str(exc)}, 400)
        except RecursionError:
            metrics.requests.labels(route, "bad_request").inc()
            return JSONResponse({"Error": "request nests too deeply"}, 400)
        except Exception as exc:  # a bug must cost one request, not the extender
            _log.exception("%s failed", route)
            metrics.requests.labels(route, "error").inc()
            return JSONResponse({"Error": f"internal error: {exc}"}, 500)
        return response

    async def wait_synced() -> bool:
        deadline = time.monotonic() + SYNC_WAIT
        while not scheduler.ready():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def filter_route(request: Request) -> Response:
        async def call(body: Any) -> Response:
            start = time.perf_counter()
            if not await wait_synced():
                metrics.requests.labels("filter", "error").inc()
                return JSONResponse(filter_error("extender caches have not synced yet"))
            result = await run_in_threadpool(scheduler.filter, body)
            kept = result["NodeNames"] or (result["Nodes"] or {}).get("items")
            outcome = "error" if result["Error"] else "ok" if kept else "rejected"
            label = "error" if result["Error"] else "success"
            metrics.filter_duration.labels(label).observe(time.perf_counter() - start)
            metrics.filter_total.labels(label).inc()
            metrics.requests.labels("filter", outcome).inc()
            return JSONResponse(result)

        return await guarded("filter", request, call)

    async def prioritize_route(request: Request) -> Response:
        async def call(body: Any) -> Response:
            if not await wait_synced():
                metrics.requests.labels("prioritize", "error").inc()
                return JSONResponse([])
            result = await run_in_threadpool(scheduler.prioritize, body)
            metrics.requests.labels("prioritize", "ok").inc()
            return JSONResponse(result)

        return await guarded("prioritize", request, call)

    async def bind_route(request: Request) -> Response:
        async def call(body: Any) -> Response:
            start = time.perf_counter()
            result = await run_in_threadpool(scheduler.bind, body)
            label = "error" if result["Error"] else "success"
            metrics.bind_duration.labels(label).observe(time.perf_counter() - start)
            metrics.bind_total.labels(label).inc()
            metrics.requests.labels("bind", "error" if result["Error"] else "ok").inc()
            return JSONResponse(result)

        return await guarded("bind", request, call)

    async def webhook_route(request: Request) -> Response:
        async def call(body: Any) -> Response:
            answer, decision = webhook.review(body, webhook_cfg)
            metrics.requests.labels("webhook", "ok" if decision.allowed else "rejected").inc()
            if decision.gpu:
                scheduler.tracer.step(
                    "Webhook",
                    _pod_ref(body["request"]),
                    f"admitted: {len(decision.patch)} patch ops (schedulerName, defaults)"
                    if decision.allowed
                    else f"rejected: {decision.message}",
                    warning=not decision.allowed,
                    patch=decision.patch,
                )
            return JSONResponse(answer)

        return await guarded("webhook", request, call)

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if scheduler.ready():
            return PlainTextResponse("ok")
        return PlainTextResponse("node and pod caches not synced yet", 503)

    return Starlette(
        routes=[
            Route("/filter", filter_route, methods=["POST"]),
            Route("/prioritize", prioritize_route, methods=["POST"]),
            Route("/bind", bind_route, methods=["POST"]),
            Route("/webhook", webhook_route, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ]
    )


def _pod_ref(req: dict[str, Any]) -> ObjectRef:
    """The pod under admission (no UID yet; generateName pods have no name either)."""
    obj = req.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name") or req.get("name") or meta.get("generateName") or ""
    namespace = req.get("namespace") or meta.get("namespace") or "default"
    return ObjectRef("Pod", str(name), str(namespace))
