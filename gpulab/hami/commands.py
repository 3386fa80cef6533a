"""`gpulab extender` (HAMi's scheduler process) and `gpulab explain pod`.

The extender's flags are Project-HAMi/HAMi v2.10.0 ``cmd/scheduler/main.go``'s, spelled as
there (``--http_bind``, ``--cert_file``, ``--key_file``, ``--scheduler-name``,
``--node-scheduler-policy``, ``--gpu-scheduler-policy``, ``--metrics-bind-address``,
``--node-label-selector``, ``--node-lock-timeout`` and ``--node-lock-retry-timeout`` as Go
durations, ``--force-overwrite-default-scheduler``, ``--legacy-metrics``,
``--device-config-file``). Not implemented: ``--leader-elect*``, ``--profiling``,
``--kube-qps`` / ``--kube-burst`` / ``--kube-timeout``, ``--debug``. Lab additions, named:
``--kubeconfig`` (upstream uses $KUBECONFIG or the ServiceAccount, as the lab does without
it) and the benchmark experiments ``--gpulab-lock-retry-all`` and
``--gpulab-async-filter-patch``. A value that does not parse
— a Go duration without a unit, an unknown policy — stops start-up with one line.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpulab.errors import CLIError
from gpulab.hami import score
from gpulab.hami.config import (
    ConfigError,
    load_device_config,
    parse_go_duration,
    parse_string_to_string,
)
from gpulab.hami.filter import FILTER_RESULT
from gpulab.hami.scheduler import SchedulerConfig
from gpulab.hami.webhook import WebhookConfig

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def go_bool(value: str) -> bool:
    """pflag's ``BoolVar`` values (``strconv.ParseBool``)."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {value!r}: use true or false")


def add_commands(sub: argparse._SubParsersAction) -> None:
    ext = sub.add_parser(
        "extender",
        help="HAMi scheduler: kube-scheduler extender (/filter, /bind) + admission webhook",
    )
    ext.add_argument("--http_bind", default="127.0.0.1:8080", help="http server bind address")
    ext.add_argument("--cert_file", default="", help="tls cert file")
    ext.add_argument("--key_file", default="", help="tls key file")
    ext.add_argument(
        "--scheduler-name",
        default="",
        help="the name to be added to pod.spec.schedulerName if not empty",
    )
    ext.add_argument("--node-scheduler-policy", default=score.BINPACK, help="node scheduler policy")
    ext.add_argument("--gpu-scheduler-policy", default=score.SPREAD, help="GPU scheduler policy")
    ext.add_argument(
        "--metrics-bind-address",
        default=":9395",
        help="The TCP address that the scheduler should bind to for serving prometheus metrics",
    )
    ext.add_argument(
        "--node-label-selector", default="", help="key=value pairs separated by commas"
    )
    ext.add_argument("--node-lock-timeout", default="5m", help="timeout for node locks")
    ext.add_argument(
        "--node-lock-retry-timeout",
        default="28s",
        help="timeout for retrying LockNode when contended by another PodGroup member "
        "(0 disables retry)",
    )
    ext.add_argument(
        "--force-overwrite-default-scheduler",
        type=go_bool,
        nargs="?",
        const=True,
        default=True,
        help="overwrite schedulerName default-scheduler in the pod spec",
    )
    ext.add_argument(
        "--legacy-metrics",
        type=go_bool,
        nargs="?",
        const=True,
        default=False,
        help="emit legacy metric names alongside new ones",
    )
    ext.add_argument("--device-config-file", required=True, help="Path to the device config file")
    ext.add_argument("--kubeconfig", help="lab: kubeconfig (default: $KUBECONFIG, the lab cluster)")
    ext.add_argument(
        "--gpulab-lock-retry-all",
        action="store_true",
        help="lab experiment: every pod waits for a contended node lock, not only PodGroup members",
    )
    ext.add_argument(
        "--gpulab-async-filter-patch",
        action="store_true",
        help="lab experiment: Filter answers before writing the pod's annotations; Bind waits",
    )
    # the flags as typed (--http_bind, --scheduler-name) with their defaults, for the
    # start-up's flag line (PrintPFlags); argparse keeps only the dest names on the Namespace
    flags = [(a.option_strings[0], a.dest, a.default) for a in ext._actions if a.option_strings]
    ext.set_defaults(func=_run_extender, flag_specs=flags)

    exp = sub.add_parser("explain", help="why the extender placed a pod where it did")
    exp.add_argument("kind", choices=["pod"])
    exp.add_argument("name")
    exp.add_argument("-n", "--namespace", default="default")
    exp.add_argument("--kubeconfig")
    exp.set_defaults(func=_run_explain)


def options(args: argparse.Namespace) -> Any:
    """The flags as ServerOptions; CLIError (one line) for a value that does not parse."""
    from gpulab.hami.server import ServerOptions, StartError, parse_bind

    if bool(args.cert_file) != bool(args.key_file):
        raise CLIError("HTTPS needs both --cert_file and --key_file")
    try:
        score.validate_node_policy(args.node_scheduler_policy, "--node-scheduler-policy")
        score.validate_gpu_policy(args.gpu_scheduler_policy, "--gpu-scheduler-policy")
        nvidia = load_device_config(args.device_config_file)
        return ServerOptions(
            kubeconfig=args.kubeconfig,
            http_bind=parse_bind(args.http_bind, "--http_bind"),
            metrics_bind=parse_bind(args.metrics_bind_address, "--metrics-bind-address"),
            cert_file=args.cert_file or None,
            key_file=args.key_file or None,
            scheduler=SchedulerConfig(
                scheduler_name=args.scheduler_name,
                nvidia=nvidia,
                node_policy=args.node_scheduler_policy,
                gpu_policy=args.gpu_scheduler_policy,
                node_lock_timeout=parse_go_duration(args.node_lock_timeout, "--node-lock-timeout"),
                node_lock_retry_timeout=parse_go_duration(
                    args.node_lock_retry_timeout, "--node-lock-retry-timeout"
                ),
                node_label_selector=tuple(
                    sorted(
                        parse_string_to_string(
                            args.node_label_selector, "--node-label-selector"
                        ).items()
                    )
                ),
                lock_retry_all=args.gpulab_lock_retry_all,
                async_filter_patch=args.gpulab_async_filter_patch,
            ),
            webhook=WebhookConfig(
                scheduler_name=args.scheduler_name,
                force_overwrite_default_scheduler=args.force_overwrite_default_scheduler,
                nvidia=nvidia,
            ),
            legacy_metrics=args.legacy_metrics,
            flags=tuple(
                f"{flag}={getattr(args, dest)}"
                for flag, dest, default in getattr(args, "flag_specs", ())
                if dest != "help" and getattr(args, dest) != default
            ),
            device_config_file=args.device_config_file,
        )
    except (ConfigError, score.PolicyError, StartError) as exc:
        raise CLIError(str(exc)) from exc


def _run_extender(args: argparse.Namespace) -> int:
    from gpulab.hami.server import StartError, start

    opts = options(args)
    try:
        start(opts)
    except StartError as exc:
        raise CLIError(str(exc)) from exc
    return 0


def explain_rows(record: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(node, fit, reason, score, GPUs) per recorded node, the chosen one first."""
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
    if record.get("omitted"):
        summary = ", ".join(f"{n} {r}" for r, n in (record.get("summary") or {}).items())
        console.print(f"{record['omitted']} more nodes not listed; all nodes: {summary}")
    if record.get("chosen") is None:
        console.print("[red]no node fits: the pod stays Pending[/red]")
    return 0
