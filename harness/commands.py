"""`gpulab build | up | down | status | apply | kubectl`: the harness commands."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from kubernetes import client
from rich.console import Console

from gpulab.state import cluster_dir
from harness import binaries
from harness.backends import BACKENDS, backend_for, ensure_up, forget
from harness.errors import HarnessError
from harness.local import pid_alive
from harness.spec import load as load_spec

console = Console(stderr=True, highlight=False, soft_wrap=True)


def progress(message: str) -> None:
    console.print(f"[bold blue]==>[/bold blue] {message}")


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="build the upstream binaries (cached per version)")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument(
        "--from-source",
        action="store_true",
        help="build from the Go modules; do not try the official release binaries",
    )
    p.add_argument(
        "--test-peers",
        action="store_true",
        help="also build the upstream peers the e2e tests run beside the lab's components "
        "(scheduler-plugins' kube-scheduler); `make test` does",
    )
    p.add_argument(
        "--images",
        action="store_true",
        help="also build the kind backend's images (node image, component images, gpulab:dev); "
        "pulls the pinned official ones where a registry answers",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="with --images: build every image here even where a registry answers",
    )
    p.set_defaults(func=cmd_build)

    for name, func, text in (
        ("up", cmd_up, "bring a cluster up (builds binaries first if needed)"),
        ("down", cmd_down, "stop the cluster and everything the lab started for it"),
        ("status", cmd_status, "show the cluster's processes / nodes"),
    ):
        p = sub.add_parser(name, help=text)
        _spec_args(p)
        p.set_defaults(func=func)

    p = sub.add_parser("apply", help="apply manifests/ (or given paths) to the cluster")
    _spec_args(p)
    p.add_argument("paths", nargs="*", type=Path)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser(
        "pod-runner",
        help="(local backend, started by `gpulab up`) run the lab's own pods on kwok nodes",
    )
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--cluster-dir", type=Path, required=True, help="the cluster's state dir")
    p.add_argument("--block", type=int, required=True, help="K of the cluster's 127.K.0.0/16")
    p.add_argument("--api-port", type=int, required=True, help="the API server's port")
    p.add_argument(
        "--backoff-initial", type=float, default=10.0, help="container restart back-off (s)"
    )
    p.add_argument("--backoff-max", type=float, default=300.0, help="maximum back-off (s)")
    p.set_defaults(func=cmd_pod_runner)

    p = sub.add_parser("kubectl", help="run the lab's kubectl against the cluster", add_help=False)
    p.add_argument("--spec", default=os.environ.get("GPULAB_SPEC", "default"))
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_kubectl)


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spec",
        default=os.environ.get("GPULAB_SPEC", "default"),
        help="cluster spec name (harness/clusters) or YAML path; env GPULAB_SPEC",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=os.environ.get("GPULAB_BACKEND"),
        help="local (default), kind (real kubelets in Docker), k3d or external; env GPULAB_BACKEND",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        help="--backend external: the existing cluster's kubeconfig; env GPULAB_KUBECONFIG",
    )


def cmd_build(args: argparse.Namespace) -> int:
    binaries.build_all(progress, force=args.force, from_source=args.from_source)
    if args.test_peers:
        binaries.build_test_peers(progress, force=args.force)
    if args.images:
        from harness.engine import release
        from harness.images import ensure_images

        built = ensure_images(progress, offline=True if args.offline else None)
        loaded = ", ".join(built.load) or "nothing (the node image carries the lab's images)"
        progress(f"kind node image {built.node}; loaded into each node at start: {loaded}")
        release(progress, "build")  # the engine stays up only while a kind cluster uses it
    elif args.offline:
        raise HarnessError("--offline goes with --images")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    backend = ensure_up(spec, args.backend, progress, args.kubeconfig)
    progress(f"cluster {spec.name} is up")
    console.print(f"export KUBECONFIG={backend.kubeconfig}", highlight=False)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    _, backend = backend_for(spec, args.backend, args.kubeconfig)
    backend.down(progress)
    forget(spec)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    name, backend = backend_for(spec, args.backend, args.kubeconfig)
    if not backend.running():
        console.print(f"cluster {spec.name!r} ({name}) is not running")
        return 1
    for rec in backend.processes():
        state = "[green]running[/green]" if pid_alive(rec.pid, rec.exe) else "[red]exited[/red]"
        console.print(f"  {rec.name:<26} pid {rec.pid:<8} {state}")
    for node in client.CoreV1Api(backend.api()).list_node().items:
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
        gpus = (node.status.allocatable or {}).get("nvidia.com/gpu", "0")
        console.print(
            f"  node {node.metadata.name:<22} {'Ready' if ready else 'NotReady':<9} "
            f"nvidia.com/gpu={gpus}"
        )
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from harness.apply import MANIFESTS

    spec = load_spec(args.spec)
    _, backend = backend_for(spec, args.backend, args.kubeconfig)
    if not backend.running():
        raise HarnessError(f"cluster {spec.name!r} is not up; run `gpulab up` first")
    backend.apply(args.paths or [MANIFESTS], progress)
    return 0


def cmd_pod_runner(args: argparse.Namespace) -> int:
    from harness.podrunner import main

    return main.run(
        args.kubeconfig,
        args.cluster_dir,
        args.block,
        args.api_port,
        args.backoff_initial,
        args.backoff_max,
    )


def cmd_kubectl(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    kubectl = binaries.binary("kubectl")
    if not kubectl.exists():
        raise HarnessError("kubectl is not built yet; run `make binaries`")
    env = {**os.environ, "KUBECONFIG": str(cluster_dir(spec.name) / "kubeconfig")}
    sys.stdout.flush()
    rest = args.args[1:] if args.args[:1] == ["--"] else args.args
    os.execve(kubectl, [str(kubectl), *rest], env)
