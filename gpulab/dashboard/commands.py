"""`gpulab dashboard`: serve the live dashboard of a cluster on 127.0.0.1."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpulab.errors import CLIError

DEFAULT_PORT = 8700


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard", help="a live web page: GPUs, slices, queues, gangs and the call chain"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="default: $KUBECONFIG, the lab cluster")
    where.add_argument(
        "--cluster", help="a lab cluster by name (e.g. gpulab-hami): its state dir's kubeconfig"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port on 127.0.0.1")
    p.set_defaults(func=cmd_dashboard)


def kubeconfig_for(cluster: str | None, kubeconfig: str | None) -> Path | None:
    if cluster is None:
        return Path(kubeconfig) if kubeconfig else None
    from gpulab.state import cluster_dir

    path = cluster_dir(cluster) / "kubeconfig"
    if not path.exists():
        raise CLIError(f"no lab cluster {cluster!r} here ({path} is missing): `gpulab up` it first")
    return path


def cmd_dashboard(args: argparse.Namespace) -> int:
    from gpulab.dashboard import server
    from gpulab.dashboard.hub import Hub
    from gpulab.kube import api_client

    if not 1 <= args.port <= 65535:
        raise CLIError(f"--port {args.port}: use 1..65535")
    server.check_assets()
    api = api_client(kubeconfig_for(args.cluster, args.kubeconfig))
    url = str(api.configuration.host)
    hub = Hub(api, url).start()
    print(f"dashboard of {url} on http://127.0.0.1:{args.port}/ (Ctrl-C stops it)", flush=True)
    server.serve(hub, args.port)
    return 0
