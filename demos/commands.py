"""`gpulab demo <chapter>`: the scripted, narrated chapter demos."""

from __future__ import annotations

import argparse
import importlib
import sys
import threading

CHAPTERS = {
    "cluster": "demos.cluster",
    "device-plugin": "demos.device_plugin",
    "hami": "demos.hami",
    "kueue": "demos.kueue",
    "coscheduling": "demos.coscheduling",
    "numa": "demos.numa",
    "volcano": "demos.volcano",
    "gpu-operator": "demos.gpu_operator",
}


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a chapter demo, narrating its call chain")
    p.add_argument("chapter", choices=sorted(CHAPTERS))
    p.add_argument("--spec", default="default", help="cluster spec (harness/clusters)")
    p.add_argument(
        "--backend",
        default=None,
        help="default: where the cluster runs, else $GPULAB_BACKEND or local",
    )
    p.add_argument("--diagram", help="also write the run's call chain as a Mermaid diagram here")
    p.add_argument(
        "--dashboard",
        nargs="?",
        type=int,
        const=0,
        metavar="PORT",
        help="also serve the live dashboard on 127.0.0.1 (default 8700 + $GPULAB_PORT_OFFSET)",
    )
    p.add_argument(
        "--verbose",
        dest="full_trace",  # not `verbose`: that is gpulab's own -v (debug logging)
        action="store_true",
        help="print each trace line in full (default: fitted to the terminal's width)",
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from demos.common import NARRATION, running_dashboard, say

    NARRATION.verbose = args.full_trace
    module = importlib.import_module(CHAPTERS[args.chapter])
    code = int(module.run(args))
    page = running_dashboard()
    if page is not None and sys.stdin.isatty():
        say(f"the dashboard stays at {page.url}: Ctrl-C ends it")
        threading.Event().wait()
    return code
