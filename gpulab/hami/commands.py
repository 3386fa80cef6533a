"""`gpulab extender` (HAMi's scheduler process) and `gpulab explain pod`.

The extender flags follow HAMi ``cmd/scheduler/main.go`` (``--http_bind``, ``--cert_file``,
``--key_file``, ``--scheduler-name``, ``--default-mem``, ``--default-cores``,
``--default-gpu``, ``--node-scheduler-policy``, ``--gpu-scheduler-policy``,
``--metrics-bind-address``), spelled with dashes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from typing import Any

from gpulab.errors import CLIError
from gpulab.hami import score
from gpulab.hami.device import Defaults
from gpulab.hami.nodelock import DEFAULT_TIMEOUT
from gpulab.hami.scheduler import FILTER_RESULT, SchedulerConfig
from gpulab.hami.webhook import WebhookConfig


def _lock_timeout() -> float:
    """HAMi reads HAMI_NODELOCK_EXPIRE as a Go duration ("5m", "300s"); plain seconds too."""
    raw = os.environ.get("HAMI_NODELOCK_EXPIRE", "").strip()
    unit = {"s": 1, "m": 60, "h": 3600}.get(raw[-1:], 1) if raw else 1
    number = raw.rstrip("smh")
    try:
        return float(number) * unit
    except ValueError:
        return DEFAULT_TIMEOUT.total_seconds()


def add_commands(sub: argparse._SubParsersAction) -> None:
    ext = sub.add_parser(
        "extender",
        help="HAMi scheduler: kube-scheduler extender (/filter, /bind) + admission webhook",
    )
    ext.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, the lab cluster)")
    ext.add_argument("--http-bind", default="127.0.0.1:8080", help="HOST:PORT of the routes")
    ext.add_argument(
        "--metrics-bind", default="127.0.0.1:9395", help="HOST:PORT of Prometheus /metrics"
    )
    ext.add_argument("--cert-file", help="TLS certificate (HTTPS when given with --key-file)")
    ext.add_argument("--key-file", help="TLS private key")
    ext.add_argument(
        "--scheduler-name",
        default="hami-scheduler",
        help="schedulerName the webhook sets on GPU pods",
    )
    ext.add_argument("--default-mem", type=int, default=0, help="MiB per vGPU when not asked")
    ext.add_argument(
        "--default-cores", type=int, default=0, help="%% cores per vGPU when not asked"
    )
    ext.add_argument(
        "--default-gpu-count",
        type=int,
        default=0,
        help="nvidia.com/gpu added to containers that ask only for gpumem/gpucores "
        "(0: reject them, HAMi's --default-gpu is 1)",
    )
    ext.add_argument("--node-scheduler-policy", choices=score.POLICIES, default=score.BINPACK)
    ext.add_argument("--gpu-scheduler-policy", choices=score.POLICIES, default=score.SPREAD)
    ext.add_argument(
        "--node-lock-timeout",
        type=float,
        default=_lock_timeout(),
        help="seconds after which a node lock is stale (HAMI_NODELOCK_EXPIRE)",
    )
    ext.add_argument(
        "--keep-node-lock",
        action="store_true",
        help="leave the node lock for the device plugin to release after Allocate (HAMi)",
    )
    ext.set_defaults(func=_run_extender)

    exp = sub.add_parser("explain", help="why the extender placed a pod where it did")
    exp.add_argument("kind", choices=["pod"])
    exp.add_argument("name")
    exp.add_argument("-n", "--namespace", default="default")
    exp.add_argument("--kubeconfig")
    exp.set_defaults(func=_run_explain)


def _run_extender(args: argparse.Namespace) -> int:
    from gpulab.hami.server import ServerOptions, StartError, parse_bind, start

    for flag, value in (
        ("--default-mem", args.default_mem),
        ("--default-cores", args.default_cores),
        ("--default-gpu-count", args.default_gpu_count),
    ):
        if value < 0:
            raise CLIError(f"{flag} must not be negative")
    if args.default_cores > 100:
        raise CLIError("--default-cores is a percentage: 0..100")
    if bool(args.cert_file) != bool(args.key_file):
        raise CLIError("HTTPS needs both --cert-file and --key-file")
    try:
        opts = ServerOptions(
            kubeconfig=args.kubeconfig,
            http_bind=parse_bind(args.http_bind, "--http-bind"),
            metrics_bind=parse_bind(args.metrics_bind, "--metrics-bind"),
            cert_file=args.cert_file,
            key_file=args.key_file,
            scheduler=SchedulerConfig(
                scheduler_name=args.scheduler_name,
                defaults=Defaults(mem=args.default_mem, cores=args.default_cores),
                node_policy=args.node_scheduler_policy,
                gpu_policy=args.gpu_scheduler_policy,
                node_lock_timeout=dt.timedelta(seconds=args.node_lock_timeout),
                keep_node_lock=args.keep_node_lock,
            ),
            webhook=WebhookConfig(
                scheduler_name=args.scheduler_name,
                default_gpu_count=args.default_gpu_count,
                default_mem=args.default_mem,
                default_cores=args.default_cores,
            ),
        )
        start(opts)
    except StartError as exc:
        raise CLIError(str(exc)) from exc
    return 0


def explain_rows(record: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(node, fit, reason, score, GPUs) per node, the chosen one first."""
    chosen = record.get("chosen")
    nodes = sorted(
        record.get("nodes") or [], key=lambda n: (n.get("node") != chosen, n.get("node"))
    )
    rows = []
    for n in nodes:
        gpus = "; ".join(",".join(ctr) or "-" for ctr in n.get("devices") or [])
        rows.append(
            (
                ("★ " if n.get("node") == chosen else "") + str(n.get("node")),
                "yes" if n.get("fit") else "no",
                n.get("reason") or "",
                "" if n.get("score") is None else f"{n['score']:.2f}",
                gpus,
            )
        )
    return rows


def _run_explain(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from rich.console import Console
    from rich.table import Table

    from gpulab.kube import api_client

    api = api_client(args.kubeconfig)
    try:
        pod = client.CoreV1Api(api).read_namespaced_pod(args.name, args.namespace)
    except ApiException as exc:
        raise CLIError(f"pod {args.namespace}/{args.name}: {exc.status} {exc.reason}") from exc
    raw = (pod.metadata.annotations or {}).get(FILTER_RESULT)
    if not raw:
        raise CLIError(
            f"pod {args.namespace}/{args.name} has no {FILTER_RESULT} annotation: the HAMi "
            "extender has not filtered it (is its schedulerName hami-scheduler?)"
        )
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CLIError(f"{FILTER_RESULT} is not JSON: {exc}") from exc
    table = Table(
        title=f"pod {args.namespace}/{args.name}: nodes {record.get('nodePolicy')}, "
        f"GPUs {record.get('gpuPolicy')} ({record.get('time')})"
    )
    for col in ("node", "fit", "reason", "score", "GPUs (per container)"):
        table.add_column(col)
    for row in explain_rows(record):
        table.add_row(*row, style="bold green" if row[0].startswith("★") else None)
    console = Console()
    console.print(table)
    if record.get("chosen") is None:
        console.print("[red]no node fits: the pod stays Pending[/red]")
    return 0
