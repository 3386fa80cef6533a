"""CLI for the Kueue counterpart (kubernetes-sigs/kueue v0.19.2 cmd/kueue flags:
``--config``, ``--feature-gates``): ``gpulab kueue-controller``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpulab.errors import CLIError


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "kueue-controller",
        help="run the Kueue counterpart (queues, quota, admission, integrations, webhooks)",
        description=(
            "Watch the kueue.x-k8s.io objects, batch/v1 Jobs and Kueue-managed Pods; admit "
            "Workloads within quota as kubernetes-sigs/kueue v0.19.2 does. With "
            "--webhook-bind, also serve its admission and conversion webhooks over HTTPS; "
            "with --metrics-bind, its Prometheus metrics over HTTP."
        ),
    )
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, the lab cluster)")
    p.add_argument(
        "--config",
        type=Path,
        help="a config.kueue.x-k8s.io/v1beta2 Configuration (upstream's --config)",
    )
    p.add_argument(
        "--feature-gates",
        default="",
        metavar="A=true,B=false",
        help="feature gates, as upstream's flag (UnadmittedWorkloadsObservability, "
        "WorkloadPriorityClassDefaulting)",
    )
    p.add_argument("--webhook-bind", metavar="HOST:PORT", help="serve the webhooks here")
    p.add_argument("--cert-file", type=Path, help="TLS certificate (PEM) for the webhooks")
    p.add_argument("--key-file", type=Path, help="TLS private key (PEM) for the webhooks")
    p.add_argument(
        "--metrics-bind",
        metavar="HOST:PORT",
        help="serve /metrics here (default: the Configuration's metrics.bindAddress, if any)",
    )
    p.set_defaults(func=_run)


def _gates(value: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, (x.strip() for x in value.split(","))):
        name, sep, flag = item.partition("=")
        if not sep or flag.lower() not in ("true", "false"):
            raise CLIError(f"--feature-gates {item!r}: expected Name=true or Name=false")
        gates[name] = flag.lower() == "true"
    return gates


def _run(args: argparse.Namespace) -> int:
    from gpulab.kueue import config as cfg
    from gpulab.kueue import main, webhook

    configuration = cfg.load(args.config)
    gates = _gates(args.feature_gates)
    if gates:
        raw_gates = {**configuration.feature_gates, **gates}
        try:
            configuration = cfg.with_gates(configuration, raw_gates)
        except cfg.ConfigError as exc:
            raise CLIError(str(exc)) from exc
    if args.webhook_bind is not None:
        try:
            webhook.parse_bind(args.webhook_bind)
        except ValueError as exc:
            raise CLIError(str(exc)) from exc
        for flag, path in (("--cert-file", args.cert_file), ("--key-file", args.key_file)):
            if path is None:
                raise CLIError(f"--webhook-bind needs {flag}")
            if not path.is_file():
                raise CLIError(f"{flag} {path}: no such file")
    elif args.cert_file or args.key_file:
        raise CLIError("--cert-file/--key-file are only used with --webhook-bind")
    metrics = args.metrics_bind or configuration.metrics_bind
    metrics_bind = None
    if metrics:
        host = metrics.rpartition(":")[0] or "0.0.0.0"
        try:
            _, port = webhook.parse_bind(f"{host}:{metrics.rpartition(':')[2]}", "--metrics-bind")
        except ValueError as exc:
            raise CLIError(str(exc)) from exc
        metrics_bind = (host, port)
    return main.run(
        args.kubeconfig,
        configuration,
        args.webhook_bind,
        args.cert_file,
        args.key_file,
        metrics_bind,
    )
