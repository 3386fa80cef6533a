"""The Kueue webhooks: Job defaulting and CRD conversion, over HTTPS.

- ``POST /mutate-batch-v1-job`` (the path upstream registers for mjob.kb.io): a
  mutating AdmissionReview (admission.k8s.io/v1) for batch/v1 Jobs. A Job that names a
  LocalQueue in the ``kueue.x-k8s.io/queue-name`` label is created suspended, so no pod
  starts before Kueue admits it (pkg/controller/jobs/job/job_webhook.go Default,
  jobframework ApplyDefaultForSuspend).
- ``POST /convert``: ConversionReview (apiextensions.k8s.io/v1) for the kueue CRDs.
- ``GET /healthz``, ``GET /readyz``.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gpulab.kueue import api, conversion

_log = logging.getLogger("gpulab.kueue.webhook")

MUTATE_JOB_PATH = "/mutate-batch-v1-job"
CONVERT_PATH = "/convert"


def job_needs_suspend(job: Mapping[str, Any]) -> bool:
    """A Job with a queue-name label that is not already suspended."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(api.QUEUE_LABEL)) and not (job.get("spec") or {}).get("suspend")


def mutate_job_review(body: Mapping[str, Any]) -> dict[str, Any]:
    """Answer an AdmissionReview for a Job: allowed, with a JSONPatch when it must be
    suspended."""
    request = body.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    job = request.get("object") or {}
    if request.get("operation", "CREATE") == "CREATE" and job_needs_suspend(job):
        # "add" replaces the member when it exists (RFC 6902), so it covers suspend: false.
        patch = [{"op": "add", "path": "/spec/suspend", "value": True}]
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


async def _json_body(request: Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def _mutate_job(request: Request) -> JSONResponse:
    body = await _json_body(request)
    if body is None:
        return JSONResponse({"error": "body is not an AdmissionReview"}, status_code=400)
    return JSONResponse(mutate_job_review(body))


async def _convert(request: Request) -> JSONResponse:
    body = await _json_body(request)
    if body is None:
        return JSONResponse({"error": "body is not a ConversionReview"}, status_code=400)
    return JSONResponse(conversion.review(body))


async def _ok(_: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def make_app() -> Starlette:
    return Starlette(
        routes=[
            Route(MUTATE_JOB_PATH, _mutate_job, methods=["POST"]),
            Route(CONVERT_PATH, _convert, methods=["POST"]),
            Route("/healthz", _ok, methods=["GET"]),
            Route("/readyz", _ok, methods=["GET"]),
        ]
    )


def parse_bind(bind: str) -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--webhook-bind must be HOST:PORT, got {bind!r}")
    return host, int(port)


def serve_in_thread(bind: str, cert_file: str, key_file: str) -> uvicorn.Server:
    """Start the HTTPS webhook server on a daemon thread; returns once it listens."""
    host, port = parse_bind(bind)
    config = uvicorn.Config(
        make_app(),
        host=host,
        port=port,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="kueue-webhook", daemon=True)
    thread.start()
    for _ in range(200):
        if server.started or not thread.is_alive():
            break
        threading.Event().wait(0.05)
    if not server.started:
        raise RuntimeError(f"kueue webhook server did not start on {bind}")
    _log.info("kueue webhooks listening on https://%s", bind)
    return server
