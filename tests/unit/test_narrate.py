"""The narrator (gpulab/narrate.py) tells each object's story in causal order from lines
that arrive scrambled, as recorded from the demos' watches, and says when it could not."""

from __future__ import annotations

import datetime as dt

from gpulab.narrate import HOLD, Narrator, Told, causal_order, pod_phase_event
from gpulab.trace import TraceEvent

T0 = dt.datetime(2025, 5, 1, 10, 0, 30, tzinfo=dt.UTC)


def line(at: float, step: str, regarding: str = "Pod demo/a-1", who: str = "x") -> TraceEvent:
    return TraceEvent(T0 + dt.timedelta(seconds=at), who, step, regarding, "", False)


def steps(events: list[TraceEvent] | list[Told]) -> list[str]:
    return [getattr(ev, "event", ev).step for ev in events]


def test_a_coscheduling_pod_is_told_in_call_chain_order_whatever_the_arrival() -> None:
    # Scheduled (kube-scheduler's style, precise) and the pod's Running arrive first; the
    # framework's steps of the same second after them, out of order among themselves
    arrived = [
        line(0.50, "Scheduled", who="gpulab-scheduler"),
        line(0.45, "Pod Running", who="kwok (kubelet)"),
        line(0.30, "Permit"),
        line(0.10, "PreFilter"),
        line(0.40, "Bind"),
    ]
    assert steps(causal_order(arrived)) == [
        "PreFilter",
        "Permit",
        "Bind",
        "Scheduled",
        "Pod Running",
    ]


def test_a_hami_pod_is_admitted_before_it_is_pending() -> None:
    # the pod watch saw the pod a moment before the webhook's Event was recorded
    arrived = [line(0.20, "Pod Pending"), line(0.25, "Webhook"), line(0.60, "Filter")]
    assert steps(causal_order(arrived)) == ["Webhook", "Pod Pending", "Filter"]


def test_time_orders_across_objects_and_seconds_and_unknown_steps_keep_their_place() -> None:
    arrived = [
        line(1.2, "PreFilter", "Pod demo/b-1"),  # the next second: after all of :30
        line(0.9, "Bind", "Pod demo/a-1"),
        line(0.5, "Reconcile", "PodGroup demo/a"),  # no chain: its time decides
        line(0.1, "Permit", "Pod demo/a-1"),
        line(0.7, "QueueingHint", "Pod demo/a-1"),  # not in the chain: stays at .7
        line(0.3, "Register", "Node n1"),
        line(0.2, "ListAndWatch", "Node n1"),
    ]
    told = [(ev.step, ev.regarding) for ev in causal_order(arrived)]
    assert told == [
        ("Permit", "Pod demo/a-1"),
        ("Register", "Node n1"),
        ("ListAndWatch", "Node n1"),
        ("Reconcile", "PodGroup demo/a"),
        ("QueueingHint", "Pod demo/a-1"),
        ("Bind", "Pod demo/a-1"),
        ("PreFilter", "Pod demo/b-1"),
    ]


def test_steps_of_different_seconds_keep_their_time_order() -> None:
    # a retry: the second attempt's PreFilter comes after the first attempt's Permit
    arrived = [line(1.1, "PreFilter"), line(0.9, "Permit"), line(0.2, "PreFilter")]
    assert [ev.time for ev in causal_order(arrived)] == sorted(ev.time for ev in arrived)


def test_lines_are_held_for_the_window_then_told_in_order() -> None:
    n = Narrator()
    n.add(line(0.4, "Bind"), now=100.0)
    n.add(line(0.2, "Permit"), now=100.5)
    assert n.due(100.0 + HOLD / 2) == []  # still inside the window
    # Bind waited its window; Permit, earlier, goes with it though it waited less
    assert steps(n.due(100.0 + HOLD)) == ["Permit", "Bind"]
    assert n.due(200.0) == [] and n.drain() == []


def test_a_line_still_young_after_a_ripe_one_keeps_waiting() -> None:
    n = Narrator()
    n.add(line(0.2, "Permit"), now=100.0)
    n.add(line(0.4, "Bind"), now=100.9)
    assert steps(n.due(100.0 + HOLD)) == ["Permit"]
    assert steps(n.drain()) == ["Bind"]


def test_a_line_arriving_after_later_ones_were_printed_is_told_late() -> None:
    n = Narrator()
    n.add(line(0.5, "Scheduled"), now=0.0)
    n.add(line(0.9, "Reconcile", "PodGroup demo/a"), now=0.0)
    assert [t.late for t in n.drain()] == [False, False]
    # the pod's Bind, same second, arrives now: it belongs before Scheduled
    n.add(line(0.4, "Bind"), now=5.0)
    # an earlier second altogether, and one that really is the newest
    n.add(line(-0.5, "Filter", "Pod demo/b-1"), now=5.0)
    n.add(line(2.0, "Filter", "Pod demo/c-1"), now=5.0)
    told = [(t.event.step, t.event.regarding, t.late) for t in n.drain()]
    assert told == [
        ("Filter", "Pod demo/b-1", True),
        ("Bind", "Pod demo/a-1", True),
        ("Filter", "Pod demo/c-1", False),
    ]


def test_a_line_after_everything_printed_in_its_second_is_on_time() -> None:
    n = Narrator()
    n.add(line(0.2, "Bind"), now=0.0)
    n.drain()
    n.add(line(0.3, "Pod Running"), now=5.0)
    n.add(line(0.1, "Reconcile", "PodGroup demo/a"), now=5.0)  # another object, earlier
    assert [(t.event.step, t.late) for t in n.drain()] == [
        ("Reconcile", True),
        ("Pod Running", False),
    ]


def test_pod_phase_lines_are_steps_of_the_pod_dated_when_seen() -> None:
    pod = {
        "metadata": {"name": "a-1", "namespace": "demo"},
        "spec": {"nodeName": "gpu-a100-0"},
        "status": {"phase": "Running"},
    }
    ev = pod_phase_event(pod, T0)
    assert (ev.step, ev.regarding, ev.note, ev.time) == (
        "Pod Running",
        "Pod demo/a-1",
        "on gpu-a100-0",
        T0,
    )
    # kwok writes the phases on the local backend, the real kubelet on kind
    assert ev.component == "kwok (kubelet)"
    assert pod_phase_event(pod, T0, "kubelet").component == "kubelet"


def test_a_whole_second_event_is_not_late_against_a_line_timed_within_that_second() -> None:
    # a pod's phase is timed when the watch saw it (microseconds), a core/v1 Event of
    # another object to the whole second: which came first in that second is unknown
    n = Narrator()
    n.add(line(0.6, "Pod Running"), now=0.0)
    n.drain()
    whole = line(0.0, "CheckHealth", "Node gpu-h100")
    assert whole.time.microsecond == 0
    n.add(whole, now=5.0)
    assert [t.late for t in n.drain()] == [False]


def test_a_plugin_restarted_within_a_second_is_two_rounds_in_time_order() -> None:
    # the old plugin's end (allocatable 0), then the new one's whole start: the second
    # GetCapacity is not merged with the first, nor the first put after ListAndWatch
    node = "Node gpu-h100"
    story = [
        line(0.05, "GetCapacity", node),
        line(0.10, "loadConfig", node),
        line(0.12, "Start", node),
        line(0.30, "Serve", node),
        line(0.45, "Register", node),
        line(0.50, "GetDevicePluginOptions", node),
        line(0.90, "ListAndWatch", node),
        line(0.95, "GetCapacity", node),
    ]
    assert causal_order(story[::-1]) == story
    # a step recorded late is still put back before the steps it caused, if close
    late = [*story[:4], line(0.50, "GetDevicePluginOptions", node), line(0.55, "Register", node)]
    assert steps(causal_order(late))[-2:] == ["Register", "GetDevicePluginOptions"]


def test_whole_second_events_follow_the_steps_that_caused_them() -> None:
    # the Job controller's core/v1 Events carry only their second: its SuccessfulCreate
    # comes after Kueue's startJob (timed within that second) that let it create the pod
    job, wl = "Job demo/a-1", "Workload demo/job-a-1"
    arrived = [
        line(0.0, "Suspended", job),
        line(0.0, "SuccessfulCreate", job),
        line(0.0, "Resumed", job),
        line(0.3, "AddOrUpdateWorkload", wl),
        line(0.5, "admit", wl),
        line(0.8, "startJob", job),
    ]
    assert steps(causal_order(arrived)) == [
        "Suspended",
        "AddOrUpdateWorkload",
        "admit",
        "startJob",
        "Resumed",
        "SuccessfulCreate",
    ]
