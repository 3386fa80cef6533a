"""``gpulab topology-updater``: nfd-topology-updater for one node (see updater.py)."""

from __future__ import annotations

import argparse
import signal
import threading

from gpulab.errors import CLIError


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "topology-updater",
        help="publish a node's NUMA zones as a NodeResourceTopology (nfd-topology-updater)",
    )
    p.add_argument("--node-name", required=True, help="the node whose zones to publish")
    p.add_argument(
        "--kubelet-config-uri",
        required=True,
        help="file:///.../config.yaml: the node's KubeletConfiguration (topology manager)",
    )
    p.add_argument(
        "--machine-info", required=True, help="the node's NUMA layout (lab stand-in for sysfs)"
    )
    p.add_argument(
        "--profile", default=None, help="GPU profile, used when the machine file is missing"
    )
    p.add_argument("--sleep-interval", default="60s", help="re-examine every (default 60s)")
    p.add_argument("--kubeconfig", default=None, help="default: in-cluster or local cluster")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpulab.kube import api_client
    from gpulab.topologyupdater.updater import (
        COMPONENT,
        TopologyUpdater,
        config_path_of,
        parse_duration,
    )
    from gpulab.trace import Tracer

    try:
        interval = parse_duration(args.sleep_interval)
        config = config_path_of(args.kubelet_config_uri)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    machine = Path(args.machine_info)
    if not machine.exists() and args.profile is None:
        raise CLIError(f"--machine-info {machine} does not exist; write it or pass --profile")
    api = api_client(args.kubeconfig)
    tracer = Tracer(COMPONENT, api, instance=args.node_name)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        updater = TopologyUpdater(
            api, args.node_name, config, machine, interval, tracer, profile=args.profile
        )
        updater.run(stop)
    finally:
        tracer.flush(timeout=2)
    return 0
