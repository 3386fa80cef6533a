"""Event aggregation (gpulab.hami.events): isomorphic Events become one series, as
client-go's events.k8s.io recorder (tools/events) writes them."""

from __future__ import annotations

from typing import Any

from gpulab.hami.events import FINISH_SECONDS, EventRecorder
from gpulab.trace import ObjectRef

POD = ObjectRef("Pod", "p", "ns", "uid-p")


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(("create", body["metadata"]["name"], body))

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.calls.append(("patch", name, body))


def recorder() -> tuple[EventRecorder, Sink, list[float]]:
    sink, now = Sink(), [1000.0]
    return EventRecorder(sink, "hami-scheduler-host", clock=lambda: now[0]), sink, now


def test_thirty_identical_warnings_are_one_event_with_a_series() -> None:
    rec, sink, now = recorder()
    for i in range(30):
        now[0] += 1
        rec.record(
            POD,
            "FilteringFailed",
            f"attempt {i}",
            action="Filter",
            controller="hami-scheduler",
            warning=True,
        )
    rec.flush()
    verbs = [c[0] for c in sink.calls]
    assert verbs == ["create", "patch"]  # the second starts the series; the rest only count
    created, patched = sink.calls
    assert created[2]["type"] == "Warning" and created[2]["reason"] == "FilteringFailed"
    assert created[2]["regarding"] == {
        "kind": "Pod",
        "name": "p",
        "apiVersion": "v1",
        "namespace": "ns",
        "uid": "uid-p",
    }
    assert patched[1] == created[1] and patched[2]["series"]["count"] == 2
    assert rec.series_count(POD, "FilteringFailed") == 30
    # quiet for 6 minutes: the final count is written and the series forgotten
    rec.finish_series(now[0] + FINISH_SECONDS + 1)
    rec.flush()
    assert sink.calls[-1][0] == "patch" and sink.calls[-1][2]["series"]["count"] == 30
    assert rec.series_count(POD, "FilteringFailed") == 0


def test_different_reasons_objects_or_types_are_different_events() -> None:
    rec, sink, _ = recorder()
    rec.record(
        POD, "FilteringFailed", "x", action="Filter", controller="hami-scheduler", warning=True
    )
    rec.record(POD, "FilteringSucceed", "x", action="Filter", controller="hami-scheduler")
    rec.record(
        POD, "Filter", "x", action="Filter", controller="gpulab.io/hami-scheduler", warning=True
    )
    rec.record(
        ObjectRef("Pod", "q", "ns"),
        "FilteringFailed",
        "x",
        action="Filter",
        controller="hami-scheduler",
        warning=True,
    )
    rec.flush()
    assert [c[0] for c in sink.calls] == ["create"] * 4


def test_refresh_writes_the_running_count_once() -> None:
    rec, sink, _ = recorder()
    for _ in range(5):
        rec.record(POD, "Filter", "x", action="Filter", controller="c", warning=True)
    rec.refresh_series()
    rec.refresh_series()  # nothing new: no second write
    rec.flush()
    assert [c[0] for c in sink.calls] == ["create", "patch", "patch"]
    assert sink.calls[-1][2]["series"]["count"] == 5
