"""What every chapter demo shares: a cluster, a fresh namespace, live narration, checks."""

from __future__ import annotations

import argparse
import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpulab import informer, narrate, trace
from gpulab.dashboard import chain
from gpulab.wait import wait_for
from harness.backends import Backend, ensure_up
from harness.errors import HarnessError
from harness.local import LocalCluster
from harness.spec import ClusterSpec
from harness.spec import load as load_spec


class DemoConsole(Console):
    """The demos' console. What the demo script itself prints (a section header, a table,
    a tick) sums up what went before, so the trace lines LiveTraces hold go out first;
    what watcher threads print is live narration and goes out as it comes."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            _flush_live()
        super().print(*objects, **kwargs)


console = DemoConsole(highlight=False, soft_wrap=True)


# how often a LiveTrace looks for held lines whose time has come (well under narrate.HOLD)
TICK = 0.1
INDENT = "  "  # trace lines sit under the ▶ and ✔ lines
# the compact line's width where no terminal sets one: the note whole, on one line
UNCUT = 100_000
COUNT_LEGEND = "(xN): the same Event N times, as client-go's series counts it"


@dataclass
class Narration:
    """How the demos narrate, for the whole run (`gpulab demo` sets it)."""

    verbose: bool = False  # --verbose: trace lines in full, not fitted to the terminal
    counts_told: bool = False  # the (xN) legend went out (once, with the first count)
    pod_writer: str = narrate.KWOK_KUBELET  # who writes pod phases on the demo's backend


NARRATION = Narration()


class DemoFailed(HarnessError):
    """The demo ran but the outcome is not what the chapter promises."""


def ensure_cluster(
    args: argparse.Namespace, addons: tuple[str, ...] = ()
) -> tuple[client.ApiClient, ClusterSpec]:
    """Bring the chosen backend up unless it already runs, with the chapter's ``addons``."""
    return ensure_backend(args, addons)[0].api(), load_spec(args.spec)


def ensure_backend(
    args: argparse.Namespace, addons: tuple[str, ...] = ()
) -> tuple[Backend, ClusterSpec]:
    """The demo's cluster (up, with the chapter's components deployed) and its spec."""
    from harness.commands import progress

    spec = load_spec(args.spec)
    backend = ensure_up(spec, args.backend, progress)
    if not isinstance(backend, LocalCluster):
        NARRATION.pod_writer = narrate.KUBELET
    for addon in addons:
        backend.ensure_addon(addon, progress)
    _serve_dashboard(getattr(args, "dashboard", None), backend)
    return backend, spec


# --dashboard: the live page of the demo's cluster (gpulab/dashboard), served by this process
_dashboard: list[Any] = []


def _serve_dashboard(port: int | None, backend: Backend) -> None:
    if port is None or _dashboard:
        return
    from gpulab.dashboard.commands import DEFAULT_PORT
    from gpulab.dashboard.hub import Hub
    from gpulab.dashboard.server import start
    from harness.spec import port_offset

    api = backend.api()
    hub = Hub(api, str(api.configuration.host)).start()
    _dashboard.append(start(hub, port or DEFAULT_PORT + port_offset()))
    say(f"dashboard: {_dashboard[0].url}")


def running_dashboard() -> Any:
    """The dashboard --dashboard started, if any."""
    return _dashboard[0] if _dashboard else None


def chapter(title: str, story: str) -> None:
    console.rule(f"[bold]{title}")
    console.print(story)


def say(message: str) -> None:
    _mark("[bold yellow]▶[/bold yellow]", message)


def ok(message: str) -> None:
    _mark("[bold green]✔[/bold green]", message)


def _mark(mark: str, message: str) -> None:
    """A ▶ or ✔ line. On a terminal (not --verbose) one longer than the width is folded
    at word boundaries under its text, never wrapped by the terminal mid-word; the text
    stays whole (these lines are the story's sentences)."""
    if NARRATION.verbose or not console.is_terminal:
        console.print(f"{mark} {message}")
        return
    lines = Text.from_markup(message).wrap(console, max(20, console.width - len(INDENT)))
    for i, line in enumerate(lines):
        line.rstrip()
        console.print(Text.from_markup(mark if i == 0 else " ") + " " + line, soft_wrap=True)


# the LiveTraces inside their `with`: the script's own lines print what they hold first
_live: list[LiveTrace] = []


def _flush_live() -> None:
    for live in list(_live):
        live.flush()


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


def print_trace(told: list[narrate.Told], verbose: bool | None = None) -> None:
    """Trace lines under the ▶ and ✔ lines: on a terminal each fitted to its width (the
    full text with --verbose); into a file or a pipe (CI logs, `| tee`), which has no width
    to keep to, each line whole on one line, GPU UUIDs shortened."""
    verbose = NARRATION.verbose if verbose is None else verbose
    width: int | None = None  # --verbose: the full text
    cut: dict[str, Any] = {}
    if not verbose and console.is_terminal:
        width = console.width - len(INDENT)
        # a line whose head alone (an object's long name) is too wide is cut too
        cut = {"soft_wrap": False, "no_wrap": True, "overflow": "ellipsis"}
    elif not verbose:
        width, cut = UNCUT, {"soft_wrap": True}
    for line in told:
        markup = INDENT + trace.render_line(line.event, late=line.late, width=width)
        # Console's own print: the demo console's would flush the live traces again
        Console.print(console, markup, **cut)
        if line.event.count > 1 and not NARRATION.counts_told:
            NARRATION.counts_told = True
            Console.print(console, f"{INDENT}[dim]{COUNT_LEGEND}[/dim]")


@dataclass
class LiveTrace:
    """Follows a namespace's Events (the call-chain trace) and Pod phases, printing both.

    Informers run in background threads while the demo acts, so the story appears as it
    happens: each line is held for a moment (gpulab.narrate) so the story prints in causal
    order, not in the order the watches deliver it. ``whole`` adds namespaces told in full
    as the first is (Kueue's two teams: one story, one causal order); ``also`` adds
    namespaces whose Events about the ``nodes`` named are shown too (device plugins and
    kubelet write Node Events into "default"); Events from before the demo started are
    left out.
    """

    api: client.ApiClient
    namespace: str
    also: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    whole: tuple[str, ...] = ()
    seen: list[trace.TraceEvent] = field(default_factory=list)
    _since: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _informers: list[informer.Informer] = field(default_factory=list)
    _phases: dict[str, str] = field(default_factory=dict)
    _narrator: narrate.Narrator = field(default_factory=narrate.Narrator)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ticker: threading.Thread | None = None
    verbose: bool = field(default_factory=lambda: NARRATION.verbose)

    def __enter__(self) -> LiveTrace:
        for ns in (self.namespace, *self.whole, *self.also):
            handlers = informer.Handlers(
                on_add=lambda ev, ns=ns: self._event(ev, ns),
                # a repeat of an Event is its series growing (client-go's aggregation)
                on_update=lambda old, new, ns=ns: (
                    trace.repeated(informer.Delta("MODIFIED", new, old)) and self._event(new, ns)
                ),
            )
            self._informers.append(informer.Informer(trace.events(self.api, ns), handlers))
        for ns in (self.namespace, *self.whole):
            pods = informer.ListWatch(self.api, informer.PODS, namespace=ns)
            handlers = informer.Handlers(
                on_add=self._pod, on_update=lambda _old, new: self._pod(new)
            )
            self._informers.append(informer.Informer(pods, handlers))
        for inf in self._informers:
            inf.start()
        self._ticker = threading.Thread(target=self._tick, name="live-trace", daemon=True)
        self._ticker.start()
        _live.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for inf in self._informers:
            inf.stop()
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        _live.remove(self)
        self.flush()

    def expect(self, steps: set[str], timeout: float = 20.0) -> None:
        """Wait until each step has been seen, then print what is held; Events are written
        asynchronously and a controller's event broadcaster may post them seconds after
        the fact."""
        wait_for(
            lambda: steps <= {ev.step for ev in self.seen},
            timeout,
            f"Events {sorted(steps - {ev.step for ev in self.seen})} in the trace",
        )
        self.flush()

    def flush(self) -> None:
        """Print every line held now (before a tick, and when the story ends)."""
        with self._lock:
            self._print(self._narrator.drain())

    def _tick(self) -> None:
        while not self._stop.wait(TICK):
            with self._lock:
                self._print(self._narrator.due(time.monotonic()))

    def _print(self, told: list[narrate.Told]) -> None:
        print_trace(told, self.verbose)

    def add(self, ev: trace.TraceEvent) -> None:
        """A line of the story seen elsewhere than in Events (a watch of an object's
        state), narrated in its causal place with the rest."""
        with self._lock:
            self.seen.append(ev)
            self._narrator.add(ev, time.monotonic())

    def _wanted(self, ev: trace.TraceEvent, namespace: str) -> bool:
        # a core/v1 Event's time is cut to its second: it may carry a time before _since;
        # a precise one is the demo's if it is at most the narrator's window older (the
        # start-up of a cluster the demo just brought up is not)
        slack = dt.timedelta(seconds=narrate.WINDOW if ev.time.microsecond else 2)
        if ev.time < self._since - slack:
            return False
        if namespace in (self.namespace, *self.whole):
            return True
        return any(ev.regarding == f"Node {node}" for node in self.nodes)

    def _event(self, obj: dict[str, Any], namespace: str) -> None:
        ev = trace.to_trace_event(obj)
        with self._lock:
            if ev in self.seen or not self._wanted(ev, namespace):
                return
            self.seen.append(ev)
            self._narrator.add(ev, time.monotonic())

    def _pod(self, pod: dict[str, Any]) -> None:
        phase = (pod.get("status") or {}).get("phase")
        name = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
        created = pod["metadata"].get("creationTimestamp")
        older = bool(created) and dt.datetime.fromisoformat(
            created.replace("Z", "+00:00")
        ) < self._since - dt.timedelta(seconds=2)
        with self._lock:
            if not phase or self._phases.get(name) == phase:
                return
            first = name not in self._phases
            self._phases[name] = phase
            if first and older:  # a pod of an earlier scene: only its changes are news
                return
            ev = narrate.pod_phase_event(pod, dt.datetime.now(dt.UTC), NARRATION.pod_writer)
            self._narrator.add(ev, time.monotonic())

    def write_diagram(self, path: Path) -> None:
        path.write_text(chain.sequence_diagram(self.seen))  # caller -> callee
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
