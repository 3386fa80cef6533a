"""scheduler-plugins' two binaries as gpulab commands.

    gpulab scheduler --config scheduler-config.yaml [--kubeconfig K] [--healthz-bind H:P]
    gpulab podgroup-controller [--kubeconfig K]

``scheduler`` mirrors scheduler-plugins v0.35.4-devel ``cmd/scheduler/main.go``
(``app.NewSchedulerCommand(app.WithPlugin(...))``: gpulab/framework with Coscheduling and
NodeResourceTopologyMatch registered next to the in-tree plugins) and kube-scheduler's
``--config`` flag: the file is a KubeSchedulerConfiguration whose profiles pick the
plugins (``manifests/scheduling/scheduler-config.yaml``). ``podgroup-controller`` mirrors
``cmd/controller`` (the PodGroup status controller).
"""

from __future__ import annotations

import argparse
import signal
import threading

from gpulab.framework.runtime import Registry

COMPONENT = "gpulab-scheduler"


def registry() -> Registry:
    """The in-tree plugins plus scheduler-plugins' (the scheduler binary's registry)."""
    from gpulab.framework.plugins import in_tree_registry
    from gpulab.schedulerplugins.coscheduling import coscheduling
    from gpulab.schedulerplugins.noderesourcetopology import plugin as noderesourcetopology

    return {
        **in_tree_registry(),
        coscheduling.NAME: coscheduling.new,
        noderesourcetopology.NAME: noderesourcetopology.new,
    }


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "scheduler",
        help="run gpulab-scheduler (kube-scheduler's framework + scheduler-plugins)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, help="KubeSchedulerConfiguration file")
    p.add_argument("--kubeconfig", default=None, help="default: clientConnection.kubeconfig")
    p.add_argument(
        "--healthz-bind",
        default="0.0.0.0:10259",
        help="HOST:PORT of /healthz and /readyz (plain HTTP; default 0.0.0.0:10259)",
    )
    p.set_defaults(func=run_scheduler)
    c = subparsers.add_parser(
        "podgroup-controller",
        help="run the PodGroup status controller (scheduler-plugins' controller)",
    )
    c.add_argument("--kubeconfig", default=None, help="default: in-cluster or local cluster")
    c.set_defaults(func=run_podgroup_controller)


def run_scheduler(args: argparse.Namespace) -> int:
    from gpulab.errors import CLIError
    from gpulab.framework import config
    from gpulab.framework.runtime import FrameworkError
    from gpulab.framework.scheduler import SchedulerProcess, serve_healthz
    from gpulab.hami.server import StartError, listen, parse_bind
    from gpulab.kube import api_client

    try:
        sock = listen(parse_bind(args.healthz_bind, "--healthz-bind"), "--healthz-bind")
    except StartError as exc:
        raise CLIError(str(exc)) from exc
    cfg = config.load(args.config)
    api = api_client(args.kubeconfig or cfg.kubeconfig)
    try:
        process = SchedulerProcess(cfg, registry(), api, COMPONENT)
    except FrameworkError as exc:
        raise CLIError(f"{args.config}: {exc}") from exc
    serve_healthz(sock, process.ready)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: process.stop())
    runner = threading.Thread(target=process.run, name="scheduler", daemon=True)
    runner.start()
    while runner.is_alive() and not process.stop_event.wait(1.0):
        pass
    process.stop()
    return 0


def run_podgroup_controller(args: argparse.Namespace) -> int:
    from gpulab.kube import api_client
    from gpulab.schedulerplugins.controllers.podgroup import COMPONENT, PodGroupController
    from gpulab.trace import Tracer

    api = api_client(args.kubeconfig)
    tracer = Tracer(COMPONENT, api)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        PodGroupController(api, tracer).run(stop)
    finally:
        tracer.flush(timeout=2)
    return 0
