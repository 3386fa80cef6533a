import datetime as dt
import io
import json

from rich.console import Console

from gpulab.trace import ObjectRef, TraceEvent, Tracer, render_line, sequence_diagram


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


class FakeEvents:
    """Records what the Tracer sends to events.k8s.io."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object]] = []

    def create_namespaced_event(self, namespace: str, event: object) -> None:
        self.calls.append(("create", event.metadata.name, event))  # type: ignore[attr-defined]

    def patch_namespaced_event(self, name: str, namespace: str, body: dict) -> None:
        self.calls.append(("patch", name, body))


def test_repeated_events_become_one_series_as_client_go_records_them() -> None:
    import datetime as dt
    import io

    from kubernetes import client

    from gpulab import trace
    from gpulab.trace import ObjectRef, Tracer

    tracer = Tracer("hami-scheduler", client.ApiClient(), stream=io.StringIO())
    fake = FakeEvents()
    tracer._events = fake  # type: ignore[assignment]
    pod = ObjectRef("Pod", "p", "ns", "uid-1")
    for _attempt in range(4):
        tracer.step("Filter", pod, "0/3 nodes fit", warning=True)
    tracer.step("Filter", ObjectRef("Pod", "other", "ns"), "fits", warning=False)
    tracer.step("Filter", pod, "1/3 nodes fit", warning=True)  # another note: its own Event
    tracer.flush()
    ops = [(op, name.split(".")[0]) for op, name, _ in fake.calls]
    # one Event per object; the first repeat patches the series at once, later ones only count
    assert ops == [("create", "p"), ("patch", "p"), ("create", "other"), ("create", "p")]
    assert fake.calls[1][2]["series"]["count"] == 2
    assert fake.calls[0][2].series is None  # the Event first written has no series
    # when the series ends (6 min without a repeat) the final count is written back
    for rec in tracer._recorded.values():
        rec.last = rec.event.event_time - dt.timedelta(seconds=trace.SERIES_FINISH + 1)
    tracer._tend_series()
    tracer.flush()
    assert fake.calls[-1][0] == "patch" and fake.calls[-1][2]["series"]["count"] == 4
    assert tracer._recorded == {}


def _printed(markup: str, width: int = 300) -> str:
    out = Console(width=width, file=io.StringIO(), highlight=False, color_system=None)
    with out.capture() as captured:
        out.print(markup)
    return captured.get()


def test_text_in_brackets_survives_rendering() -> None:
    ev = TraceEvent(
        dt.datetime.now(dt.UTC),
        "hami-scheduler",
        "BindingSucceed",
        "Pod demo-hami/[binpack-1]",
        r"Successfully binding node [gpu-a100] to demo-hami/binpack-1 [bold]x[/bold] \\",
        False,
    )
    line = _printed(render_line(ev))
    assert "Successfully binding node [gpu-a100] to demo-hami/binpack-1" in line
    assert "[bold]x[/bold] \\\\" in line
    assert "Pod demo-hami/[binpack-1]" in line


UUID = "GPU-04073269-1dc6-5e83-bcec-1541d6190116"


def test_the_compact_line_fits_the_width_with_short_uuids_and_keeps_its_marks() -> None:
    ev = TraceEvent(
        dt.datetime.now(dt.UTC),
        "device-plugin",
        "Allocate",
        "Node gpu-a100-0",
        f"nvidia.com/gpu: NVIDIA_VISIBLE_DEVICES={UUID}\n" + "[x] " * 100,
        False,
        count=3,
    )
    line = _printed(render_line(ev, late=True, width=140)).rstrip("\n")
    assert "\n" not in line and len(line) == 140
    assert "NVIDIA_VISIBLE_DEVICES=GPU-04073269 [x] [x]" in line
    assert line.endswith("… (x3) (late)")
    full = _printed(render_line(ev))  # --verbose: every word, the full UUID
    assert UUID in full and full.count("[x]") == 100


def test_a_short_note_is_left_whole_and_a_head_wider_than_the_line_drops_the_note() -> None:
    ev = TraceEvent(dt.datetime.now(dt.UTC), "x", "Bind", "Pod ns/p", "bound to n1", False)
    assert _printed(render_line(ev, width=100)) == _printed(render_line(ev))
    assert "bound" not in _printed(render_line(ev, width=40))
