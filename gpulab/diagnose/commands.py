"""`gpulab diagnose KIND REF`: walk the call chain of a pod, workload, clusterqueue,
podgroup or node on a live cluster and name the first broken link. Reads only.

    gpulab diagnose pod NS/NAME [--cluster gpulab-labs | --kubeconfig PATH]
                    [--output text|json] [--save FILE]

Exit status: 0 when no link is broken, 1 when one is (the last line says which and what
to do), 2 on bad input. ``--save`` writes the object set it read as JSON (what the unit
tests' fixtures are).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpulab.diagnose.objects import KINDS, Target
from gpulab.errors import CLIError

STATE_STYLE = {
    "ok": "green",
    "broken": "bold red",
    "waiting": "yellow",
    "blocked": "magenta",
    "skipped": "dim",
}
NAMESPACED = {"pod", "workload", "podgroup"}


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="walk an object's call chain on a live cluster and name the first broken link",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", choices=KINDS)
    p.add_argument("ref", help="NAMESPACE/NAME (pod, workload, podgroup) or NAME")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="default: $KUBECONFIG, else the lab cluster")
    where.add_argument("--cluster", help="a lab cluster by name (e.g. gpulab-labs)")
    p.add_argument("--output", "-o", choices=("text", "json"), default="text")
    p.add_argument("--save", type=Path, help="also write the object set read, as JSON")
    p.set_defaults(func=cmd_diagnose)


def parse_target(kind: str, ref: str) -> Target:
    if kind in NAMESPACED:
        ns, sep, name = ref.partition("/")
        if not sep or not ns or not name:
            raise CLIError(f"{kind} wants NAMESPACE/NAME, got {ref!r}")
        return Target(kind, name, ns)
    if "/" in ref:
        raise CLIError(f"{kind} is cluster-scoped: give its NAME, not {ref!r}")
    return Target(kind, ref)


def cmd_diagnose(args: argparse.Namespace) -> int:
    import urllib3

    from gpulab.dashboard.commands import kubeconfig_for
    from gpulab.diagnose.chain import diagnose
    from gpulab.diagnose.reader import read
    from gpulab.kube import api_client

    target = parse_target(args.kind, args.ref)
    api = api_client(kubeconfig_for(args.cluster, args.kubeconfig))
    try:
        objs = read(api, target)
    except urllib3.exceptions.HTTPError as exc:
        raise CLIError(
            f"cannot reach the API server at {api.configuration.host} ({type(exc).__name__}); "
            "is the cluster up? choose it with --cluster NAME or --kubeconfig PATH"
        ) from exc
    if args.save:
        args.save.write_text(objs.to_json())
    report = diagnose(objs)
    if args.output == "json":
        json.dump(report.to_dict(), sys.stdout, indent=1)
        print()
    else:
        render(report)
    return 1 if report.broken else 0


def render(report: object) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpulab.diagnose.chain import Report

    assert isinstance(report, Report)
    console = Console(highlight=False, soft_wrap=False)
    table = Table(title=f"call chain of {report.target.ref}", show_lines=True)
    table.add_column("link")
    table.add_column("state")
    table.add_column("what it says / evidence")
    for link in report.links:
        evidence = "\n".join(f"  {e}" for e in link.evidence[:12])
        table.add_row(
            link.name,
            f"[{STATE_STYLE.get(link.state, '')}]{link.state}[/]",
            link.summary + (f"\n{evidence}" if evidence else ""),
        )
    console.print(table)
    style = "bold red" if report.broken else "bold green"
    console.print(f"[{style}]{report.answer()}[/]", soft_wrap=True)
