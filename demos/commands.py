"""`gpulab demo <chapter>`: the scripted, narrated chapter demos."""

from __future__ import annotations

import argparse
import importlib

CHAPTERS = {
    "cluster": "demos.cluster",
    "device-plugin": "demos.device_plugin",
    "hami": "demos.hami",
    "kueue": "demos.kueue",
    "coscheduling": "demos.coscheduling",
    "numa": "demos.numa",
    "volcano": "demos.volcano",
}


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a chapter demo, narrating its call chain")
    p.add_argument("chapter", choices=sorted(CHAPTERS))
    p.add_argument("--spec", default="default", help="cluster spec (harness/clusters)")
    p.add_argument("--backend", default=None, help="default: kind if Docker answers, else local")
    p.add_argument("--diagram", help="also write the run's call chain as a Mermaid diagram here")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    module = importlib.import_module(CHAPTERS[args.chapter])
    return int(module.run(args))
