"""vc-webhook-manager: the admission routes over HTTPS.

Mirrors volcano-sh/volcano v1.15.1 ``cmd/webhook-manager`` and ``pkg/webhooks/router``:
each enabled path (``--enabled-admission``) answers an AdmissionReview (admission.k8s.io/v1)
- ``/jobs/mutate``, ``/jobs/validate``, ``/queues/mutate``, ``/queues/validate`` - with
``allowed``, a JSONPatch, or ``status.message`` (what kubectl prints after
"admission webhook ... denied the request:"). Queues are read from an informer, as the
upstream QueueLister; ``/healthz`` answers once it has synced.

Lab difference: ``/podgroups/validate``, ``/pods/*``, ``/hypernodes/validate``,
``/cronjobs/validate`` and ``/jobflows/*`` are not served.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpulab.informer import Store
from gpulab.trace import Tracer
from gpulab.volcano.server import healthz
from gpulab.volcano.webhooks import jobs, queues

_log = logging.getLogger(__name__)

Obj = dict[str, Any]
Review = Callable[[Mapping[str, Any]], Obj]  # AdmissionRequest -> AdmissionResponse
PATHS = ("/jobs/mutate", "/jobs/validate", "/queues/mutate", "/queues/validate")


def allowed(uid: str, patch: list[Obj] | None = None) -> Obj:
    response: Obj = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return response


def denied(uid: str, message: str) -> Obj:
    return {"uid": uid, "allowed": False, "status": {"message": message.strip()}}


class Admission:
    """The admission functions, over the webhook's view of the Queues."""

    def __init__(self, queues: Store, tracer: Tracer, scheduler_name: str) -> None:
        self.queues = queues
        self.tracer = tracer
        self.scheduler_name = scheduler_name

    def mutate_jobs(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        if request.get("operation") != "CREATE":
            return denied(uid, "expect operation to be 'CREATE' ")
        return allowed(uid, jobs.mutate_patch(request.get("object") or {}, self.scheduler_name))

    def validate_jobs(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        job = request.get("object") or {}
        if request.get("operation") == "CREATE":
            message = jobs.validate_job_create(job, self.queues.get)
        elif request.get("operation") == "UPDATE":
            message = jobs.validate_job_update(request.get("oldObject") or {}, job)
        else:
            message = "expect operation to be 'CREATE' or 'UPDATE'"
        if message:
            meta = job.get("metadata") or {}
            self.tracer.step(
                "AdmitJobs",
                None,
                f"denied {request.get('operation')} of vcjob "
                f"{meta.get('namespace') or request.get('namespace')}/{meta.get('name')}: "
                f"{message.strip()}",
            )
            return denied(uid, message)
        return allowed(uid)

    def mutate_queues(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        if request.get("operation") != "CREATE":
            op = request.get("operation")
            return denied(uid, f"invalid operation `{op}`, expect operation to be `CREATE`")
        return allowed(uid, queues.mutate_patch(request.get("object") or {}))

    def validate_queues(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        if request.get("operation") == "DELETE":
            message = queues.validate_delete(str(request.get("name") or ""))
            return denied(uid, message) if message else allowed(uid)
        return allowed(uid)

    def review(self, path: str) -> Review:
        return {
            "/jobs/mutate": self.mutate_jobs,
            "/jobs/validate": self.validate_jobs,
            "/queues/mutate": self.mutate_queues,
            "/queues/validate": self.validate_queues,
        }[path]


def route(path: str, review: Review) -> Route:
    async def handle(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "body is not an AdmissionReview"}, status_code=400)
        admission = body.get("request") if isinstance(body, dict) else None
        if not isinstance(admission, dict):
            return JSONResponse({"error": "AdmissionReview without a request"}, status_code=400)
        return JSONResponse(
            {
                "apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
                "kind": "AdmissionReview",
                "response": review(admission),
            }
        )

    return Route(path, handle, methods=["POST"])


def routes(admission: Admission, enabled: list[str], ready: threading.Event) -> list[Route]:
    unknown = [p for p in enabled if p not in PATHS]
    if unknown:
        raise ValueError(
            f"--enabled-admission: {', '.join(unknown)} not served; known: {', '.join(PATHS)}"
        )
    out = [route(p, admission.review(p)) for p in enabled]
    out.append(Route("/healthz", healthz(ready), methods=["GET"]))
    return out
