"""vc-webhook-manager: the admission routes over HTTPS.

Mirrors volcano-sh/volcano v1.15.1 ``cmd/webhook-manager`` and ``pkg/webhooks/router``:
each enabled path (``--enabled-admission``) answers an AdmissionReview (admission.k8s.io/v1)
- ``/jobs/mutate``, ``/jobs/validate``, ``/podgroups/validate``, ``/queues/mutate``,
``/queues/validate`` (the helm chart's default set, without ``/hypernodes`` and
``/cronjobs``) - with ``allowed``, a JSONPatch, or ``status.message`` (what kubectl prints
after "admission webhook ... denied the request:"). ``serve`` caps a body at
``MaxRequestBody`` (3 MiB, HTTP 413 beyond); a body or object that does not decode is
answered with ``allowed: false`` and the decoder's error (schema.py). Queues are read
from an informer, as the upstream QueueLister; ``/healthz`` answers once it has synced.

Lab difference: ``/podgroups/mutate``, ``/pods/*``, ``/hypernodes/validate``,
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
from gpulab.volcano.webhooks import jobs, podgroups, queues, schema

_log = logging.getLogger(__name__)

Obj = dict[str, Any]
Review = Callable[[Mapping[str, Any]], Obj]  # AdmissionRequest -> AdmissionResponse
PATHS = (
    "/jobs/mutate",
    "/jobs/validate",
    "/podgroups/validate",
    "/queues/mutate",
    "/queues/validate",
)
MAX_REQUEST_BODY = 3 * 1024 * 1024  # router.MaxRequestBody, kube-apiserver's default


def allowed(uid: str, patch: list[Obj] | None = None) -> Obj:
    response: Obj = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return response


def denied(uid: str, message: str, code: int | None = None) -> Obj:
    status: Obj = {"message": message.strip()}
    if code is not None:
        status["code"] = code
    return {"uid": uid, "allowed": False, "status": status}


def refused(uid: str, message: str) -> Obj:
    """util.ToAdmissionResponse(err) for a request that does not decode: 400."""
    return denied(uid, message, 400)


class Admission:
    """The admission functions, over the webhook's view of the Queues."""

    def __init__(self, queues: Store, tracer: Tracer, scheduler_name: str) -> None:
        self.queues = queues
        self.tracer = tracer
        self.scheduler_name = scheduler_name

    def mutate_jobs(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        job = schema.decode(request, "object", schema.JOBS)
        if request.get("operation") != "CREATE":
            return refused(uid, "expect operation to be 'CREATE' ")
        return allowed(uid, jobs.mutate_patch(job, self.scheduler_name))

    def validate_jobs(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        job = schema.decode(request, "object", schema.JOBS)
        if request.get("operation") == "CREATE":
            message = jobs.validate_job_create(job, self.queues.get)
        elif request.get("operation") == "UPDATE":
            old = schema.decode(request, "oldObject", schema.JOBS)
            message = jobs.validate_job_update(old, job)
        else:
            return refused(uid, "expect operation to be 'CREATE' or 'UPDATE'")
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

    def validate_pod_groups(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        pg = schema.decode(request, "object", schema.PODGROUPS)
        if request.get("operation") != "CREATE":
            return denied(uid, f"unsupported operation {request.get('operation')}", 400)
        message = podgroups.validate_create(pg, self.queues.get)
        return denied(uid, message) if message else allowed(uid)

    def mutate_queues(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        queue = schema.decode(request, "object", schema.QUEUES)
        if request.get("operation") != "CREATE":
            op = request.get("operation")
            return refused(uid, f"invalid operation `{op}`, expect operation to be `CREATE`")
        return allowed(uid, queues.mutate_patch(queue))

    def validate_queues(self, request: Mapping[str, Any]) -> Obj:
        uid = request.get("uid", "")
        operation = request.get("operation")
        if operation == "DELETE":  # kube-apiserver sends the object as oldObject
            schema.decode(request, "oldObject", schema.QUEUES)
            message = queues.validate_delete(str(request.get("name") or ""), self.queues)
        elif operation in ("CREATE", "UPDATE"):
            queue = schema.decode(request, "object", schema.QUEUES)
            old = None
            if operation == "UPDATE":
                old = schema.decode(request, "oldObject", schema.QUEUES)
            message = queues.validate_create_update(queue, old, operation, self.queues)
        else:
            return refused(
                uid,
                f"invalid operation `{operation}`, expect operation to be `CREATE`, `UPDATE` "
                "or `DELETE`",
            )
        return denied(uid, message) if message else allowed(uid)

    def review(self, path: str) -> Review:
        return {
            "/jobs/mutate": self.mutate_jobs,
            "/jobs/validate": self.validate_jobs,
            "/podgroups/validate": self.validate_pod_groups,
            "/queues/mutate": self.mutate_queues,
            "/queues/validate": self.validate_queues,
        }[path]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def answer(review: Review, raw: bytes) -> Obj:
    """The AdmissionReview to send back for body ``raw``. What does not decode is refused
    (400); an exception in the admission functions themselves is a bug and propagates."""
    uid = ""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        response = refused(uid, "the body nests deeper than the decoder goes")
    except ValueError as exc:  # not JSON, not UTF-8, an integer too long
        response = refused(uid, f"couldn't decode the AdmissionReview: {exc}"[:1000])
    else:
        try:
            request = schema.review_request(body)
            uid = request["uid"] if isinstance(request.get("uid"), str) else ""
            # a JSON null uid decodes to "" in Go (types.UID); answer with that, not null
            response = {**review(request), "uid": uid}
        except schema.DecodeError as exc:
            response = refused(uid, str(exc))
        except RecursionError:  # a copy or a patch of an object nested as deep as it parses
            response = refused(uid, "the body nests deeper than the decoder goes")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def route(path: str, review: Review) -> Route:
    async def handle(request: Request) -> Response:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():  # read to the end: the client gets its answer
            size += len(chunk)
            if size <= MAX_REQUEST_BODY:
                chunks.append(chunk)
            elif size > 4 * MAX_REQUEST_BODY:
                break
        if size > MAX_REQUEST_BODY:
            return JSONResponse({"error": "request body too large"}, status_code=413)
        return JSONResponse(answer(review, b"".join(chunks)))

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
