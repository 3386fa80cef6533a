"""The HTTP routes: POST /filter, /bind, /webhook and GET /healthz, /readyz.

Mirrors Project-HAMi/HAMi v2.10.0 ``pkg/scheduler/routes/route.go`` (``PredicateRoute``,
``Bind``, ``WebHookRoute``, ``HealthzRoute``, ``ReadyzRoute``) and the router of
``cmd/scheduler/main.go``. As upstream:
- bodies are read up to 1 MB; a body that does not decode is answered **200** with the
  error in ``Error`` (ExtenderFilterResult / ExtenderBindingResult), never a 4xx;
- /filter waits until the first node registration pass has finished (``WaitForCacheSync``);
- /webhook always answers 200 with an AdmissionReview (controller-runtime);
- /healthz and /readyz answer 200 with an empty body (readyz: leader or not, and without
  leader election this replica is the leader).
There is no /prioritize: HAMi decides in Filter. The lab adds the ``Webhook`` call-chain
step and ``gpulab_``-prefixed request metrics.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from anyio import CapacityLimiter, to_thread
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpulab.hami import bind as bind_mod
from gpulab.hami import filter as filter_mod
from gpulab.hami import webhook
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.scheduler import Scheduler
from gpulab.hami.webhook import WebhookConfig
from gpulab.trace import ObjectRef

_log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
# Go serves every request on its own goroutine; Python's default thread pool (40) would let
# Binds waiting for a node lock (PodGroup members) starve Filter. Binds get their own pool.
BIND_THREADS = 256
# kube-scheduler gives the extender 30s (httpTimeout); upstream waits as long as the
# request lives.
SYNC_WAIT = 30.0


class _Unreadable(Exception):
    pass


async def _read_json(request: Request) -> Any:
    """The body as JSON; _Unreadable (with Go's wording where it has one) otherwise."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise _Unreadable(f"unexpected EOF (the body is cut at {MAX_BODY} bytes)")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise _Unreadable("EOF")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _Unreadable(f"invalid character in JSON: {str(exc)[:200]}") from exc


def build_app(
    scheduler: Scheduler,
    webhook_cfg: WebhookConfig,
    metrics: ExtenderMetrics,
) -> Starlette:
    def observe(route: str, start: float, error: bool, outcome: str) -> None:
        metrics.duration.labels(route, "error" if error else "ok").observe(
            time.perf_counter() - start
        )
        metrics.requests.labels(route, outcome).inc()

    bind_threads: list[CapacityLimiter] = []  # made in the event loop, on first use

    async def in_thread(
        route: str, call: Callable[[Any], dict[str, Any]], body: Any
    ) -> dict[str, Any]:
        if route != "bind":
            return await run_in_threadpool(call, body)
        if not bind_threads:
            bind_threads.append(CapacityLimiter(BIND_THREADS))
        return await to_thread.run_sync(call, body, limiter=bind_threads[0])

    async def extender(
        request: Request,
        route: str,
        call: Callable[[Any], dict[str, Any]],
        error_body: Callable[[str], Any],
    ) -> Response:
        start = time.perf_counter()
        try:
            body = await _read_json(request)
        except _Unreadable as exc:
            observe(route, start, True, "error")
            return JSONResponse(error_body(str(exc)))
        if route == "filter" and not scheduler.synced.is_set():
            synced = await run_in_threadpool(scheduler.synced.wait, SYNC_WAIT)
            if not synced:
                observe(route, start, True, "error")
                return JSONResponse(
                    error_body(
                        f"context cancelled: the node registry did not sync within {SYNC_WAIT:g}s"
                    )
                )
        try:
            result = await in_thread(route, call, body)
        except Exception as exc:  # a bug must cost one request, not the extender
            _log.exception("%s failed", route)
            observe(route, start, True, "error")
            return JSONResponse(error_body(f"internal error: {exc!r}"), 500)
        kept = result.get("NodeNames") or (result.get("Nodes") or {}).get("items")
        outcome = "error" if result["Error"] else "ok" if route == "bind" or kept else "rejected"
        observe(route, start, bool(result["Error"]), outcome)
        return JSONResponse(result)

    async def filter_route(request: Request) -> Response:
        return await extender(
            request,
            "filter",
            lambda body: filter_mod.filter(scheduler, body),
            lambda msg: filter_mod.result(error=msg),
        )

    async def bind_route(request: Request) -> Response:
        return await extender(
            request, "bind", lambda body: bind_mod.bind(scheduler, body), lambda msg: {"Error": msg}
        )

    async def webhook_route(request: Request) -> Response:
        start = time.perf_counter()
        try:
            body = await _read_json(request)
        except _Unreadable:
            body = None
        answer, decision = webhook.review(body, webhook_cfg, _quota_fit(scheduler))
        observe(
            "webhook",
            start,
            decision.code >= 400 and decision.code != 403,
            "ok" if decision.allowed else "rejected",
        )
        if decision.gpu:
            scheduler.events.step(
                "Webhook",
                _pod_ref(body["request"]),
                f"admitted: {len(decision.patch)} patch ops (schedulerName, defaults)"
                if decision.allowed
                else f"rejected: {decision.message}",
                warning=not decision.allowed,
                patch=decision.patch,
            )
        return JSONResponse(answer)

    async def healthz(_: Request) -> Response:
        return Response(status_code=200)

    async def readyz(_: Request) -> Response:
        return Response(status_code=200)

    return Starlette(
        routes=[
            Route("/filter", filter_route, methods=["POST"]),
            Route("/bind", bind_route, methods=["POST"]),
            Route("/webhook", webhook_route, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ]
    )


def _quota_fit(scheduler: Scheduler) -> webhook.QuotaFit:
    def fits(namespace: str, mem: int, cores: int) -> bool:
        with scheduler.lock:
            return scheduler.quotas.fits(namespace, mem, cores)

    return fits


def _pod_ref(req: dict[str, Any]) -> ObjectRef:
    """The pod under admission (no UID yet; generateName pods have no name either)."""
    obj = req.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name") or req.get("name") or meta.get("generateName") or ""
    namespace = req.get("namespace") or meta.get("namespace") or "default"
    return ObjectRef("Pod", str(name), str(namespace))
