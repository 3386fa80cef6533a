"""What every chapter demo shares: a cluster, a fresh namespace, live narration, checks."""

from __future__ import annotations

import argparse
import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from rich.console import Console
from rich.table import Table

from gpulab import trace
from gpulab.kube import api_client
from gpulab.state import cluster_dir
from gpulab.wait import wait_for
from harness.backends import default_backend, get_backend
from harness.errors import HarnessError
from harness.spec import ClusterSpec
from harness.spec import load as load_spec

console = Console(highlight=False, soft_wrap=True)


class DemoFailed(HarnessError):
    """The demo ran but the outcome is not what the chapter promises."""


def ensure_cluster(
    args: argparse.Namespace, addons: tuple[str, ...] = ()
) -> tuple[client.ApiClient, ClusterSpec]:
    """Bring the chosen backend up unless it is already running, with the chapter's
    ``addons`` (harness/addons; on kind they are deployed from manifests/ at `up`)."""
    from harness import binaries
    from harness.commands import progress

    spec = load_spec(args.spec)
    name = args.backend or default_backend()
    backend = get_backend(name, spec)
    if not backend.running():
        if name == "local":
            binaries.build_all(progress)
        backend.up(progress)
        (cluster_dir(spec.name) / "backend").write_text(name)
    for addon in addons:
        backend.ensure_addon(addon, progress)
    return api_client(cluster_dir(spec.name) / "kubeconfig"), spec


def chapter(title: str, story: str) -> None:
    console.rule(f"[bold]{title}")
    console.print(story)


def say(message: str) -> None:
    console.print(f"[bold yellow]▶[/bold yellow] {message}")


def ok(message: str) -> None:
    console.print(f"[bold green]✔[/bold green] {message}")


def fresh_namespace(api: client.ApiClient, name: str) -> None:
    """Delete ``name`` if it exists (waiting until it is gone), then create it."""
    core = client.CoreV1Api(api)
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    else:
        wait_for(lambda: _absent(core, name), 60, f"namespace {name} to be deleted")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # ServiceAccount admission rejects pods until the namespace's default account exists
    wait_for(lambda: _has_default_sa(core, name), 30, f"default ServiceAccount in {name}")


def _absent(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespace(name)
    except ApiException as exc:
        return exc.status == 404
    return False


def _has_default_sa(core: client.CoreV1Api, ns: str) -> bool:
    try:
        core.read_namespaced_service_account("default", ns)
    except ApiException:
        return False
    return True


@dataclass
class LiveTrace:
    """Follows a namespace's Events (the call-chain trace) and Pod phases, printing both.

    Runs in background threads while the demo acts, so the story appears as it happens.
    ``also`` adds namespaces whose Events about the ``nodes`` named are shown too (device
    plugins and kubelet write Node Events into "default"); Events from before the demo
    started are left out.
    """

    api: client.ApiClient
    namespace: str
    also: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    seen: list[trace.TraceEvent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _since: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> LiveTrace:
        targets: list[Callable[[], None]] = [self._pods]
        targets += [lambda ns=ns: self._events(ns) for ns in (self.namespace, *self.also)]
        for target in targets:
            threading.Thread(target=target, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def expect(self, steps: set[str], timeout: float = 20.0) -> None:
        """Wait until each step has been seen; Events are written asynchronously and a
        controller's event broadcaster may post them seconds after the fact."""
        wait_for(
            lambda: steps <= {ev.step for ev in self.seen},
            timeout,
            f"Events {sorted(steps - {ev.step for ev in self.seen})} in the trace",
        )

    def _wanted(self, ev: trace.TraceEvent, namespace: str) -> bool:
        if ev.time < self._since - dt.timedelta(seconds=2):
            return False
        if namespace == self.namespace:
            return True
        return any(ev.regarding == f"Node {node}" for node in self.nodes)

    def _events(self, namespace: str) -> None:
        while not self._stop.is_set():
            try:
                for ev in trace.follow(self.api, namespace, timeout_seconds=5):
                    if self._stop.is_set():
                        return
                    with self._lock:
                        if ev in self.seen or not self._wanted(ev, namespace):
                            continue
                        self.seen.append(ev)
                    console.print("  " + trace.render_line(ev))
            except Exception:  # the watch ends on timeout or a blip; follow again
                time.sleep(0.2)

    def _pods(self) -> None:
        phases: dict[str, str] = {}
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            try:
                w = watch.Watch()
                for item in w.stream(core.list_namespaced_pod, self.namespace, timeout_seconds=5):
                    pod = item["object"]
                    phase = pod.status.phase if pod.status else None
                    name = pod.metadata.name
                    if phase and phases.get(name) != phase:
                        phases[name] = phase
                        where = f" on {pod.spec.node_name}" if pod.spec.node_name else ""
                        console.print(
                            f"  [dim]{time.strftime('%H:%M:%S')}[/dim] "
                            f"[bold magenta]{'kwok (kubelet)':<22}[/bold magenta] "
                            f"[bold cyan]{'Pod ' + phase:<18}[/bold cyan] "
                            f"[green]Pod {self.namespace}/{name}[/green]{where}"
                        )
                    if self._stop.is_set():
                        return
            except Exception:
                time.sleep(0.2)

    def write_diagram(self, path: Path) -> None:
        path.write_text(trace.sequence_diagram(self.seen))
        say(f"sequence diagram of this run written to {path}")


def nodes_table(api: client.ApiClient) -> list[Any]:
    core = client.CoreV1Api(api)
    nodes = core.list_node().items
    table = Table(title="Simulated nodes")
    for col in ("node", "Ready", "GPU profile", "nvidia.com/gpu", "cpu", "memory"):
        table.add_column(col)
    for n in nodes:
        ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        alloc = n.status.allocatable or {}
        table.add_row(
            n.metadata.name,
            "yes" if ready else "[red]no[/red]",
            (n.metadata.labels or {}).get("gpulab.io/gpu-profile", "-"),
            alloc.get("nvidia.com/gpu", "0"),
            alloc.get("cpu", "?"),
            alloc.get("memory", "?"),
        )
    console.print(table)
    return nodes
