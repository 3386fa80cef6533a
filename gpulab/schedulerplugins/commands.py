"""``gpulab scheduler``: scheduler-plugins' kube-scheduler, i.e. gpulab/framework with the
out-of-tree plugins registered next to the in-tree ones.

    gpulab scheduler --config scheduler-config.yaml [--kubeconfig K]

Mirrors scheduler-plugins v0.35.4-devel ``cmd/scheduler/main.go``
(``app.NewSchedulerCommand(app.WithPlugin(...))``) and kube-scheduler's ``--config`` flag:
the file is a KubeSchedulerConfiguration whose profiles pick the plugins
(``manifests/scheduling/scheduler-config.yaml``).
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

    return {**in_tree_registry()}


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
