"""The call chain as caller -> callee from trace Events."""

from __future__ import annotations

import datetime as dt

from gpulab.dashboard import chain
from gpulab.trace import TraceEvent

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def ev(component: str, step: str, at: int, regarding: str = "Pod ns/p", **kw: object) -> TraceEvent:
    return TraceEvent(
        time=T0 + dt.timedelta(seconds=at),
        component=component,
        step=step,
        regarding=regarding,
        note=str(kw.get("note", "")),
        warning=bool(kw.get("warning", False)),
        count=int(kw.get("count", 1)),  # type: ignore[call-overload]
    )


def test_the_hami_chain_is_drawn_caller_to_callee() -> None:
    run = [
        ev("hami-scheduler", "Webhook", 0),
        ev("hami-scheduler", "Filter", 1),
        ev("hami-scheduler", "Bind", 2),
        ev("hami-scheduler", "Scheduled", 3),  # kube-scheduler's profile "hami-scheduler"
        ev("device-plugin", "Allocate", 4, "Node gpu-t4"),
        ev("node-agent", "Allocate", 5, "Pod ns/p"),
    ]
    got = [(c.caller, c.callee, c.step, c.reply) for c in chain.calls(run)]
    assert got == [
        ("kube-apiserver", "hami-extender", "Webhook", False),
        ("kube-scheduler", "hami-extender", "Filter", False),
        ("kube-scheduler", "hami-extender", "Bind", False),
        ("kube-scheduler", "kube-apiserver", "Scheduled", False),
        ("kubelet", "device-plugin", "Allocate", False),
        ("kubelet", "device-plugin", "Allocate", True),  # the kubelet got the answer
    ]


def test_an_unknown_step_is_a_self_call_on_its_reporters_lane() -> None:
    (c,) = chain.calls([ev("gpu-operator", "StateDriver", 0, "ClusterPolicy cp")])
    assert (c.caller, c.callee) == ("gpu-operator", "gpu-operator")


def test_mermaid_has_ordered_lanes_and_one_line_per_call() -> None:
    run = [
        ev("device-plugin", "Allocate", 1, "Node n", note="x;y#z\nw"),
        ev("hami-scheduler", "Filter", 0, warning=True),
    ]
    text = chain.sequence_diagram(run)
    assert text.startswith("```mermaid\nsequenceDiagram\n")
    lanes = [line.split(" as ")[1] for line in text.splitlines() if " as " in line]
    assert lanes == ["kube-scheduler", "hami-extender", "kubelet", "device-plugin"]
    assert "    kube_scheduler-xhami_extender: Filter Pod ns/p: " in text  # a warning
    assert "kubelet->>device_plugin: Allocate Node n: x,yz w" in text


def test_reply_arrows_go_back_from_the_callee() -> None:
    c = chain.call(ev("node-agent", "Allocate", 0, note="NVIDIA_VISIBLE_DEVICES=GPU-1"))
    assert chain.mermaid_line(c).startswith("    device_plugin-->>kubelet: Allocate")


def test_repeats_of_a_call_collapse_with_a_count() -> None:
    retry = [ev("default-scheduler", "FailedScheduling", i, count=2) for i in range(3)]
    other = ev("hami-scheduler", "Filter", 10)
    got = chain.calls([*retry, other, ev("default-scheduler", "FailedScheduling", 11)])
    assert [(c.step, c.count) for c in got] == [
        ("FailedScheduling", 6),
        ("Filter", 1),
        ("FailedScheduling", 1),
    ]
    assert "FailedScheduling (x6)" in chain.mermaid_line(got[0])


def test_namespace_of_the_regarded_object() -> None:
    assert chain.namespace_of("Pod demo-hami/binpack-1") == "demo-hami"
    assert chain.namespace_of("Node gpu-t4") == ""
