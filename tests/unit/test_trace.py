import datetime as dt
import io
import json

from gpulab.trace import ObjectRef, TraceEvent, Tracer, sequence_diagram


def test_step_writes_one_json_line_with_the_step_and_detail() -> None:
    out = io.StringIO()
    tracer = Tracer("device-plugin", api=None, stream=out)
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}
    tracer.step("Allocate", ObjectRef.of(pod), "gave GPU-1", devices=["GPU-1"])
    line = json.loads(out.getvalue())
    assert line["component"] == "device-plugin"
    assert line["step"] == "Allocate"
    assert line["object"] == "Pod ns/p"
    assert line["devices"] == ["GPU-1"]


def test_event_is_built_like_upstream_recorders() -> None:
    tracer = Tracer("extender", api=None)
    ev = tracer._event(
        "Filter", ObjectRef("Node", "n1"), "x" * 2000, False, dt.datetime.now(dt.UTC)
    )
    assert ev.reason == ev.action == "Filter"
    assert ev.reporting_controller == "gpulab.io/extender"
    assert ev.metadata.namespace == "default"  # cluster-scoped objects: as kubelet does
    assert len(ev.note) == 1024


def test_sequence_diagram_has_one_arrow_per_step() -> None:
    now = dt.datetime.now(dt.UTC)
    events = [
        TraceEvent(now, "default-scheduler", "Scheduled", "Pod ns/p", "assigned; ok", False),
        TraceEvent(now, "gpulab.io/x", "Bind", "Pod ns/p", "bound", False),
    ]
    text = sequence_diagram(events)
    assert "default-scheduler->>Pod: Scheduled: assigned, ok" in text
    assert "gpulab_io_x->>Pod: Bind: bound" in text
    assert text.startswith("```mermaid\nsequenceDiagram")
