"""List-then-watch, the one way the lab follows the API server (cf. client-go ``tools/cache``).

    ListWatch   one resource (optionally one namespace, field/label selectors): ``list``
                and ``watch`` over raw JSON, so objects are the dicts the API server serves
    reflect()   client-go's Reflector: list, hand the items over, watch from the list's
                resourceVersion; on 410 Gone, a dropped connection or an API-server restart,
                list again and hand over only what changed meanwhile. Runs until ``stop``
    Store       the informer's cache: the latest version of every object, by key
    Informer    a thread running reflect() into a Store and calling handlers
                (on_add / on_update / on_delete, like ResourceEventHandlerFuncs), with an
                optional resync that re-delivers every object as an update
    follow()    reflect() in the caller's thread, as an iterator (demos, `gpulab trace`)

Handlers run on the informer's thread; as in client-go they should be quick (enqueue a
key, update a cache) and leave API calls to a worker. An exception in a handler is logged,
never swallowed silently, and does not stop the informer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

_log = logging.getLogger("gpulab.informer")

Obj = dict[str, Any]

# As client-go: a watch is re-opened every few minutes even when nothing happens, so a
# half-dead connection is noticed.
WATCH_SECONDS = 300
_BACKOFF_INITIAL = 0.2
_BACKOFF_MAX = 5.0


@dataclass(frozen=True)
class Resource:
    """An API resource: ``Resource("", "v1", "pods")``, ``Resource("kueue.x-k8s.io", ...)``."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str = ""
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{namespace}"
        return f"{base}/{self.plural}"


PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICES = Resource("", "v1", "services", "Service")
JOBS = Resource("batch", "v1", "jobs", "Job")
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")


def key_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name``, or ``name`` for cluster-scoped objects (client-go's MetaNamespaceKey)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


class WatchStream:
    """One open watch: iterate (type, object); ``close`` ends it from any thread."""

    def __init__(self, response: Any) -> None:
        self._response = response
        self._closing = threading.Lock()
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        pending = b""
        for chunk in self._response.stream(64 * 1024, decode_content=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    event = json.loads(line)
                    yield event.get("type", ""), event.get("object") or {}
        if pending.strip():
            event = json.loads(pending)
            yield event.get("type", ""), event.get("object") or {}

    def close(self) -> None:
        # Called by the watching thread when its watch ends and by Informer.stop from
        # another thread, possibly at once: the first call closes, the second does nothing.
        with self._closing:
            if self._closed:
                return
            self._closed = True
        # shutdown() interrupts a read blocked in another thread; close() alone would not.
        # A watch the server ended (timeoutSeconds) was read to its end and its connection
        # is back in the pool already: urllib3 refuses to shut that one down
        # (RuntimeError); a socket the stream's end closed meanwhile is EBADF (OSError).
        # Either way the read is over.
        shutdown = getattr(self._response, "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(OSError, RuntimeError):
                shutdown()
        self._response.release_conn()


class ListWatch:
    """List and watch one resource through the official client's connection settings."""

    def __init__(
        self,
        api: client.ApiClient,
        resource: Resource,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> None:
        self.api = api
        self.resource = resource
        self.namespace = namespace
        self._selectors = [
            (k, v)
            for k, v in (("fieldSelector", field_selector), ("labelSelector", label_selector))
            if v
        ]

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        selected = "".join(f" {k}={v}" for k, v in self._selectors)
        return f"{self.resource.plural}{where}{selected}"

    def _get(self, query: list[tuple[str, Any]], read_timeout: float | None) -> Any:
        return self.api.call_api(
            self.resource.path(self.namespace),
            "GET",
            query_params=[*self._selectors, *query],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=(10, read_timeout) if read_timeout else 60,
        )

    def list(self) -> tuple[list[Obj], str]:
        """Every object and the list's resourceVersion."""
        response = self._get([], None)
        body = json.loads(response.data)
        items = body.get("items") or []
        kind = self.resource.kind
        for item in items:  # a list's items carry no apiVersion/kind; handlers want them
            item.setdefault("apiVersion", self.resource.api_version)
            if kind:
                item.setdefault("kind", kind)
        return items, str(body.get("metadata", {}).get("resourceVersion", ""))

    def watch(self, rv: str, timeout_seconds: int = WATCH_SECONDS) -> WatchStream:
        """Events after ``rv`` (bookmarks included), for at most ``timeout_seconds``."""
        query = [
            ("watch", "true"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_seconds),
        ]
        # the server ends the watch after timeout_seconds; a silent connection, later
        return WatchStream(self._get(query, timeout_seconds + 30))


class Store:
    """The latest version of every object, by key; safe to read from any thread."""

    def __init__(self) -> None:
        self._items: dict[str, Obj] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._items.get(key)

    def list(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def replace(self, items: list[Obj]) -> list[Delta]:
        """Swap in a fresh listing; return what changed against what was held."""
        fresh = {key_of(o): o for o in items}
        with self._lock:
            old, self._items = self._items, fresh
        deltas = [Delta("DELETED", o, o) for k, o in old.items() if k not in fresh]
        for k, o in fresh.items():
            before = old.get(k)
            if before is None:
                deltas.append(Delta("ADDED", o, None))
            elif resource_version(before) != resource_version(o):
                deltas.append(Delta("MODIFIED", o, before))
        return deltas

    def apply(self, type_: str, obj: Obj) -> Obj | None:
        """Apply one watch event; return the version held before it."""
        key = key_of(obj)
        with self._lock:
            old = self._items.get(key)
            if type_ == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = obj
        return old


@dataclass(frozen=True)
class Delta:
    """One change: ADDED, MODIFIED or DELETED ``obj``; ``old`` is the version held before."""

    type: str
    obj: Obj
    old: Obj | None = None


SYNCED = "SYNCED"


def reflect(
    lw: ListWatch,
    store: Store,
    stop: threading.Event,
    watch_seconds: int = WATCH_SECONDS,
    streams: list[WatchStream] | None = None,
) -> Iterator[Delta]:
    """client-go's Reflector as a generator: yields every change until ``stop`` is set.

    The first listing arrives as ADDED deltas followed by one ``SYNCED`` delta (client-go's
    HasSynced); later re-listings (after 410 Gone or an error) yield only the
    differences. The open watch is kept in ``streams`` (if given) so another thread can
    close it to stop promptly.
    """
    backoff = _BACKOFF_INITIAL
    synced = False
    while not stop.is_set():
        try:
            items, rv = lw.list()
            yield from store.replace(items)
            if not synced:
                synced = True
                yield Delta(SYNCED, {})
            backoff = _BACKOFF_INITIAL
            while not stop.is_set():
                rv = yield from _watch_once(lw, store, rv, watch_seconds, stop, streams)
                if not rv:  # the resourceVersion expired: list again
                    break
        except ApiException as exc:
            if exc.status == 410:
                _log.info("%s: resourceVersion too old; listing again", lw)
                continue
            _log.warning("%s: %s %s; listing again in %.1fs", lw, exc.status, exc.reason, backoff)
        except Exception as exc:  # an API-server restart, a dropped connection
            if stop.is_set():
                return
            _log.warning("%s: %s; listing again in %.1fs", lw, exc, backoff)
        stop.wait(backoff)
        backoff = min(backoff * 2, _BACKOFF_MAX)


def _watch_once(
    lw: ListWatch,
    store: Store,
    rv: str,
    seconds: int,
    stop: threading.Event,
    streams: list[WatchStream] | None,
) -> Iterator[Delta]:
    """One watch from ``rv``: yields deltas; returns the last resourceVersion seen, or ""
    when the server says it is too old (410)."""
    stream = lw.watch(rv, seconds)
    if streams is not None:
        streams.append(stream)
    try:
        for type_, obj in stream:
            if stop.is_set():
                return rv
            if type_ == "ERROR":
                if obj.get("code") == 410:
                    _log.info("%s: watch expired (410); listing again", lw)
                else:
                    _log.warning("%s: watch error %s; listing again", lw, obj.get("message"))
                return ""
            rv = resource_version(obj) or rv
            if type_ == "BOOKMARK":
                continue
            old = store.apply(type_, obj)
            yield Delta(type_, obj, old)
    finally:
        if streams is not None:
            streams.remove(stream)
        stream.close()
    return rv


def follow(lw: ListWatch, stop: threading.Event | None = None) -> Iterator[Delta]:
    """Every object now (as ADDED, then one SYNCED) and every change after, in the
    caller's thread. Ends when ``stop`` is set (checked at each event and at the watch's
    timeout)."""
    return reflect(lw, Store(), stop or threading.Event())


@dataclass
class Handlers:
    """What an informer calls (client-go's ResourceEventHandlerFuncs); any may be None."""

    on_add: Callable[[Obj], None] | None = None
    on_update: Callable[[Obj, Obj], None] | None = None
    on_delete: Callable[[Obj], None] | None = None


@dataclass
class Informer:
    """A background list+watch of one resource into :attr:`store`, calling ``handlers``.

    ``resync`` (seconds) re-delivers every cached object as ``on_update(obj, obj)`` that
    often, as client-go's resync period does, for controllers that re-check the world
    periodically.
    """

    lw: ListWatch
    handlers: Handlers = field(default_factory=Handlers)
    resync: float | None = None
    name: str = ""
    store: Store = field(default_factory=Store)
    _stop: threading.Event = field(default_factory=threading.Event)
    _synced: threading.Event = field(default_factory=threading.Event)
    _streams: list[WatchStream] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    # handlers never run concurrently (the watch and the resync share one processor)
    _dispatching: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Informer:
        label = self.name or f"informer-{self.lw.resource.plural}"
        targets = [self._run] + ([self._resync_loop] if self.resync else [])
        for target in targets:
            thread = threading.Thread(target=target, name=label, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for stream in list(self._streams):
            stream.close()

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _run(self) -> None:
        for delta in reflect(self.lw, self.store, self._stop, streams=self._streams):
            if delta.type == SYNCED:
                self._synced.set()
            else:
                self._dispatch(delta)

    def _dispatch(self, delta: Delta) -> None:
        h = self.handlers
        with self._dispatching:
            self._call(h, delta)

    def _call(self, h: Handlers, delta: Delta) -> None:
        try:
            if delta.type == "ADDED" and h.on_add:
                h.on_add(delta.obj)
            elif delta.type == "MODIFIED" and h.on_update:
                h.on_update(delta.old or delta.obj, delta.obj)
            elif delta.type == "DELETED" and h.on_delete:
                h.on_delete(delta.obj)
        except Exception:
            _log.exception("%s: handler failed on %s %s", self.lw, delta.type, key_of(delta.obj))

    def _resync_loop(self) -> None:
        assert self.resync is not None
        while not self._stop.wait(self.resync):
            if self.has_synced():
                for obj in self.store.list():
                    self._dispatch(Delta("MODIFIED", obj, obj))
