"""gpulab.informer: the reflector's list/watch/relist logic against a scripted ListWatch.

(The HTTP side, against a server speaking the wire format: tests/component/test_informer_http.py.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpulab.informer import SYNCED, Delta, Handlers, Informer, Resource, Store, key_of, reflect
from gpulab.wait import wait_for


def obj(name: str, rv: str, ns: str | None = "ns", **data: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta, **data}


class Stream:
    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self.closed = False

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from self.events

    def close(self) -> None:
        self.closed = True


class ScriptedListWatch:
    """Each list() and watch() call takes the next answer from its script (an exception
    in a script is raised)."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []
        self.stop = threading.Event()

    resource = Resource("", "v1", "things")

    def __str__(self) -> str:
        return "scripted"

    def list(self) -> tuple[list[dict[str, Any]], str]:
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(self, rv: str, timeout_seconds: int = 0) -> Stream:
        self.watched_from.append(rv)
        if not self.watches:
            self.stop.set()
            return Stream([])
        answer = self.watches.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Stream(answer)


def run(lw: ScriptedListWatch, store: Store | None = None) -> list[tuple[str, str]]:
    deltas = reflect(lw, Store() if store is None else store, lw.stop)  # type: ignore[arg-type]
    return [(d.type, key_of(d.obj)) for d in deltas if d.type != SYNCED]


def test_list_then_watch_from_the_lists_resource_version() -> None:
    lw = ScriptedListWatch(
        lists=[([obj("a", "1"), obj("b", "2")], "2")],
        watches=[
            [("ADDED", obj("c", "3")), ("MODIFIED", obj("a", "4")), ("DELETED", obj("b", "5"))]
        ],
    )
    store = Store()
    assert run(lw, store) == [
        ("ADDED", "ns/a"),
        ("ADDED", "ns/b"),
        ("ADDED", "ns/c"),
        ("MODIFIED", "ns/a"),
        ("DELETED", "ns/b"),
    ]
    assert lw.watched_from == ["2", "5"]  # the second watch resumes after the last event
    assert sorted(store.keys()) == ["ns/a", "ns/c"]


def test_the_first_listing_ends_with_one_synced_marker() -> None:
    lw = ScriptedListWatch(
        lists=[([obj("a", "1")], "1"), ([obj("a", "2")], "2")],
        watches=[[("ERROR", {"code": 410})]],
    )
    types = [d.type for d in reflect(lw, Store(), lw.stop)]  # type: ignore[arg-type]
    assert types == ["ADDED", SYNCED, "MODIFIED"]  # no second marker after a relist


def test_bookmarks_move_the_resource_version_without_an_event() -> None:
    lw = ScriptedListWatch(lists=[([], "1")], watches=[[("BOOKMARK", obj("", "9"))]])
    assert run(lw) == []
    assert lw.watched_from == ["1", "9"]


def test_410_relists_and_delivers_only_the_difference() -> None:
    lw = ScriptedListWatch(
        lists=[
            ([obj("a", "1"), obj("b", "1"), obj("c", "1")], "1"),
            # meanwhile: a changed, b was deleted, d was created, c unchanged
            ([obj("a", "7"), obj("c", "1"), obj("d", "8")], "8"),
        ],
        watches=[[("ERROR", {"code": 410, "message": "too old"})], []],
    )
    events = run(lw)
    assert events[:3] == [("ADDED", "ns/a"), ("ADDED", "ns/b"), ("ADDED", "ns/c")]
    assert sorted(events[3:]) == [("ADDED", "ns/d"), ("DELETED", "ns/b"), ("MODIFIED", "ns/a")]
    assert lw.watched_from == ["1", "8", "8"]


def test_a_failed_list_is_retried_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    lw = ScriptedListWatch(
        lists=[ConnectionRefusedError("apiserver down"), ([obj("a", "1")], "1")], watches=[]
    )
    assert run(lw) == [("ADDED", "ns/a")]
    assert "apiserver down" in caplog.text


def test_store_replace_reports_changes_only() -> None:
    store = Store()
    store.replace([obj("a", "1"), obj("x", "1", ns=None)])
    deltas = store.replace([obj("a", "1"), obj("x", "2", ns=None)])
    assert deltas == [Delta("MODIFIED", obj("x", "2", ns=None), obj("x", "1", ns=None))]


def test_informer_calls_handlers_and_keeps_running_after_a_handler_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lw = ScriptedListWatch(
        lists=[([obj("a", "1")], "1")],
        watches=[
            [("ADDED", obj("boom", "2")), ("MODIFIED", obj("a", "3")), ("DELETED", obj("a", "4"))]
        ],
    )
    seen: list[str] = []

    def on_add(o: dict[str, Any]) -> None:
        if o["metadata"]["name"] == "boom":
            raise RuntimeError("handler bug")
        seen.append("add " + key_of(o))

    handlers = Handlers(
        on_add=on_add,
        on_update=lambda old, new: seen.append(
            f"update {old['metadata']['resourceVersion']}->{new['metadata']['resourceVersion']}"
        ),
        on_delete=lambda o: seen.append("delete " + key_of(o)),
    )
    informer = Informer(lw, handlers)  # type: ignore[arg-type]
    informer._stop = lw.stop
    informer.start()
    wait_for(lambda: len(seen) == 3, 5, "three handler calls")
    assert seen == ["add ns/a", "update 1->3", "delete ns/a"]
    assert informer.has_synced()
    assert "handler bug" in caplog.text


def test_resync_redelivers_every_object_as_an_update() -> None:
    lw = ScriptedListWatch(lists=[([obj("a", "1")], "1")], watches=[])
    lw.watches = [[] for _ in range(1000)]  # keep watching (empty watches) until stopped
    updates: list[str] = []
    informer = Informer(
        lw,  # type: ignore[arg-type]
        Handlers(on_update=lambda old, new: updates.append(key_of(new))),
        resync=0.05,
    )
    informer.start()
    try:
        wait_for(lambda: len(updates) >= 2, 5, "two resyncs")
    finally:
        informer.stop()
        lw.stop.set()
    assert set(updates) == {"ns/a"}
