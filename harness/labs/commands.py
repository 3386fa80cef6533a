"""`gpulab lab start|hint|check|stop NAME`: the troubleshooting labs (harness/labs).

gpulab lab start unschedulable   bring the labs cluster up if needed, break things,
                                 print the symptoms
gpulab lab hint unschedulable    the next hint (--all: every hint)
gpulab lab check unschedulable   per case: fixed or not; exit 0 when all are fixed
gpulab lab stop unschedulable    undo the lab (namespace, taints, faults, configs)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

from harness.backends import BACKENDS

console = Console(stderr=False, highlight=False, soft_wrap=True)


def add_commands(sub: argparse._SubParsersAction) -> None:
    from harness.labs import LABS

    p = sub.add_parser("lab", help="troubleshooting labs: start, hint, check, stop")
    p.add_argument("action", choices=("start", "hint", "check", "stop", "list"))
    p.add_argument("name", nargs="?", choices=list(LABS), help="the lab")
    p.add_argument("--all", action="store_true", help="hint: print every hint")
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=os.environ.get("GPULAB_BACKEND"),
        help="default: the backend the labs cluster runs on, else as `gpulab up`",
    )
    p.add_argument("--kubeconfig", type=Path, help="--backend external: its kubeconfig")
    p.set_defaults(func=cmd_lab)


def _progress(message: str) -> None:
    console.print(f"[bold blue]==>[/bold blue] {message}")


def cmd_lab(args: argparse.Namespace) -> int:
    from harness.backends import backend_for, ensure_up
    from harness.errors import HarnessError
    from harness.labs import LABS, load
    from harness.spec import load as load_spec

    if args.action == "list":
        for name in LABS:
            console.print(f"{name:<22} {load(name).summary}")
        return 0
    if args.name is None:
        raise HarnessError(f"gpulab lab {args.action} NAME: name a lab ({', '.join(LABS)})")
    lab = load(args.name)
    spec = load_spec(lab.spec)
    if args.action == "hint":
        return _hint(lab, spec.name, args.all)
    if args.action == "start":
        backend = ensure_up(spec, args.backend, _progress, args.kubeconfig)
        lab.start(backend, _progress)
        _hint_file(spec.name, lab.name).unlink(missing_ok=True)
        console.print(f"\n[bold]lab {lab.name}[/bold]: {lab.summary}")
        for case in lab.cases(backend.api()):
            kind, ref = case.target
            console.print(f"  - {case.symptom}")
            console.print(f"      gpulab diagnose {kind} {ref} --cluster {spec.name}")
        console.print(
            f"\nhints: `gpulab lab hint {lab.name}`; when you think it is fixed: "
            f"`gpulab lab check {lab.name}`; kubectl: `gpulab kubectl --spec {lab.spec} ...`"
        )
        return 0
    _, backend = backend_for(spec, args.backend, args.kubeconfig)
    if not backend.running():
        raise HarnessError(f"the labs cluster is not running: `gpulab lab start {lab.name}`")
    if args.action == "stop":
        lab.stop(backend, _progress)
        _progress(f"lab {lab.name} stopped")
        return 0
    states = lab.check(backend.api())
    for s in states:
        mark = "[green]fixed[/green]" if s.fixed else "[red]not fixed[/red]"
        console.print(f"  {s.case:<12} {mark}  {s.detail}")
    done = all(s.fixed for s in states)
    console.print(
        f"lab {lab.name}: " + ("[bold green]all fixed[/bold green]" if done else "not yet fixed")
    )
    return 0 if done else 1


def _hint_file(cluster: str, lab: str) -> Path:
    from gpulab.state import cluster_dir

    return cluster_dir(cluster) / "labs" / f"{lab}.hints"


def _hint(lab: object, cluster: str, show_all: bool) -> int:
    hints: tuple[str, ...] = lab.hints  # type: ignore[attr-defined]
    if show_all:
        for i, h in enumerate(hints, 1):
            console.print(f"hint {i}/{len(hints)}: {h}")
        return 0
    path = _hint_file(cluster, lab.name)  # type: ignore[attr-defined]
    given = int(path.read_text()) if path.exists() else 0
    if given >= len(hints):
        console.print("no more hints; the solutions are at the end of docs/workshop.md")
        return 0
    console.print(f"hint {given + 1}/{len(hints)}: {hints[given]}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(given + 1))
    return 0
