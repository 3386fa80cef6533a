"""The demos' LiveTrace (demos/common.py) prints the call chain in causal order and never
ticks a fact off (ok/say) before the lines it sums up are on screen. The informers are
replaced by fakes the test feeds; the console is captured."""

from __future__ import annotations

import datetime as dt
import io
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from kubernetes import client

from demos import common
from gpulab import informer, narrate


class FakeInformer:
    """Stands for gpulab.informer.Informer: the test calls its handlers."""

    made: ClassVar[list[FakeInformer]] = []

    def __init__(self, lw: informer.ListWatch, handlers: informer.Handlers) -> None:
        self.lw, self.handlers = lw, handlers
        FakeInformer.made.append(self)

    def start(self) -> FakeInformer:
        return self

    def stop(self) -> None:
        pass


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    out = io.StringIO()
    # a terminal 200 cells wide (colourless, so the text can be compared)
    demo_console = common.DemoConsole(file=out, width=200, color_system=None, force_terminal=True)
    monkeypatch.setattr(common, "console", demo_console)
    monkeypatch.setattr(common, "NARRATION", common.Narration())
    monkeypatch.setattr(informer, "Informer", FakeInformer)
    FakeInformer.made = []
    yield out


def event(step: str, pod: str, at: float, note: str = "", count: int = 1) -> dict[str, Any]:
    """A core/v1 Event as the Events informer delivers it, ``at`` seconds from now."""
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {"name": f"{pod}.{step}", "namespace": "demo"},
        "involvedObject": {"kind": "Pod", "name": pod, "namespace": "demo"},
        "reason": step,
        "message": note or f"{step} {pod}",
        "type": "Normal",
        "eventTime": when,
        "reportingComponent": "gpulab.io/gpulab-scheduler",
        "count": count,
    }


def pod(name: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "demo"},
        "spec": {"nodeName": "gpu-a100-0"},
        "status": {"phase": phase},
    }


def live_trace(**kwargs: Any) -> common.LiveTrace:
    # a window no test outlasts: only flushes print
    hold = narrate.Narrator(hold=600)
    return common.LiveTrace(client.ApiClient(), "demo", _narrator=hold, **kwargs)


def printed(out: io.StringIO) -> list[str]:
    return [line.strip() for line in out.getvalue().splitlines() if line.strip()]


def feed_events(*events: dict[str, Any], trace: int = 0) -> None:
    """Deliver ``events`` to the Events informer of the ``trace``-th LiveTrace entered
    (each makes two: its namespace's Events, then its pods)."""
    handlers = FakeInformer.made[2 * trace].handlers
    assert handlers.on_add is not None
    for ev in events:
        handlers.on_add(ev)


def test_a_tick_comes_after_the_lines_it_sums_up(screen: io.StringIO) -> None:
    with live_trace() as live:
        feed_events(*(event("Bind", f"a-{i}", at=0.1 * i) for i in (3, 1, 2)))
        assert printed(screen) == []  # held: the window has not passed
        common.ok("gang a bound whole")
        lines = printed(screen)
        assert [line.split()[-1] for line in lines[:3]] == ["a-1", "a-2", "a-3"]
        assert lines[3] == "✔ gang a bound whole"
        assert len(live.seen) == 3


def test_say_prints_what_is_held_first_and_the_pod_phase_joins_the_story(
    screen: io.StringIO,
) -> None:
    with live_trace():
        on_pod = FakeInformer.made[-1].handlers.on_add  # the namespace's pods
        assert on_pod is not None
        on_pod(pod("a-1", "Running"))  # the pod watch is quicker than the Events
        feed_events(event("Bind", "a-1", at=-0.2), event("Permit", "a-1", at=-0.3))
        common.say("next: gang b")
    lines = printed(screen)
    assert [line.split()[2] for line in lines[:2]] == ["Permit", "Bind"]
    assert "Pod Running" in lines[2] and "Pod demo/a-1  on gpu-a100-0" in lines[2]
    assert lines[3] == "▶ next: gang b"


def test_expect_prints_the_steps_it_waited_for(screen: io.StringIO) -> None:
    with live_trace() as live:
        feed_events(event("PreFilter", "a-1", at=0.0))
        live.expect({"PreFilter"}, timeout=1)
        assert "PreFilter" in screen.getvalue()


def test_a_section_header_or_table_of_the_script_comes_after_the_held_lines(
    screen: io.StringIO,
) -> None:
    with live_trace():
        feed_events(event("Bind", "a-1", at=0.0))
        common.console.rule("spread: three pods, three GPUs")
    lines = printed(screen)
    assert "Bind" in lines[0] and "spread: three pods" in lines[1]


def test_lines_a_watcher_thread_prints_do_not_flush_the_trace(screen: io.StringIO) -> None:
    with live_trace():
        feed_events(event("Bind", "a-1", at=0.0))
        watcher = threading.Thread(target=common.console.print, args=("lock taken",))
        watcher.start()
        watcher.join()
        assert printed(screen) == ["lock taken"]


def test_leaving_the_trace_prints_what_is_held_and_a_late_line_says_so(
    screen: io.StringIO,
) -> None:
    with live_trace() as live:
        feed_events(event("Bind", "a-1", at=0.5))
        live.flush()
        feed_events(event("Permit", "a-1", at=0.1))  # arrives after its Bind was printed
    lines = printed(screen)
    assert "Bind" in lines[0] and "(late)" not in lines[0]
    assert "Permit" in lines[1] and lines[1].endswith("(late)")
    common.say("after the trace")  # no LiveTrace is left to flush
    assert printed(screen)[-1] == "▶ after the trace"


LONG = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. " * 5


def test_lines_fit_the_terminal_unless_verbose(screen: io.StringIO) -> None:
    width = common.console.width - 2
    with live_trace() as live:
        feed_events(event("Filter", "a-1", at=0.0, note=LONG))
        live.flush()
        feed_events(event("Filter", "a-" + "x" * 300, at=0.1))  # a head wider than that
    compact = printed(screen)
    assert [len(line) for line in compact] == [width, width]
    assert compact[0].endswith("…") and compact[1].endswith("…")
    with live_trace(verbose=True):
        feed_events(event("Filter", "a-2", at=0.0, note=LONG), trace=1)
    assert LONG.strip() in screen.getvalue().replace("\n", "")


def test_a_file_or_pipe_gets_each_line_whole(
    screen: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `make demo-x | tee run.log`, CI: no terminal width to keep to, nothing cut
    monkeypatch.setattr(common.console, "_force_terminal", False)
    with live_trace():
        feed_events(event("Filter", "a-1", at=0.0, note=LONG))
    (line,) = printed(screen)
    assert line.endswith(" ".join(LONG.split())) and "…" not in line


def test_the_count_is_explained_once_with_the_first_line_that_shows_one(
    screen: io.StringIO,
) -> None:
    with live_trace() as a, live_trace() as b:  # Kueue's demo follows two namespaces
        feed_events(event("Filter", "a-1", at=0.0))
        a.flush()
        assert common.COUNT_LEGEND not in screen.getvalue()
        feed_events(
            event("Filter", "a-2", at=0.1, count=2),
            event("Filter", "a-3", at=0.2, count=3),
            trace=1,
        )
        b.flush()
    lines = printed(screen)
    assert lines[1].endswith("(x2)") and lines[2] == common.COUNT_LEGEND
    assert lines[3].endswith("(x3)") and screen.getvalue().count(common.COUNT_LEGEND) == 1


def test_gpulab_demo_verbose_prints_the_trace_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    from demos import commands
    from gpulab.cli import build_parser

    args = build_parser(["demo"]).parse_args(["demo", "cluster", "--verbose"])
    assert args.full_trace and not args.verbose  # gpulab's own -v stays debug logging
    monkeypatch.setattr(common, "NARRATION", common.Narration())
    chapter = type("Chapter", (), {"run": staticmethod(lambda _args: 0)})
    monkeypatch.setattr(commands.importlib, "import_module", lambda _name: chapter)
    assert commands.cmd_demo(args) == 0
    assert common.NARRATION.verbose
    assert common.LiveTrace(client.ApiClient(), "demo").verbose
