"""The Kueue webhooks over HTTPS: defaulting and validation of jobs, pods, Deployments,
StatefulSets and the kueue.x-k8s.io kinds, and CRD conversion.

Paths and names as kubernetes-sigs/kueue v0.19.2 config/components/webhook registers
them: ``/mutate-batch-v1-job`` (mjob: default LocalQueue, WorkloadPriorityClass
defaulting behind its feature gate, ``suspend: true`` for a queued Job —
jobframework/defaults.go), ``/validate-batch-v1-job`` (vjob), ``/mutate--v1-pod``
(mpod: the ``kueue.x-k8s.io/managed`` label, finalizer and ``kueue.x-k8s.io/admission``
scheduling gate; a StatefulSet's pods become one pod group), ``/validate--v1-pod``,
``/mutate-apps-v1-deployment`` and ``/mutate-apps-v1-statefulset`` (the pod template
marked ``kueue.x-k8s.io/pod-suspending-parent``), their ``/validate-`` twins, and
``/validate-kueue-x-k8s-io-v1beta2-{clusterqueue,cohort,resourceflavor,workload}``;
``/convert`` (ConversionReview); ``/healthz``, ``/readyz``.

Hostile input: bodies over ``MAX_BODY`` get 413 (drained, so the connection survives);
a body that is not a JSON object gets 400; anything that parses is answered in the
protocol: ``allowed: false`` with a 400 status for a malformed AdmissionReview,
``result.status: Failure`` for a malformed ConversionReview.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gpulab.kueue import api, conversion, validation
from gpulab.kueue import workload as wlutil
from gpulab.wait import wait_for

_log = logging.getLogger("gpulab.kueue.webhook")

MAX_BODY = 3 << 20  # the API server's own request limit; larger bodies cannot be reviews
_DRAIN_LIMIT = 64 << 20
CONVERT_PATH = "/convert"
MUTATE_JOB_PATH = "/mutate-batch-v1-job"

Obj = dict[str, Any]


@dataclass
class Lookups:
    """What the webhooks read from the controller's informer caches."""

    local_queue_exists: Callable[[str, str], bool] = lambda _ns, _name: False
    priority_class_exists: Callable[[str], bool] = lambda _name: False
    statefulset: Callable[[str, str], Obj | None] = lambda _ns, _name: None
    job_queued: Callable[[str, str], bool] = lambda _ns, _name: False
    gates: Mapping[str, bool] = field(default_factory=dict)


class ReviewError(ValueError):
    """The body is JSON but not a usable AdmissionReview."""


# -- helpers ----------------------------------------------------------------------------------


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations turning ``old`` into ``new`` (objects recursively, the rest
    replaced whole)."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        for key, value in new.items():
            p = f"{path}/{_escape(key)}"
            if key not in old:
                ops.append({"op": "add", "path": p, "value": value})
            elif old[key] != value:
                ops += json_patch(old[key], value, p)
        return ops
    return [] if old == new else [{"op": "replace", "path": path, "value": new}]


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def _map(obj: Obj, key: str) -> Obj:
    value = obj.get(key)
    if not isinstance(value, dict):
        value = obj[key] = {}
    return value


def _labels(obj: Obj) -> Obj:
    return _map(_meta(obj), "labels")


def _template(obj: Obj) -> Obj:
    return _map(_map(obj, "spec"), "template")


def _apply_defaults(obj: Obj, namespace: str, lookups: Lookups) -> None:
    """ApplyDefaultLocalQueue and (gated) ApplyDefaultWorkloadPriorityClass."""
    labels = _meta(obj).get("labels")
    labels = labels if isinstance(labels, dict) else {}
    if not labels.get(api.QUEUE_LABEL) and lookups.local_queue_exists(
        namespace, api.DEFAULT_LOCAL_QUEUE
    ):
        _labels(obj)[api.QUEUE_LABEL] = api.DEFAULT_LOCAL_QUEUE
    if (
        lookups.gates.get("WorkloadPriorityClassDefaulting")
        and not labels.get(api.PRIORITY_CLASS_LABEL)
        and lookups.priority_class_exists(api.DEFAULT_PRIORITY_CLASS)
    ):
        _labels(obj)[api.PRIORITY_CLASS_LABEL] = api.DEFAULT_PRIORITY_CLASS


# -- defaulting (mutating) ----------------------------------------------------------------------


def default_job(job: Obj, namespace: str, lookups: Lookups) -> None:
    _apply_defaults(job, namespace, lookups)
    if (_meta(job).get("labels") or {}).get(api.QUEUE_LABEL):
        _map(job, "spec")["suspend"] = True


def default_parent(obj: Obj, namespace: str, lookups: Lookups, framework: str) -> None:
    """Deployment / StatefulSet: the pod template says who suspends its pods."""
    _apply_defaults(obj, namespace, lookups)
    labels = _meta(obj).get("labels") or {}
    queue = labels.get(api.QUEUE_LABEL)
    if not queue:
        return
    template = _template(obj)
    _map(_map(template, "metadata"), "annotations")[api.SUSPENDED_BY_PARENT] = framework
    if framework == "deployment":
        tlabels = _map(_map(template, "metadata"), "labels")
        tlabels[api.MANAGED_LABEL] = "true"
        tlabels[api.QUEUE_LABEL] = queue
        if labels.get(api.PRIORITY_CLASS_LABEL):
            tlabels[api.PRIORITY_CLASS_LABEL] = labels[api.PRIORITY_CLASS_LABEL]


def _controller_owner(obj: Obj) -> Obj | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def default_pod(pod: Obj, namespace: str, lookups: Lookups) -> None:
    """PodWebhook.Default."""
    annotations = _meta(pod).get("annotations") or {}
    parent = annotations.get(api.SUSPENDED_BY_PARENT)
    owner = _controller_owner(pod) or {}
    if not parent:
        if owner.get("kind") == "Job" and lookups.job_queued(namespace, str(owner.get("name"))):
            return  # the Job integration owns it
        _apply_defaults(pod, namespace, lookups)
        if not (_meta(pod).get("labels") or {}).get(api.QUEUE_LABEL):
            return
        _labels(pod)[api.MANAGED_LABEL] = "true"
    if parent == "statefulset" and owner.get("kind") == "StatefulSet":
        _join_statefulset_group(pod, namespace, str(owner.get("name")), lookups)
    if not parent:
        finalizers = _meta(pod).get("finalizers")
        if not isinstance(finalizers, list):
            finalizers = _meta(pod)["finalizers"] = []
        if api.POD_FINALIZER not in finalizers:
            finalizers.append(api.POD_FINALIZER)
    spec = _map(pod, "spec")
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        gates = spec["schedulingGates"] = []
    if not any(isinstance(g, dict) and g.get("name") == api.ADMISSION_GATE for g in gates):
        gates.append({"name": api.ADMISSION_GATE})


def _join_statefulset_group(pod: Obj, namespace: str, sts_name: str, lookups: Lookups) -> None:
    """What upstream's StatefulSet pod reconciler writes on its pods: one pod group per
    StatefulSet, as many pods as replicas (lab: written by the pod webhook)."""
    sts = lookups.statefulset(namespace, sts_name)
    if sts is None:
        return
    meta = sts.get("metadata") or {}
    labels = _labels(pod)
    labels[api.MANAGED_LABEL] = "true"
    queue = (meta.get("labels") or {}).get(api.QUEUE_LABEL)
    if queue:
        labels[api.QUEUE_LABEL] = queue
    labels[api.POD_GROUP_NAME_LABEL] = wlutil.workload_name(
        sts_name, str(meta.get("uid", "")), "StatefulSet", "apps"
    )
    ann = _map(_meta(pod), "annotations")
    ann[api.POD_GROUP_TOTAL_COUNT] = str((sts.get("spec") or {}).get("replicas", 1))
    ann["kueue.x-k8s.io/pod-group-fast-admission"] = "true"
    ann[api.POD_GROUP_SERVING] = "true"


# -- the review -----------------------------------------------------------------------------------


def _request(body: Any) -> Obj:
    if not isinstance(body, dict):
        raise ReviewError("body is not an AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing")
    if not isinstance(request.get("uid"), str):
        raise ReviewError("request.uid must be a string")
    if request.get("operation") not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise ReviewError("request.operation must be CREATE, UPDATE, DELETE or CONNECT")
    for key in ("object", "oldObject"):
        obj = request.get(key)
        if obj is not None and not isinstance(obj, dict):
            raise ReviewError(f"request.{key} must be an object")
        # ObjectMeta's maps, as the decoder types them (every defaulter reads labels)
        meta = (obj or {}).get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise ReviewError(f"request.{key}.metadata must be an object")
        for name in ("labels", "annotations"):
            value = (meta or {}).get(name)
            if value is not None and not isinstance(value, dict):
                raise ReviewError(f"request.{key}.metadata.{name} must be a map of strings")
    if request.get("namespace") is not None and not isinstance(request["namespace"], str):
        raise ReviewError("request.namespace must be a string")
    return request


def _answer(body: Any, uid: str, response: Obj) -> Obj:
    version = body.get("apiVersion") if isinstance(body, dict) else None
    return {
        "apiVersion": version if isinstance(version, str) else "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }


def _denied(message: str, code: int = 403) -> Obj:
    reason = "Forbidden" if code == 403 else "BadRequest"
    return {"allowed": False, "status": {"code": code, "reason": reason, "message": message}}


Mutator = Callable[[Obj, str, Lookups], None]
Validator = Callable[[Obj, Obj | None, Lookups], list[str]]


def _mutating(mutate: Mutator) -> Callable[[Obj, Lookups], Obj]:
    def handle(request: Obj, lookups: Lookups) -> Obj:
        obj = request.get("object")
        if request["operation"] not in ("CREATE", "UPDATE") or obj is None:
            return {"allowed": True}
        new = copy.deepcopy(obj)
        mutate(new, request.get("namespace") or _meta(new).get("namespace") or "", lookups)
        ops = json_patch(obj, new)
        if not ops:
            return {"allowed": True}
        patch = base64.b64encode(json.dumps(ops).encode()).decode()
        return {"allowed": True, "patchType": "JSONPatch", "patch": patch}

    return handle


def _validating(validate: Validator) -> Callable[[Obj, Lookups], Obj]:
    def handle(request: Obj, lookups: Lookups) -> Obj:
        obj = request.get("object")
        if request["operation"] not in ("CREATE", "UPDATE") or obj is None:
            return {"allowed": True}
        old = request.get("oldObject") if request["operation"] == "UPDATE" else None
        errors = validate(obj, old, lookups)
        return _denied(validation.aggregate(errors)) if errors else {"allowed": True}

    return handle


def _validate_job(obj: Obj, old: Obj | None, lookups: Lookups) -> list[str]:
    if old is None:
        return validation.validate_job_create(obj)
    ns = _meta(obj).get("namespace") or ""
    default = lookups.local_queue_exists(str(ns), api.DEFAULT_LOCAL_QUEUE)
    return validation.validate_job_update(old, obj, default)


def _validate_parent(obj: Obj, old: Obj | None, lookups: Lookups) -> list[str]:
    if old is None:
        return validation.validate_job_create(obj)
    status = old.get("status")
    ready = status.get("readyReplicas") if isinstance(status, dict) else 0
    ns = _meta(obj).get("namespace") or ""
    default = lookups.local_queue_exists(str(ns), api.DEFAULT_LOCAL_QUEUE)
    return validation.validate_job_update(old, obj, default, suspended=not ready)


ROUTES: dict[str, Callable[[Obj, Lookups], Obj]] = {
    MUTATE_JOB_PATH: _mutating(default_job),
    "/validate-batch-v1-job": _validating(_validate_job),
    "/mutate--v1-pod": _mutating(default_pod),
    "/validate--v1-pod": _validating(lambda o, old, _l: validation.validate_pod(o, old)),
    "/mutate-apps-v1-deployment": _mutating(
        lambda o, ns, lk: default_parent(o, ns, lk, "deployment")
    ),
    "/validate-apps-v1-deployment": _validating(_validate_parent),
    "/mutate-apps-v1-statefulset": _mutating(
        lambda o, ns, lk: default_parent(o, ns, lk, "statefulset")
    ),
    "/validate-apps-v1-statefulset": _validating(_validate_parent),
    "/validate-kueue-x-k8s-io-v1beta2-clusterqueue": _validating(
        lambda o, old, _l: validation.validate_cluster_queue(o, old)
    ),
    "/validate-kueue-x-k8s-io-v1beta2-cohort": _validating(
        lambda o, old, _l: validation.validate_cohort(o, old)
    ),
    "/validate-kueue-x-k8s-io-v1beta2-resourceflavor": _validating(
        lambda o, old, _l: validation.validate_resource_flavor(o, old)
    ),
    "/validate-kueue-x-k8s-io-v1beta2-workload": _validating(
        lambda o, old, _l: validation.validate_workload(o, old)
    ),
}


def review(path: str, body: Any, lookups: Lookups) -> Obj:
    """Answer an AdmissionReview on ``path``; never raises for a parsed body."""
    uid = ""
    if isinstance(body, dict) and isinstance(body.get("request"), dict):
        candidate = body["request"].get("uid")
        uid = candidate if isinstance(candidate, str) else ""
    try:
        request = _request(body)
        response = ROUTES[path](request, lookups)
    except ReviewError as exc:
        response = _denied(str(exc), 400)
    except RecursionError:
        response = _denied("the object nests too deeply", 400)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        response = _denied(f"malformed object: {type(exc).__name__}: {exc}"[:500], 400)
    return _answer(body, uid, response)


# -- the HTTP server ----------------------------------------------------------------------


# kube-apiserver's webhook client keeps idle connections 90 s (Go's IdleConnTimeout) and
# then reuses them; closing them sooner (uvicorn's default, 5 s) races that reuse and the
# API server reads EOF. controller-runtime's server never closes idle connections first.
KEEP_ALIVE_SECONDS = 120


class _TooLarge(Exception):
    pass


async def _read_json(request: Request) -> Any:
    """The body as JSON; _TooLarge (after draining it) beyond MAX_BODY; ValueError when
    it is not JSON."""
    declared = request.headers.get("content-length", "")
    size = 0
    chunks: list[bytes] = []
    too_large = declared.isdigit() and int(declared) > MAX_BODY
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            too_large = True
        if too_large:
            if size > _DRAIN_LIMIT:
                break
            continue
        chunks.append(chunk)
    if too_large:
        raise _TooLarge()
    return json.loads(b"".join(chunks))


def make_app(lookups: Lookups | None = None) -> Starlette:
    lk = lookups or Lookups()

    async def handle(request: Request) -> Response:
        try:
            body = await _read_json(request)
        except _TooLarge:
            return JSONResponse({"error": f"request body exceeds {MAX_BODY} bytes"}, 413)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            return JSONResponse({"error": f"body is not JSON: {str(exc)[:200]}"}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "body is not a JSON object"}, 400)
        path = request.url.path
        try:
            if path == CONVERT_PATH:
                answer = await asyncio.to_thread(conversion.review, body)
            else:
                answer = await asyncio.to_thread(review, path, body, lk)
            return JSONResponse(answer)
        except RecursionError:
            return JSONResponse({"error": "the body nests too deeply"}, 400)
        except Exception as exc:  # a bug must cost one request, not the controller
            _log.exception("%s failed", path)
            return JSONResponse({"error": f"could not answer: {type(exc).__name__}"}, 400)

    async def ok(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    routes = [Route(p, handle, methods=["POST"]) for p in (*ROUTES, CONVERT_PATH)]
    routes += [Route("/healthz", ok, methods=["GET"]), Route("/readyz", ok, methods=["GET"])]
    return Starlette(routes=routes)


def parse_bind(bind: str, flag: str = "--webhook-bind") -> tuple[str, int]:
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} must be HOST:PORT, got {bind!r}")
    return host, int(port)


def serve_in_thread(
    bind: str, cert_file: str, key_file: str, lookups: Lookups, stop: threading.Event
) -> uvicorn.Server:
    """Start the HTTPS webhook server on a daemon thread; returns once it listens."""
    host, port = parse_bind(bind)
    config = uvicorn.Config(
        make_app(lookups),
        host=host,
        port=port,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        log_level="warning",
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="kueue-webhook", daemon=True)
    thread.start()
    wait_for(
        lambda: server.started or not thread.is_alive(),
        10,
        f"the kueue webhook server on {bind}",
        interval=0.05,
        stop=stop,
    )
    if not server.started:
        raise RuntimeError(f"kueue webhook server did not start on {bind}")
    _log.info("kueue webhooks listening on https://%s", bind)
    return server
