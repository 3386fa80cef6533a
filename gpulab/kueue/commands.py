"""CLI for the Kueue counterpart: ``gpulab kueue-controller``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpulab.errors import CLIError


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "kueue-controller",
        help="run the Kueue counterpart (queues, quota, admission, Job integration, webhooks)",
        description=(
            "Watch ResourceFlavors, ClusterQueues, LocalQueues, Workloads (kueue.x-k8s.io) "
            "and batch/v1 Jobs; admit Workloads within quota and unsuspend their Jobs. "
            "With --webhook-bind, also serve the Job mutating webhook "
            "(/mutate-batch-v1-job) and the CRD conversion webhook (/convert) over HTTPS."
        ),
    )
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, the lab cluster)")
    p.add_argument("--webhook-bind", metavar="HOST:PORT", help="serve the webhooks here")
    p.add_argument("--cert-file", type=Path, help="TLS certificate (PEM) for the webhooks")
    p.add_argument("--key-file", type=Path, help="TLS private key (PEM) for the webhooks")
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=5.0,
        help="re-run every reconcile and the scheduler this often (default 5)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gpulab.kueue import main, webhook

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
    if args.resync_seconds <= 0:
        raise CLIError("--resync-seconds must be positive")
    return main.run(
        args.kubeconfig, args.webhook_bind, args.cert_file, args.key_file, args.resync_seconds
    )
