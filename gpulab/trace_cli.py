"""`gpulab trace NAMESPACE`: follow the call-chain trace (Events) of a namespace live."""

from __future__ import annotations

import argparse
import threading

from rich.console import Console

from gpulab import trace
from gpulab.kube import api_client


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="follow the call-chain Events of a namespace live")
    p.add_argument("namespace", nargs="?", default="default")
    p.add_argument("--kubeconfig")
    p.add_argument("--timeout", type=int, default=None, help="stop after N seconds")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    stop = threading.Event()
    if args.timeout is not None:
        threading.Timer(args.timeout, stop.set).start()
    for ev in trace.follow(api_client(args.kubeconfig), args.namespace, stop):
        console.print(trace.render_line(ev))
    return 0
