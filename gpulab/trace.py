"""The call-chain trace every component writes (DESIGN.md section 4).

One step of an upstream call chain (``ListAndWatch``, ``Allocate``, ``Filter``, ``Bind``,
``Reconcile`` ...) becomes
- a Kubernetes Event (events.k8s.io/v1) on the object concerned, with ``reason`` = the
  step and ``reportingController`` = the component, so ``kubectl get events`` tells the
  story on any backend, and
- one JSON log line on stderr with the same fields plus the detail.

Events are posted from a background thread: a component's hot path (an extender's
``/filter``, a plugin's ``Allocate``) never waits for the API server. Repeated Events are
aggregated as client-go's ``tools/events`` broadcaster (v0.36.3) does: an Event with the
same type, action, reason, reporter and object as one recorded in the last 6 minutes is
not written again (the lab also requires the same note, as kubelet's legacy recorder
does, so a series never shows an older note for a newer step); the first repeat turns
the original into a series (``series.count`` 2, PATCHed at once), later repeats only
count in memory and the series is written back every 30 minutes and when it ends (6
minutes without a repeat). The JSON log line is
written for every step.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from rich.cells import cell_len, set_cell_size
from rich.markup import escape
from rich.text import Text

from gpulab.informer import EVENTS, SYNCED, Delta, ListWatch, Store, reflect

_log = logging.getLogger("gpulab.trace")

# events.k8s.io/v1 limits `note` to 1 kB.
_NOTE_LIMIT = 1024
# client-go tools/events: finishTime and refreshTime
SERIES_FINISH = 360.0
SERIES_REFRESH = 1800.0
TEND_EVERY = 5.0  # seconds between two checks for series to finish or refresh


@dataclass
class _Recorded:
    """An Event written to the API server, and its series (client-go's eventCache)."""

    event: client.EventsV1Event
    count: int = 1
    last: dt.datetime | None = None
    refreshed: float = 0.0


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about (the `regarding` field)."""

    kind: str
    name: str
    namespace: str | None = None
    uid: str | None = None
    api_version: str = "v1"
    # a part of the object, as kubelet names a container: "spec.containers{web}"
    field_path: str | None = None

    @classmethod
    def of(cls, obj: Any) -> ObjectRef:
        """Build a reference from a kubernetes-client model or a plain dict."""
        if isinstance(obj, Mapping):
            meta = obj.get("metadata", {})
            return cls(
                kind=obj.get("kind", ""),
                name=meta.get("name", ""),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                api_version=obj.get("apiVersion", "v1"),
            )
        meta = obj.metadata
        return cls(
            kind=obj.kind or type(obj).__name__.removeprefix("V1"),
            name=meta.name,
            namespace=meta.namespace,
            uid=meta.uid,
            api_version=obj.api_version or "v1",
        )

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


class Tracer:
    """Records call-chain steps for one component.

    ``api`` may be None (unit tests, a component running without a cluster): then only
    the JSON log line is written.
    """

    def __init__(
        self,
        component: str,
        api: client.ApiClient | None = None,
        instance: str | None = None,
        stream: Any = None,
    ) -> None:
        self.component = component
        self.instance = instance or component
        self._stream = stream or sys.stderr
        self._events = client.EventsV1Api(api) if api is not None else None
        # (create | patch, event); the worker thread writes them in order
        self._queue: queue.Queue[tuple[str, client.EventsV1Event]] = queue.Queue(maxsize=10_000)
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._recorded: dict[tuple[Any, ...], _Recorded] = {}
        # One Configuration for every Event model built here: without it each model
        # (Event, ObjectMeta, ObjectReference) builds or deep-copies its own, which cost
        # more than the rest of a step (an extender's /filter records two).
        self._models = client.Configuration()
        self._next_tend = 0.0

    def step(
        self,
        step: str,
        regarding: ObjectRef | None,
        message: str,
        *,
        warning: bool = False,
        **detail: Any,
    ) -> None:
        """Record one step: a JSON log line now, an Event soon after."""
        now = dt.datetime.now(dt.UTC)
        line = {
            "ts": now.isoformat(timespec="milliseconds"),
            "component": self.component,
            "step": step,
            "object": str(regarding) if regarding else None,
            "message": message,
        }
        line.update(detail)
        self._stream.write(json.dumps(line, default=str) + "\n")
        self._stream.flush()
        if self._events is None or regarding is None:
            return
        self._ensure_worker()
        event = self._event(step, regarding, message, warning, now)
        # client-go's key plus the note: a series never shows an older note for a newer step
        key = (event.type, step, event.reporting_controller, self.instance, regarding, message)
        with self._lock:
            recorded = self._recorded.get(key)
            if recorded is None:
                self._recorded[key] = _Recorded(event, refreshed=time.monotonic())
                self._enqueue("create", event)
                return
            recorded.count += 1
            recorded.last = now
            if recorded.count == 2:  # the first repeat starts the series at once
                self._enqueue("patch", self._series(recorded))

    def _enqueue(self, op: str, event: client.EventsV1Event) -> None:
        try:
            self._queue.put_nowait((op, event))
        except queue.Full:
            _log.warning("trace queue full; dropping Event %s", event.reason)

    @staticmethod
    def _series(recorded: _Recorded) -> client.EventsV1Event:
        # a copy: the original may still wait in the queue to be created (shallow: only
        # `series` differs, and the shared parts are never changed)
        event = copy.copy(recorded.event)
        event.series = client.EventsV1EventSeries(
            count=recorded.count,
            last_observed_time=recorded.last,
            local_vars_configuration=recorded.event.local_vars_configuration,
        )
        return event

    def _tend_series(self) -> None:
        """client-go's refreshExistingEventSeries (30 min) and finishSeries (6 min)."""
        now = dt.datetime.now(dt.UTC)
        mono = time.monotonic()
        with self._lock:
            for key, rec in list(self._recorded.items()):
                last = rec.last or rec.event.event_time
                finished = (now - last).total_seconds() > SERIES_FINISH
                if rec.count > 1 and (finished or mono - rec.refreshed > SERIES_REFRESH):
                    rec.refreshed = mono
                    self._enqueue("patch", self._series(rec))
                if finished:
                    del self._recorded[key]

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued Event has been posted (demos and tests call this)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _ensure_worker(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name=f"trace-{self.component}", daemon=True
                )
                self._worker.start()

    def _run(self) -> None:
        assert self._events is not None
        while True:
            try:
                op, event = self._queue.get(timeout=60)
            except queue.Empty:
                self._tend_series()
                continue
            try:
                self._write(op, event)
            except ApiException as exc:
                _log.warning("could not post Event %s: %s %s", event.reason, exc.status, exc.reason)
            except Exception as exc:  # the API server may be gone; never kill the component
                _log.warning("could not post Event %s: %s", event.reason, exc)
            finally:
                self._queue.task_done()
            if self._queue.empty() and time.monotonic() >= self._next_tend:
                # a walk over every Event of the last 6 minutes, under the lock step()
                # takes: not after each write (client-go tends on minute tickers)
                self._next_tend = time.monotonic() + TEND_EVERY
                self._tend_series()

    def _write(self, op: str, event: client.EventsV1Event) -> None:
        assert self._events is not None
        ns = event.metadata.namespace
        if op == "patch":
            series = {
                "count": event.series.count,
                "lastObservedTime": event.series.last_observed_time.strftime(
                    "%Y-%m-%dT%H:%M:%S.%fZ"
                ),
            }
            try:
                self._events.patch_namespaced_event(event.metadata.name, ns, {"series": series})
                return
            except ApiException as exc:
                if exc.status != 404:  # the Event expired meanwhile: create it again
                    raise
        self._events.create_namespaced_event(ns, event)

    def _event(
        self, step: str, ref: ObjectRef, message: str, warning: bool, now: dt.datetime
    ) -> client.EventsV1Event:
        # Cluster-scoped objects (Node, ClusterQueue ...) get their Events in "default",
        # as kubelet does for Node events.
        namespace = ref.namespace or "default"
        models = self._models
        return client.EventsV1Event(
            # named like client-go's recorder: <object>.<hex nanoseconds>
            metadata=client.V1ObjectMeta(
                name=f"{ref.name[:200]}.{time.time_ns():x}".lower(),
                namespace=namespace,
                local_vars_configuration=models,
            ),
            event_time=now,
            reporting_controller=f"gpulab.io/{self.component}",
            reporting_instance=self.instance[:128],
            action=step,
            reason=step,
            type="Warning" if warning else "Normal",
            note=message[:_NOTE_LIMIT],
            regarding=client.V1ObjectReference(
                kind=ref.kind,
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
                api_version=ref.api_version,
                field_path=ref.field_path,
                local_vars_configuration=models,
            ),
            local_vars_configuration=models,
        )


@dataclass(frozen=True)
class TraceEvent:
    """One Event as the reader sees it, whoever wrote it (our components or upstream)."""

    time: dt.datetime
    component: str
    step: str
    regarding: str
    note: str
    warning: bool
    count: int = 1  # how often it happened (an Event series)


def _time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def to_trace_event(ev: Mapping[str, Any]) -> TraceEvent:
    """An Event as the core/v1 API serves it (a dict), as a trace step.

    Read through core/v1: it shows Events written with either API (kube-scheduler and the
    Job controller still write core/v1 ones).
    """
    obj = ev.get("involvedObject") or {}
    meta = ev.get("metadata") or {}
    series = ev.get("series") or {}
    when = (
        _time(series.get("lastObservedTime"))
        or _time(ev.get("eventTime"))
        or _time(ev.get("lastTimestamp"))
        or _time(ev.get("firstTimestamp"))
        or _time(meta.get("creationTimestamp"))
    )
    component = ev.get("reportingComponent") or (ev.get("source") or {}).get("component") or "?"
    where = f"{obj['namespace']}/" if obj.get("namespace") else ""
    return TraceEvent(
        time=when or dt.datetime.now(dt.UTC),
        component=component.removeprefix("gpulab.io/"),
        step=ev.get("reason") or ev.get("action") or "?",
        regarding=f"{obj.get('kind')} {where}{obj.get('name')}" if obj else "?",
        note=ev.get("message") or "",
        warning=ev.get("type") == "Warning",
        count=int(series.get("count") or ev.get("count") or 1),
    )


def repeated(delta: Delta) -> bool:
    """Whether a watch event is a new occurrence: a new Event, or a series that grew."""
    if delta.type == "ADDED":
        return True
    if delta.type != "MODIFIED" or delta.old is None:
        return False
    return to_trace_event(delta.obj).count > to_trace_event(delta.old).count


def events(api: client.ApiClient, namespace: str) -> ListWatch:
    """The core/v1 Events of ``namespace``, to follow with gpulab.informer."""
    return ListWatch(api, EVENTS, namespace=namespace)


def follow(
    api: client.ApiClient, namespace: str, stop: threading.Event | None = None
) -> Iterator[TraceEvent]:
    """Yield the Events of ``namespace`` as they are written (existing ones first, oldest
    first), until ``stop`` is set."""
    first: list[TraceEvent] | None = []
    for delta in reflect(events(api, namespace), Store(), stop or threading.Event()):
        if delta.type == SYNCED and first is not None:
            yield from sorted(first, key=lambda e: e.time)
            first = None
        elif repeated(delta):
            ev = to_trace_event(delta.obj)
            if first is None:
                yield ev
            else:
                first.append(ev)


def render_line(ev: TraceEvent, late: bool = False, width: int | None = None) -> str:
    """One trace step as rich markup, the way demos and `gpulab trace` print it.

    The Event's own text is escaped: rich would read "[gpu-a100]" in a note as a tag and
    drop it ("Successfully binding node  to ..."). ``late``: printed after a step that
    happened later (gpulab.narrate), marked so rather than silently out of order.
    ``width``: the compact line, no wider than that: the note on one line, GPU UUIDs
    shortened and the rest cut with "…"; None prints the note in full.
    """
    colour = "red" if ev.warning else "cyan"
    times = f" [dim](x{ev.count})[/dim]" if ev.count > 1 else ""
    marks = times + (" [dim](late)[/dim]" if late else "")
    head = (
        f"[dim]{ev.time.astimezone().strftime('%H:%M:%S')}[/dim] "
        f"[bold magenta]{escape(f'{ev.component:<22}')}[/bold magenta] "
        f"[bold {colour}]{escape(f'{ev.step:<18}')}[/bold {colour}] "
        f"[green]{escape(ev.regarding)}[/green]  "
    )
    note = ev.note
    if width is not None:
        room = width - Text.from_markup(head + marks).cell_len
        note = fit(compact(note), room)
    return head + escape(note) + marks


# a GPU UUID as NVML reports it: GPU-8-4-4-4-12 hex digits
_GPU_UUID = re.compile(
    r"\bGPU-([0-9a-fA-F]{8})-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)


# any other UUID (an object's UID, a MIG device): 8-4-4-4-12 hex digits
_UUID = re.compile(
    r"\b([0-9a-fA-F]{8})-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)


def compact(note: str) -> str:
    """``note`` on one line, each GPU UUID cut to its first 8 hex digits (GPU-1a2b3c4d),
    and so any other UUID (a Workload's UID, a MIG device): enough to tell them apart,
    a quarter of the width."""
    return _UUID.sub(r"\1", _GPU_UUID.sub(r"GPU-\1", " ".join(note.split())))


def fit(text: str, room: int) -> str:
    """``text`` cut to ``room`` terminal cells, "…" marking the cut."""
    if cell_len(text) <= room:
        return text
    return set_cell_size(text, room - 1) + "…" if room > 0 else ""


def sequence_diagram(events: list[TraceEvent]) -> str:
    """A Mermaid sequence diagram of a run: one arrow per step, component → object kind."""
    lines = ["```mermaid", "sequenceDiagram"]
    for ev in events:
        target = ev.regarding.split(" ", 1)[0] or "?"
        note = ev.note.replace("\n", " ").replace(";", ",")[:80]
        lines.append(
            f"    {_participant(ev.component)}->>{_participant(target)}: {ev.step}: {note}"
        )
    lines.append("```")
    return "\n".join(lines) + "\n"


def _participant(name: str) -> str:
    # Mermaid participant ids may not contain '/', ':' or spaces
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
