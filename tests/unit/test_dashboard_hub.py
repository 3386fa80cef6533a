"""The dashboard's fan-out (snapshot, then patches of what changed) and the API server's
reachability as the informers' list and watch calls report it."""

from __future__ import annotations

import asyncio
import datetime as dt

from kubernetes.client.rest import ApiException

from gpulab.dashboard import chain
from gpulab.dashboard.hub import ApiHealth, Fanout, Hub, _unreachable
from gpulab.informer import Delta

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def drain(queue: asyncio.Queue) -> list:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def test_a_page_gets_a_snapshot_then_only_what_changed() -> None:
    async def scenario() -> None:
        fan = Fanout()
        fan.set_view("node:a", {"gpus": 1})
        snapshot, queue = fan.subscribe(asyncio.get_running_loop())
        assert snapshot["views"] == {"node:a": {"gpus": 1}}
        assert snapshot["lanes"][0] == "kube-apiserver"
        assert not fan.set_view("node:a", {"gpus": 1})  # unchanged: nothing sent
        assert fan.set_view("node:a", {"gpus": 2})
        assert fan.set_view("node:b", {"gpus": 8})
        assert fan.set_view("node:b", None)
        await asyncio.sleep(0)  # call_soon_threadsafe delivers on the loop
        assert drain(queue) == [
            {"k": "node:a", "v": {"gpus": 2}},
            {"k": "node:b", "v": {"gpus": 8}},
            {"k": "node:b", "v": None},
        ]
        fan.unsubscribe(queue)
        fan.set_view("node:a", {"gpus": 3})
        await asyncio.sleep(0)
        assert drain(queue) == []

    asyncio.run(scenario())


def call(step: str, at: int, event_id: str, count: int = 1) -> chain.Call:
    return chain.Call(
        T0 + dt.timedelta(seconds=at), "kube-scheduler", "kube-scheduler", step, "Pod ns/p",
        "", False, False, count, event_id,
    )  # fmt: skip


def test_a_repeated_call_replaces_the_one_before() -> None:
    async def scenario() -> None:
        fan = Fanout()
        _snapshot, queue = fan.subscribe(asyncio.get_running_loop())
        fan.add_call(call("FailedScheduling", 1, "e1"))
        fan.add_call(call("FailedScheduling", 2, "e2"))  # a retry: merged into one arrow
        fan.add_call(call("Scheduled", 3, "e3"))
        fan.add_call(call("Scheduled", 4, "e3", count=2))  # the Event's series grew
        await asyncio.sleep(0)
        sent = drain(queue)
        assert [(m["call"]["id"], m["call"]["count"], m["replaces"]) for m in sent] == [
            ("e1", 1, []),
            ("e2", 2, ["e1"]),
            ("e3", 1, []),
            ("e3", 2, []),
        ]
        assert [(c.id, c.count) for c in fan.calls()] == [("e2", 2), ("e3", 2)]

    asyncio.run(scenario())


def test_reachability_flips_once_per_change() -> None:
    changes = []
    health = ApiHealth(lambda: changes.append(health.up))
    health.ok()
    health.ok()
    health.failed(ConnectionRefusedError("connection refused"))
    health.failed(ConnectionRefusedError("connection refused"))
    health.ok()
    assert changes == [True, False, True]
    assert _unreachable(ApiException(status=503))
    assert not _unreachable(ApiException(status=404))  # an answer: the server is there


def test_a_deleted_pod_leaves_its_node_and_gang() -> None:
    hub = Hub(api=None)  # type: ignore[arg-type]  # not started: handlers only
    labels = {"scheduling.x-k8s.io/pod-group": "g"}
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "labels": labels},
        "spec": {"nodeName": "n1"},
    }
    hub._on_pod(Delta("ADDED", pod))
    assert hub._pods_by_node["n1"] == {"ns/p"}
    while (key := hub.queue.get(timeout=0)) is not None:
        hub.queue.done(key)
    hub._on_pod(Delta("DELETED", pod))
    assert hub._pods_by_node["n1"] == set()
    assert hub._pods_by_group["coscheduling/ns/g"] == set()
    keys = set()
    while (key := hub.queue.get(timeout=0)) is not None:
        keys.add(key)
        hub.queue.done(key)
    assert {"node:n1", "pg:coscheduling/ns/g", "pending:ns/p"} <= keys
