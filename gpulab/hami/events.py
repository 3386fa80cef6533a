"""Events of the extender: HAMi's reasons and the lab's call-chain steps, aggregated.

HAMi v2.10.0 ``pkg/scheduler/event.go`` records ``FilteringSucceed``, ``FilteringFailed``,
``BindingSucceed`` and ``BindingFailed`` on the pod through client-go's recorder. Beside
them the lab writes its call-chain step (``Filter``, ``LockNode``, ``Bind`` ...) as
``gpulab.trace`` does, plus the JSON log line of that step.

Repeated identical Events are aggregated the way client-go ``tools/events`` (the
events.k8s.io recorder) does it: Events with the same type, action, reason, reporting
controller/instance and regarding object are one *series*. The first is created; the
second patches that Event with ``series: {count: 2, lastObservedTime}``; later ones only
count in memory, and the count is written when the series has been quiet for 6 minutes
(``finishSeries``) or every 30 minutes (``refreshExistingEventSeries``). So a pod that
fails Filter at every retry has one Warning Event, not one per retry.
Difference, named: upstream HAMi records through the core/v1 recorder
(``record.EventRecorder``, which aggregates by ``count``); the lab writes events.k8s.io/v1
like ``tools/events``, as the rest of the lab's trace does.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpulab.trace import ObjectRef, Tracer
from gpulab.wait import wait_for

_log = logging.getLogger(__name__)

FINISH_SECONDS = 6 * 60
REFRESH_SECONDS = 30 * 60
_NOTE_LIMIT = 1024

# event.go
FILTERING_FAILED = "FilteringFailed"
FILTERING_SUCCEED = "FilteringSucceed"
BINDING_FAILED = "BindingFailed"
BINDING_SUCCEED = "BindingSucceed"


class EventSink(Protocol):
    """Where Events go: events.k8s.io/v1 create and patch (a fake in tests)."""

    def create(self, namespace: str, body: dict[str, Any]) -> None: ...

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class ApiSink:
    def __init__(self, api: client.ApiClient) -> None:
        self._events = client.EventsV1Api(api)

    # the answers are not read: decoding them into client models costs the extender's CPU
    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self._events.create_namespaced_event(namespace, body, _preload_content=False)

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._events.patch_namespaced_event(name, namespace, body, _preload_content=False)


def _micro(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Series:
    """The cached Event of one isomorphic key (client-go's eventCache entry)."""

    body: dict[str, Any]
    first: float
    count: int = 1
    last: float = 0.0
    written: int = 1  # the count the API server has


@dataclass
class EventRecorder:
    """An events.k8s.io/v1 recorder with client-go's series aggregation.

    ``record`` never waits for the API server: Events go through a queue to one worker.
    ``sink`` None records nothing (unit tests without a cluster)."""

    sink: EventSink | None
    instance: str
    clock: Callable[[], float] = time.time
    _cache: dict[tuple[Any, ...], _Series] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _queue: queue.Queue[tuple[str, str, str, dict[str, Any]]] = field(
        default_factory=lambda: queue.Queue(maxsize=10_000)
    )
    _worker: threading.Thread | None = None

    def record(
        self,
        regarding: ObjectRef,
        reason: str,
        note: str,
        *,
        action: str,
        controller: str,
        warning: bool = False,
    ) -> None:
        if self.sink is None:
            return
        now = self.clock()
        kind = "Warning" if warning else "Normal"
        key = (kind, action, reason, controller, self.instance, regarding)
        with self._lock:
            cached = self._cache.get(key)
            if cached is None:
                body = self._body(regarding, reason, note, action, controller, kind, now)
                self._cache[key] = _Series(body, first=now, last=now)
                self._send("create", body)
                return
            cached.count += 1
            cached.last = now
            if cached.count == 2:  # the series starts: the Event is patched once now
                cached.written = 2
                self._send("patch", cached.body, self._series(cached))

    def finish_series(self, now: float | None = None) -> None:
        """``finishSeries``: write the final count of series quiet for 6 minutes and forget
        them; forget single Events older than that."""
        now = self.clock() if now is None else now
        with self._lock:
            for key, s in list(self._cache.items()):
                if s.last > now - FINISH_SECONDS:
                    continue
                if s.count > 1 and s.count != s.written:
                    self._send("patch", s.body, self._series(s))
                del self._cache[key]

    def refresh_series(self) -> None:
        """``refreshExistingEventSeries``: write the current count of running series."""
        with self._lock:
            for s in self._cache.values():
                if s.count > 1 and s.count != s.written:
                    s.written = s.count
                    self._send("patch", s.body, self._series(s))

    def start(self, stop: threading.Event) -> None:
        """The background timers of ``StartRecordingToSink``."""

        def every(period: float, fn: Callable[[], None]) -> None:
            while not stop.wait(period):
                fn()

        for period, fn in (
            (FINISH_SECONDS, self.finish_series),
            (REFRESH_SECONDS, self.refresh_series),
        ):
            threading.Thread(target=every, args=(period, fn), daemon=True).start()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until the queued writes are done (tests and demos); WaitTimeout if not."""
        wait_for(lambda: not self._queue.unfinished_tasks, timeout, "queued Events", 0.02)

    def series_count(self, regarding: ObjectRef, reason: str) -> int:
        """How many times an Event about ``regarding`` with ``reason`` was recorded."""
        with self._lock:
            return sum(
                s.count for k, s in self._cache.items() if k[2] == reason and k[5] == regarding
            )

    @staticmethod
    def _series(s: _Series) -> dict[str, Any]:
        return {
            "series": {
                "count": s.count,
                "lastObservedTime": _micro(dt.datetime.fromtimestamp(s.last, dt.UTC)),
            }
        }

    def _body(
        self,
        ref: ObjectRef,
        reason: str,
        note: str,
        action: str,
        controller: str,
        kind: str,
        now: float,
    ) -> dict[str, Any]:
        when = dt.datetime.fromtimestamp(now, dt.UTC)
        regarding = {"kind": ref.kind, "name": ref.name, "apiVersion": ref.api_version}
        if ref.namespace:
            regarding["namespace"] = ref.namespace
        if ref.uid:
            regarding["uid"] = ref.uid
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                # named like client-go's recorder: <object>.<hex nanoseconds>
                "name": f"{ref.name[:200]}.{int(now * 1e9):x}".lower(),
                "namespace": ref.namespace or "default",
            },
            "eventTime": _micro(when),
            "reportingController": controller,
            "reportingInstance": self.instance[:128],
            "action": action,
            "reason": reason,
            "type": kind,
            "note": note[:_NOTE_LIMIT],
            "regarding": regarding,
        }

    def _send(self, verb: str, body: dict[str, Any], patch: dict[str, Any] | None = None) -> None:
        meta = body["metadata"]
        item = (verb, meta["namespace"], meta["name"], patch if patch is not None else body)
        with_worker = self._worker is None
        if with_worker:
            self._worker = threading.Thread(target=self._run, name="hami-events", daemon=True)
            self._worker.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            _log.warning("event queue full; dropping %s %s", verb, meta["name"])

    def _run(self) -> None:
        assert self.sink is not None
        while True:
            verb, namespace, name, body = self._queue.get()
            try:
                if verb == "create":
                    self.sink.create(namespace, body)
                else:
                    self.sink.patch(namespace, name, body)
            except ApiException as exc:
                _log.warning("could not %s Event %s: %s %s", verb, name, exc.status, exc.reason)
            except Exception as exc:  # the API server may be gone; never kill the component
                _log.warning("could not %s Event %s: %s", verb, name, exc)
            finally:
                self._queue.task_done()


class SchedulerEvents:
    """The extender's two voices: HAMi's Event reasons (reporting controller
    ``hami-scheduler``, as upstream's recorder source) and the lab's call-chain step
    (``gpulab.io/hami-scheduler``, plus its JSON log line)."""

    def __init__(self, recorder: EventRecorder, scheduler_name: str, stream: Any = None) -> None:
        self.recorder = recorder
        self.scheduler_name = scheduler_name or "hami-scheduler"
        self.log = Tracer("hami-scheduler", None, stream=stream or sys.stderr)

    def step(
        self, step: str, ref: ObjectRef, message: str, *, warning: bool = False, **detail: Any
    ) -> None:
        self.log.step(step, ref, message, warning=warning, **detail)
        self.recorder.record(
            ref, step, message, action=step, controller="gpulab.io/hami-scheduler", warning=warning
        )

    def hami(
        self, ref: ObjectRef, reason: str, message: str, *, action: str, warning: bool
    ) -> None:
        """``recordScheduleFilterResultEvent`` / ``recordScheduleBindingResultEvent``."""
        self.recorder.record(
            ref, reason, message, action=action, controller=self.scheduler_name, warning=warning
        )
