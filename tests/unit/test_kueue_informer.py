"""The informer: list first, then watch; relist when the watch says the version is gone."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

from gpulab.kueue.controllers.client import WORKLOADS, Resource
from gpulab.kueue.controllers.informer import SYNC, Event, Informer


class FakeKube:
    def __init__(self, stop: threading.Event) -> None:
        self.lists = 0
        self.watched_from: list[str] = []
        self._stop = stop

    def list(self, res: Resource) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.lists > 2:
            self._stop.set()
        return [{"metadata": {"name": f"w{self.lists}", "namespace": "ns"}}], str(self.lists * 10)

    def watch(self, res: Resource, rv: str) -> Iterator[dict[str, Any]]:
        self.watched_from.append(rv)
        yield {"type": "ADDED", "object": {"metadata": {"name": "new", "resourceVersion": "11"}}}
        yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}
        yield {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}


def test_list_watch_relist() -> None:
    stop = threading.Event()
    kube = FakeKube(stop)
    events: queue.Queue[Event] = queue.Queue()
    informer = Informer(kube, WORKLOADS, events, stop)  # type: ignore[arg-type]
    informer.start()
    assert stop.wait(5)
    got = []
    while not events.empty():
        got.append(events.get())
    assert [e.type for e in got[:3]] == [SYNC, "ADDED", SYNC]
    assert got[0].items[0]["metadata"]["name"] == "w1"
    assert got[1].obj["metadata"]["name"] == "new"
    assert kube.watched_from[:2] == ["10", "20"]  # each watch starts at its listing
