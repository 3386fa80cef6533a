"""Start-up of the extender process, in the order of HAMi's ``start()``.

Mirrors Project-HAMi/HAMi v2.10.0 ``cmd/scheduler/main.go`` ``start``: Kubernetes client →
device config (read by ``commands.py``) → ``NewScheduler`` → ``RegisterFromNodeAnnotations``
in the background → ``sher.Start()`` (informers, wait for sync; the Event recorder) →
metrics server → router → HTTP, or HTTPS with a certificate watcher (``certwatcher``): the
certificate files are re-read when they change, without a restart. Leader election and
``--profiling`` are not part of the lab (one replica, always the leader).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import hashlib
import logging
import os
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import start_http_server

from gpulab.hami.cluster import ClusterError, KubeCluster, start_informers
from gpulab.hami.config import go_duration_string
from gpulab.hami.events import SchedulerEvents
from gpulab.hami.metrics import ExtenderMetrics
from gpulab.hami.routes import build_app
from gpulab.hami.scheduler import REGISTER_PERIOD, Scheduler, SchedulerConfig
from gpulab.hami.webhook import WebhookConfig
from gpulab.kube import api_client
from gpulab.trace import ObjectRef

_log = logging.getLogger(__name__)

INFORMER_SYNC = 60.0  # seconds to wait for the pod, node and quota informers to list
# uvicorn as the extender runs it (the benchmark serves the app the same way):
# - no access log line per request (kube-scheduler calls /filter for every pod);
# - idle kept-alive connections stay open longer than Go clients keep them (http.Transport's
#   IdleConnTimeout, 90 s): uvicorn's default closes them after 5 s, and a request the API
#   server (webhook) or kube-scheduler sends on a connection just as it closes fails with
#   EOF, not retried for a POST; a webhook call so lost admits the pod unmutated
#   (failurePolicy Ignore). Upstream's Go server never closes idle connections.
UVICORN: dict[str, Any] = {
    "log_level": "warning",
    "access_log": False,
    "lifespan": "off",
    "timeout_keep_alive": 120,
}


class StartError(RuntimeError):
    """Start-up cannot go on (port in use, unreadable certificate): one line for the user."""


@dataclass(frozen=True)
class ServerOptions:
    kubeconfig: str | None
    http_bind: tuple[str, int]
    metrics_bind: tuple[str, int]
    cert_file: str | None
    key_file: str | None
    scheduler: SchedulerConfig
    webhook: WebhookConfig
    legacy_metrics: bool = False
    flags: tuple[str, ...] = ()  # the flags set, as typed (--name=value)
    device_config_file: str = ""


def parse_bind(value: str, flag: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise StartError(f"{flag} {value!r}: expected HOST:PORT or :PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def listen(addr: tuple[str, int], flag: str) -> socket.socket:
    """Bind now, so a port in use is one clear line instead of a traceback.

    The socket says it is TCP (``IPPROTO_TCP``): only then does asyncio set TCP_NODELAY on
    the connections it accepts. Without it a response's body waits for the ACK of its
    headers, and a kept-alive client (kube-scheduler) waits out a 40 ms delayed ACK on
    every request."""
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartError(
                f"port {port} on {host} is already in use: stop the process listening there "
                f"(ss -ltnp 'sport = :{port}') or pass {flag} {host}:<free port>"
            ) from exc
        raise StartError(f"cannot listen on {host}:{port} ({flag}): {exc.strerror}") from exc
    return sock


class CertReloader:
    """An SSLContext whose certificate follows the files (controller-runtime certwatcher)."""

    def __init__(self, cert_file: str, key_file: str, interval: float = 2.0) -> None:
        self.cert_file, self.key_file, self.interval = cert_file, key_file, interval
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._stamp = self._fingerprint()
        self._load()

    def _fingerprint(self) -> bytes:
        """The files' contents: mtimes can be too coarse to see a quick rewrite."""
        try:
            with open(self.cert_file, "rb") as c, open(self.key_file, "rb") as k:
                return hashlib.sha256(c.read() + b"\0" + k.read()).digest()
        except OSError as exc:
            raise StartError(f"cannot read certificate: {exc}") from exc

    def _load(self) -> None:
        try:
            # Loading into the live context serves the new pair on the next handshake.
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise StartError(f"cannot load {self.cert_file} / {self.key_file}: {exc}") from exc

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate was loaded."""
        stamp = self._fingerprint()
        if stamp == self._stamp:
            return False
        self._load()
        self._stamp = stamp
        _log.info("certificate %s reloaded", self.cert_file)
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            try:
                self.check()
            except StartError as exc:  # half-written files: keep the old pair, retry
                _log.warning("%s", exc)


def tune_gc() -> None:
    """Once the caches are built: collect, then move every object alive now out of the
    cyclic collector's sight (``gc.freeze``). The informer stores and the scheduler's
    books are long-lived and free of cycles; without this each full collection walks all
    of them (tens of ms at 500 nodes), a pause that lands on whichever request runs then.
    Objects still die by reference counting as usual."""
    gc.collect()
    gc.freeze()


def _thread(target: object, *args: object, name: str) -> None:
    threading.Thread(target=target, args=args, name=name, daemon=True).start()  # type: ignore[arg-type]


def registered_routes(app: Any) -> str:
    """The router's table as httprouter's ``router.POST(...)`` calls build it (Starlette
    adds HEAD to each GET route; httprouter does not)."""
    return ", ".join(
        f"{method} {route.path}"
        for route in app.routes
        for method in sorted(set(getattr(route, "methods", None) or ()) - {"HEAD"})
    )


def own_pod(env: Mapping[str, str]) -> ObjectRef | None:
    """The extender's Pod (POD_NAME, POD_NAMESPACE from the downward API): its start-up
    steps are Events on it. None outside a pod: the steps are log lines only."""
    name, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
    return ObjectRef("Pod", name, namespace) if name and namespace else None


def start(opts: ServerOptions) -> None:
    """Run the extender until interrupted, in the order of ``start()``; each step of it is
    a trace step on the extender's own Pod (the seed chapter's start-up, visible)."""
    http_sock = listen(opts.http_bind, "--http_bind")
    api = api_client(opts.kubeconfig)
    hostname = socket.gethostname()
    events = SchedulerEvents(api, f"hami-scheduler-{hostname}")
    me = own_pod(os.environ)

    def step(name: str, message: str) -> None:
        events.trace.step(name, me, message)

    cfg, nvidia = opts.scheduler, opts.scheduler.nvidia
    step("PrintPFlags", " ".join(opts.flags) + " (the other flags at their defaults)")
    step("NodeLockTimeout", f"Set node lock timeout {go_duration_string(cfg.node_lock_timeout)}")
    step("InitGlobalClient", f"Kubernetes client for {api.configuration.host}")
    cluster = KubeCluster(api)
    step(
        "InitDevices",
        f"{Path(opts.device_config_file).name}: {nvidia.resource_count_name}, "
        f"{nvidia.resource_memory_name}, {nvidia.resource_core_name}; "
        f"deviceSplitCount {nvidia.device_split_count}",
    )
    step("Hostname", f"{hostname} (the leader-election identity; the lab runs one replica)")
    stop = threading.Event()
    scheduler = Scheduler(cluster, cfg, events)
    step(
        "NewScheduler",
        f"schedulerName {cfg.scheduler_name}: nodes {cfg.node_policy}, GPUs {cfg.gpu_policy}",
    )
    _thread(scheduler.run_register_loop, stop, name="register-nodes")
    step(
        "RegisterFromNodeAnnotations",
        f"in the background: on node add/delete and every {REGISTER_PERIOD:g}s",
    )
    try:
        listers, informers = start_informers(api, scheduler, INFORMER_SYNC)
    except ClusterError as exc:
        http_sock.close()
        raise StartError(str(exc)) from exc
    scheduler.attach(listers)
    tune_gc()  # the informer stores hold every pod and node now
    step(
        "Start",
        "informers synced: "
        + ", ".join(f"{len(inf.store)} {inf.lw.resource.plural}" for inf in informers),
    )

    metrics = ExtenderMetrics(scheduler, legacy=opts.legacy_metrics)
    host, port = opts.metrics_bind
    try:
        start_http_server(port, host, registry=metrics.registry)
    except OSError as exc:
        http_sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartError(
                f"metrics port {port} on {host} is already in use: pass --metrics-bind-address "
                f"{host}:<free port>"
            ) from exc
        raise StartError(f"cannot serve metrics on {host}:{port}: {exc}") from exc

    step("initMetrics", f"Prometheus metrics on {host}:{port}")

    app = build_app(scheduler, opts.webhook, metrics)
    step("httprouter", f"routes registered: {registered_routes(app)}")
    tls = bool(opts.cert_file and opts.key_file)
    config = uvicorn.Config(
        app,
        **UVICORN,
        ssl_certfile=opts.cert_file if tls else None,
        ssl_keyfile=opts.key_file if tls else None,
    )
    config.load()
    if tls:
        assert opts.cert_file and opts.key_file
        reloader = CertReloader(opts.cert_file, opts.key_file)
        config.ssl = reloader.context
        _thread(reloader.run, stop, name="cert-watcher")
    scheme = "https" if tls else "http"
    step(
        "ListenAndServeTLS" if tls else "ListenAndServe",
        f"{scheme}://{opts.http_bind[0]}:{opts.http_bind[1]}"
        + (" (certwatcher: the certificate is reloaded when its files change)" if tls else ""),
    )
    _log.info(
        "hami-scheduler extender on %s://%s:%d (metrics on %s:%d)",
        scheme,
        *opts.http_bind,
        host,
        port,
    )
    try:
        asyncio.run(uvicorn.Server(config).serve(sockets=[http_sock]))
    finally:
        stop.set()
        scheduler.stop.set()
        for inf in informers:
            inf.stop()
