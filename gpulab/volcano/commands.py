"""The three Volcano binaries as gpulab subcommands, with upstream's flags.

    gpulab vc-scheduler --scheduler-conf=/volcano.scheduler/volcano-scheduler.conf ...
    gpulab vc-controller-manager ...
    gpulab vc-webhook-manager --tls-cert-file=... --tls-private-key-file=... ...

Mirror volcano-sh/volcano v1.15.1 ``cmd/scheduler``, ``cmd/controller-manager`` and
``cmd/webhook-manager`` (``app/options``: flag names and defaults; ``app/server.go``: the
health and metrics servers, then the component until SIGTERM). Addresses default to all
interfaces as upstream's (``:8080``, ``:11251``); the lab's manifests give ``0.0.0.0:PORT``
so the local backend's pod runner binds each pod to its own address.

Lab differences: ``--schedule-period`` takes a Go duration (``1s``, ``500ms``) as upstream
but only the flags listed here exist; no leader election, no cache dumper or pprof.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from gpulab.errors import CLIError

_log = logging.getLogger(__name__)


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = subparsers.add_parser(
        "vc-scheduler",
        help="run Volcano's scheduler (sessions: enqueue, allocate, backfill, reclaim, ...)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--kubeconfig", default=None, help="default: in-cluster, else the lab's")
    s.add_argument("--scheduler-conf", default="", help="the scheduler configuration file")
    s.add_argument("--schedule-period", default="1s", help="time between sessions (1s)")
    s.add_argument(
        "--scheduler-name", action="append", default=None, help="pods to schedule (volcano)"
    )
    s.add_argument("--default-queue", default="default", help="queue of a PodGroup without one")
    s.add_argument("--listen-address", default=":8080", help="metrics address (:8080)")
    s.add_argument("--healthz-address", default=":11251", help="health address (:11251)")
    s.add_argument("--enable-healthz", type=_bool, default=False)
    s.add_argument("--enable-metrics", type=_bool, default=False)
    s.add_argument("--leader-elect", type=_bool, default=False, help="(accepted; not used)")
    s.set_defaults(func=run_scheduler)

    c = subparsers.add_parser(
        "vc-controller-manager",
        help="run Volcano's job, PodGroup and queue controllers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("--kubeconfig", default=None, help="default: in-cluster, else the lab's")
    c.add_argument(
        "--worker-threads", type=int, default=3, help="job controller workers (3), one queue each"
    )
    c.add_argument(
        "--worker-threads-for-podgroup", type=int, default=5, help="PodGroup controller workers (5)"
    )
    c.add_argument(
        "--scheduler-name",
        action="append",
        default=None,
        help="pods whose schedulerName gets a PodGroup (volcano); repeatable",
    )
    c.add_argument(
        "--inherit-owner-annotations",
        type=_bool,
        default=True,
        help="PodGroups take their pods' owners' volcano.sh/ annotations (true)",
    )
    c.add_argument("--listen-address", default=":8081", help="metrics address (:8081)")
    c.add_argument("--healthz-address", default=":11251", help="health address (:11251)")
    c.add_argument("--enable-healthz", type=_bool, default=False)
    c.add_argument("--enable-metrics", type=_bool, default=False)
    c.add_argument("--leader-elect", type=_bool, default=False, help="(accepted; not used)")
    c.set_defaults(func=run_controller_manager)

    w = subparsers.add_parser(
        "vc-webhook-manager",
        help="run Volcano's admission webhooks (vcjobs, PodGroups, queues)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("--kubeconfig", default=None, help="default: in-cluster, else the lab's")
    w.add_argument("--tls-cert-file", required=True, help="serving certificate (PEM)")
    w.add_argument("--tls-private-key-file", required=True, help="its private key (PEM)")
    w.add_argument("--listen-address", default="", help="address to listen on (all)")
    w.add_argument("--port", type=int, default=8443, help="port (8443)")
    w.add_argument(
        "--enabled-admission",
        default="/jobs/mutate,/jobs/validate,/podgroups/validate,/queues/mutate,/queues/validate",
        help="comma-separated admission paths to serve",
    )
    w.add_argument("--scheduler-name", default="volcano", help="default schedulerName of vcjobs")
    w.set_defaults(func=run_webhook_manager)


def _bool(value: str) -> bool:
    if value.lower() in ("1", "t", "true"):
        return True
    if value.lower() in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _until_signalled() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _serve(bind: str, flag: str, routes: list) -> None:
    from gpulab.hami.server import StartError
    from gpulab.volcano.server import serve

    try:
        serve(bind, flag, routes)
    except StartError as exc:
        raise CLIError(str(exc)) from exc


def run_scheduler(args: argparse.Namespace) -> int:
    from pathlib import Path

    from starlette.routing import Route

    from gpulab.kube import api_client
    from gpulab.trace import Tracer
    from gpulab.volcano.controllers.job.helpers import parse_duration
    from gpulab.volcano.scheduler.cache import SchedulerCache
    from gpulab.volcano.scheduler.scheduler import Scheduler
    from gpulab.volcano.server import healthz, metrics

    try:
        period = parse_duration(args.schedule_period)
    except ValueError as exc:
        raise CLIError(f"--schedule-period: {exc}") from exc
    names = tuple(args.scheduler_name or ["volcano"])
    api = api_client(args.kubeconfig)
    tracer = Tracer(names[0], api)
    cache = SchedulerCache(api, tracer, names, args.default_queue)
    conf = Path(args.scheduler_conf) if args.scheduler_conf else None
    scheduler = Scheduler(cache, tracer, conf, period)
    ready = threading.Event()
    if args.enable_healthz:
        _serve(args.healthz_address, "--healthz-address", [Route("/healthz", healthz(ready))])
    if args.enable_metrics:
        _serve(
            args.listen_address,
            "--listen-address",
            [Route("/metrics", metrics(scheduler.metrics.registry))],
        )
    stop = _until_signalled()
    scheduler.on_session = lambda _ssn, _s: ready.set()
    try:
        scheduler.run(stop)
    finally:
        cache.stop()
        tracer.flush(timeout=2)
    return 0


def run_controller_manager(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry
    from starlette.routing import Route

    from gpulab.kube import api_client
    from gpulab.trace import Tracer
    from gpulab.volcano.controllers.job.job_controller import JobController
    from gpulab.volcano.controllers.podgroup import PodGroupController
    from gpulab.volcano.controllers.queue import QueueController
    from gpulab.volcano.server import healthz, metrics

    api = api_client(args.kubeconfig)
    tracer = Tracer("vc-controller-manager", api)
    registry = CollectorRegistry()
    controllers = [
        JobController(api, tracer, args.worker_threads),
        PodGroupController(
            api,
            tracer,
            tuple(args.scheduler_name or ["volcano"]),
            args.worker_threads_for_podgroup,
            args.inherit_owner_annotations,
        ),
        QueueController(api, tracer, registry),
    ]
    ready = threading.Event()
    if args.enable_healthz:
        _serve(args.healthz_address, "--healthz-address", [Route("/healthz", healthz(ready))])
    if args.enable_metrics:
        _serve(args.listen_address, "--listen-address", [Route("/metrics", metrics(registry))])
    stop = _until_signalled()
    threads = [threading.Thread(target=c.run, args=(stop,), daemon=True) for c in controllers]
    for t in threads:
        t.start()
    while not stop.wait(0.2):
        if not ready.is_set() and all(c.has_synced() for c in controllers):
            ready.set()
            tracer.step(
                "Run", None, "job, PodGroup and queue controllers started; informers synced"
            )
    tracer.flush(timeout=2)
    return 0


def run_webhook_manager(args: argparse.Namespace) -> int:
    from gpulab.hami.server import StartError
    from gpulab.informer import Informer, ListWatch
    from gpulab.kube import api_client
    from gpulab.trace import Tracer
    from gpulab.volcano import apis
    from gpulab.volcano.server import serve
    from gpulab.volcano.webhooks.server import Admission, routes

    api = api_client(args.kubeconfig)
    tracer = Tracer("vc-webhook-manager", api)
    queues = Informer(ListWatch(api, apis.QUEUES), name="informer-webhook-queues").start()
    ready = threading.Event()
    admission = Admission(queues.store, tracer, args.scheduler_name)
    enabled = [p.strip() for p in args.enabled_admission.split(",") if p.strip()]
    try:
        app_routes = routes(admission, enabled, ready)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    bind = f"{args.listen_address or '0.0.0.0'}:{args.port}"
    try:
        serve(bind, "--port", app_routes, args.tls_cert_file, args.tls_private_key_file)
    except StartError as exc:
        raise CLIError(str(exc)) from exc
    stop = _until_signalled()
    if queues.wait_for_sync(60):
        ready.set()
        tracer.step("Run", None, f"admission on :{args.port}: {', '.join(enabled)}")
    stop.wait()
    queues.stop()
    tracer.flush(timeout=2)
    return 0
