"""The visibility API: pending Workloads of a ClusterQueue or LocalQueue, in queue order.

Mirrors kubernetes-sigs/kueue v0.19.2 pkg/visibility (server.go, storage/*.go) and
apis/visibility/v1beta2: group ``visibility.kueue.x-k8s.io``, versions v1beta2 (preferred)
and v1beta1 (same shape), resources ``clusterqueues/pendingworkloads`` (cluster scoped)
and ``localqueues/pendingworkloads`` (namespaced) returning a ``PendingWorkloadsSummary``
whose items carry ``priority``, ``localQueueName``, ``positionInClusterQueue`` and
``positionInLocalQueue``; query parameters ``limit`` (default 1000, at most 100,000) and
``offset`` (default 0). The positions come from the queue manager's ``Snapshot``: heap,
inadmissible and in-flight Workloads sorted by the heap's order (queue.py).

Served as an aggregated API on :8082 behind the ``v1beta2``/``v1beta1`` APIServices, as
upstream's: kube-apiserver proxies the request with its front-proxy client certificate and
the ``X-Remote-User``/``X-Remote-Group`` headers, which are trusted only with a
certificate signed by the ``requestheader-client-ca-file`` of ConfigMap
``kube-system/extension-apiserver-authentication``; a SubjectAccessReview then authorizes
the user (upstream's delegated authentication and authorization). Lab differences: stdlib
HTTPS server instead of k8s.io/apiserver's generic server (no bearer-token authentication,
no OpenAPI, no watch); the request-header CA is read once at start.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kubernetes import client

from gpulab.kueue.model import WorkloadInfo
from gpulab.kueue.queue import Manager as QueueManager

_log = logging.getLogger("gpulab.kueue.visibility")

GROUP = "visibility.kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # PrioritizedVersions
DEFAULT_LIMIT = 1000  # constants.DefaultPendingWorkloadsLimit
MAX_LIMIT = 100_000  # constants.MaxPendingWorkloadsLimit
DEFAULT_BIND_PORT = 8082  # configapi.DefaultVisibilityBindPort
KEEP_ALIVE_SECONDS = 120  # longer than the API server's 90 s idle timeout (see webhook.py)
MAX_DRAINED_BODY = 1 << 20  # a request body read (and dropped) to keep the connection usable
INT64 = 1 << 63

Obj = dict[str, Any]
# (user, groups, extra, verb, group, version, resource, subresource, namespace, name) -> allowed
Authorizer = Callable[[str, list[str], dict[str, list[str]], Mapping[str, str]], bool]

_PATH = re.compile(
    rf"^/apis/{re.escape(GROUP)}/(?P<version>v1beta[12])/"
    r"(?:namespaces/(?P<namespace>[^/]+)/)?(?P<resource>clusterqueues|localqueues)/"
    r"(?P<name>[^/]+)/pendingworkloads$"
)


def bounded_limit_offset(limit: int, offset: int) -> tuple[int, int]:
    """boundedLimitOffset."""
    return min(max(limit, 0), MAX_LIMIT), max(offset, 0)


def _pending_workload(wl: WorkloadInfo, position_in_lq: int, position_in_cq: int) -> Obj:
    """newPendingWorkload."""
    meta = wl.obj.get("metadata") or {}
    owners = [
        {k: ref[k] for k in ("apiVersion", "kind", "name", "uid") if k in ref}
        for ref in meta.get("ownerReferences") or []
    ]
    out_meta: Obj = {"name": wl.name, "namespace": wl.namespace}
    if owners:
        out_meta["ownerReferences"] = owners
    out_meta["creationTimestamp"] = meta.get("creationTimestamp")
    return {
        "metadata": out_meta,
        "priority": int((wl.obj.get("spec") or {}).get("priority") or 0),
        "localQueueName": wl.queue_name,
        "positionInClusterQueue": position_in_cq,
        "positionInLocalQueue": position_in_lq,
    }


def _summary(version: str, items: list[Obj]) -> Obj:
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {},
        "items": items,
    }


def pending_in_cluster_queue(
    snapshot: list[WorkloadInfo], limit: int = DEFAULT_LIMIT, offset: int = 0
) -> list[Obj]:
    """pendingWorkloadsInCqREST.Get over the ClusterQueue's Snapshot."""
    limit, offset = bounded_limit_offset(limit, offset)
    items: list[Obj] = []
    lq_positions: dict[str, int] = {}
    for index, wl in enumerate(snapshot[: offset + limit]):
        lq = f"{wl.namespace}/{wl.queue_name}"
        position_in_lq = lq_positions.get(lq, 0)
        lq_positions[lq] = position_in_lq + 1
        if index >= offset:
            items.append(_pending_workload(wl, position_in_lq, index))
    return items


def pending_in_local_queue(
    snapshot: list[WorkloadInfo],
    namespace: str,
    name: str,
    limit: int = DEFAULT_LIMIT,
    offset: int = 0,
) -> list[Obj]:
    """pendingWorkloadsInLqREST.Get: the LocalQueue's Workloads of its ClusterQueue's
    Snapshot, positionInClusterQueue still counted over the whole ClusterQueue."""
    limit, offset = bounded_limit_offset(limit, offset)
    items: list[Obj] = []
    skipped = 0
    for index, wl in enumerate(snapshot):
        if len(items) >= limit:
            break
        if wl.namespace == namespace and wl.queue_name == name:
            if skipped < offset:
                skipped += 1
            else:
                items.append(_pending_workload(wl, len(items) + offset, index))
    return items


def go_quote(text: str) -> str:
    """Go's strconv.Quote (``%q``), which upstream's messages use for names and values:
    printable runes as they are, the rest escaped; a byte that was not UTF-8 (decoded with
    surrogateescape) as ``\\xNN``."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\a\b\f\n\r\t\v":
            out.append("\\" + "abfnrtv"["\a\b\f\n\r\t\v".index(ch)])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out) + '"'


class BadRequest(ValueError):
    """A query parameter upstream's parameter codec refuses (HTTP 400)."""


def parse_int64(value: str) -> int:
    """runtime.Convert_Slice_string_To_int64: strconv.ParseInt(value, 10, 64), with its
    error text. Python's int() would also take spaces, underscores, non-ASCII digits and
    refuse more than 4,300 digits with its own text."""
    digits = value[1:] if value[:1] in ("+", "-") else value
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise BadRequest(f"strconv.ParseInt: parsing {go_quote(value)}: invalid syntax")
    if len(digits.lstrip("0")) > 19 or not -INT64 <= int(value) < INT64:
        raise BadRequest(f"strconv.ParseInt: parsing {go_quote(value)}: value out of range")
    return int(value)


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _resources() -> list[Obj]:
    def resource(name: str, singular: str, namespaced: bool) -> list[Obj]:
        kind = "PendingWorkloadsSummary"
        return [
            {
                "name": name,
                "singularName": singular,
                "namespaced": namespaced,
                "kind": kind,
                "verbs": [],
            },
            {
                "name": f"{name}/pendingworkloads",
                "singularName": "",
                "namespaced": namespaced,
                "kind": kind,
                "verbs": ["get"],
            },
        ]

    return [
        *resource("clusterqueues", "clusterqueue", False),
        *resource("localqueues", "localqueue", True),
    ]


def discovery(path: str) -> Obj | None:
    """/apis, /apis/<group>, /apis/<group>/<version>: what kube-apiserver's aggregator and
    its availability check read."""
    versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in VERSIONS]
    group = {"name": GROUP, "versions": versions, "preferredVersion": versions[0]}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}
    if path == f"/apis/{GROUP}":
        return {"kind": "APIGroup", "apiVersion": "v1", **group}
    for v in VERSIONS:
        if path == f"/apis/{GROUP}/{v}":
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{GROUP}/{v}",
                "resources": _resources(),
            }
    return None


@dataclass
class Request:
    """One authenticated request (the front proxy's headers)."""

    user: str
    groups: list[str]
    extra: dict[str, list[str]]


def handle(
    queues: QueueManager, method: str, url: str, request: Request, authorize: Authorizer
) -> tuple[int, Obj]:
    """The visibility API's answer (status code, JSON body) to one request."""
    parts = urlsplit(url)
    # Go serves URL.Path, the decoded path: a name's %-escapes are its characters
    path = unquote(parts.path, errors="surrogateescape").rstrip("/") or "/"
    if method != "GET":
        return 405, _status(405, "MethodNotAllowed", f"{method} is not supported")
    found = discovery(path)
    if found is not None:
        return 200, found
    match = _PATH.match(path)
    if match is None or (match["resource"] == "localqueues") != (match["namespace"] is not None):
        return 404, _status(404, "NotFound", "the server could not find the requested resource")
    resource, name, ns = match["resource"], match["name"], match["namespace"] or ""
    attrs = {
        "verb": "get",
        "group": GROUP,
        "version": match["version"],
        "resource": resource,
        "subresource": "pendingworkloads",
        "namespace": ns,
        "name": name,
    }
    if not authorize(request.user, request.groups, request.extra, attrs):
        message = (
            f"{resource}.{GROUP} {go_quote(name)} is forbidden: User {go_quote(request.user)} "
            f'cannot get resource "{resource}/pendingworkloads" in API group "{GROUP}"'
            + (f" in the namespace {go_quote(ns)}" if ns else " at the cluster scope")
        )
        return 403, _status(403, "Forbidden", message)
    # url.Values keeps a blank value ("limit=" is ParseInt(""), refused); the first wins
    query = parse_qs(parts.query, keep_blank_values=True, errors="surrogateescape")
    try:
        limit = parse_int64(query.get("limit", ["0"])[0]) or DEFAULT_LIMIT  # SetDefaults
        offset = parse_int64(query.get("offset", ["0"])[0])
    except BadRequest as exc:
        return 400, _status(400, "BadRequest", str(exc))
    not_found = f"{resource[:-1]}.{GROUP} {go_quote(name)} not found"  # errors.NewNotFound
    if resource == "clusterqueues":
        snapshot = queues.pending_workloads_info(name)
        if snapshot is None:
            return 404, _status(404, "NotFound", not_found)
        items = pending_in_cluster_queue(snapshot, limit, offset)
    else:
        cq = queues.cluster_queue_for(ns, name)
        snapshot = queues.pending_workloads_info(cq) if cq is not None else None
        if cq is None:
            return 404, _status(404, "NotFound", not_found)
        items = pending_in_local_queue(snapshot or [], ns, name, limit, offset)
    return 200, _summary(match["version"], items)


def subject_access_review(api: client.ApiClient) -> Authorizer:
    """Delegated authorization: a SubjectAccessReview per request (system:masters is
    always allowed, as k8s.io/apiserver's delegating authorizer does)."""
    authz = client.AuthorizationV1Api(api)

    def authorize(
        user: str, groups: list[str], extra: dict[str, list[str]], attrs: Mapping[str, str]
    ) -> bool:
        if "system:masters" in groups:
            return True
        body = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user,
                groups=groups,
                extra=extra or None,
                resource_attributes=client.V1ResourceAttributes(**attrs),
            )
        )
        return bool(authz.create_subject_access_review(body).status.allowed)

    return authorize


def request_header_config(api: client.ApiClient) -> tuple[str, list[str]]:
    """(CA bundle, allowed names) of the front proxy, from the ConfigMap kube-apiserver
    publishes (upstream reads it through the RoleBinding to
    extension-apiserver-authentication-reader)."""
    cm = client.CoreV1Api(api).read_namespaced_config_map(
        "extension-apiserver-authentication", "kube-system"
    )
    data = cm.data or {}
    ca = data.get("requestheader-client-ca-file", "")
    names = json.loads(data.get("requestheader-allowed-names") or "[]")
    return ca, names


def _headers_identity(headers: Mapping[str, str], all_headers: list[tuple[str, str]]) -> Request:
    user = headers.get("X-Remote-User", "")
    groups = [v for k, v in all_headers if k.lower() == "x-remote-group"]
    extra: dict[str, list[str]] = {}
    for k, v in all_headers:
        if k.lower().startswith("x-remote-extra-"):
            extra.setdefault(k[len("X-Remote-Extra-") :].lower(), []).append(v)
    return Request(user, groups, extra)


def serve_in_thread(
    queues: QueueManager,
    host: str,
    port: int,
    cert_file: str,
    key_file: str,
    client_ca: str,
    allowed_names: list[str],
    authorize: Authorizer,
) -> ThreadingHTTPServer:
    """Start the HTTPS visibility server on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = KEEP_ALIVE_SECONDS
        # headers and body go out in two writes: with Nagle's algorithm the body waits for
        # the client's delayed ACK of the headers, 40 ms per answer on a kept-alive connection
        disable_nagle_algorithm = True

        # every method gets a Status, as kube-apiserver's handler chain answers it:
        # http.server's own answer to a method without a do_ method is a 501 in HTML
        def do_GET(self) -> None:
            self._answer("GET")

        def do_HEAD(self) -> None:
            self._answer("HEAD")

        def do_POST(self) -> None:
            self._answer("POST")

        def do_PUT(self) -> None:
            self._answer("PUT")

        def do_PATCH(self) -> None:
            self._answer("PATCH")

        def do_DELETE(self) -> None:
            self._answer("DELETE")

        def do_OPTIONS(self) -> None:
            self._answer("OPTIONS")

        def log_message(self, format: str, *args: Any) -> None:
            _log.debug(format, *args)

        def _drain(self) -> None:
            """Read the request's body, which no route uses: left unread, its bytes would
            be parsed as the next request on this keep-alive connection."""
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if "Transfer-Encoding" in self.headers or not 0 <= length <= MAX_DRAINED_BODY:
                self.close_connection = True
            elif length:
                self.rfile.read(length)

        def _answer(self, method: str) -> None:
            self._drain()
            identity = self._authenticate()
            if identity is None:
                code, body = 401, _status(401, "Unauthorized", "Unauthorized")
            else:
                try:
                    code, body = handle(queues, method, self.path, identity, authorize)
                except Exception as exc:  # an API error (the SubjectAccessReview) is a 500
                    _log.warning("visibility %s: %s", self.path, exc)
                    code, body = 500, _status(500, "InternalError", str(exc))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if method != "HEAD":
                self.wfile.write(data)

        def _authenticate(self) -> Request | None:
            """requestheader authentication: the front proxy's verified certificate,
            then its identity headers."""
            conn = self.connection
            cert = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
            if not cert:
                return None
            cn = next(
                (v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), ""
            )
            if allowed_names and cn not in allowed_names:
                return None
            identity = _headers_identity(self.headers, list(self.headers.items()))
            return identity if identity.user else None

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_file, key_file)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=client_ca)
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    # the handshake runs on the handler's thread (its first read), not on accept()'s
    server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="kueue-visibility", daemon=True).start()
    _log.info("kueue visibility API listening on https://%s:%d", host, port)
    return server
