"""The node lock (gpulab.hami.nodelock), node health (scheduler.check_health) and the
Go-style flag values, against HAMi v2.10.0's rules."""

from __future__ import annotations

import datetime as dt
import gc
import socket

import pytest

from gpulab.hami import annotations as ann
from gpulab.hami import nodelock
from gpulab.hami.cluster import Conflict
from gpulab.hami.config import ConfigError, parse_go_duration, parse_string_to_string
from gpulab.hami.fake import FakeCluster
from gpulab.hami.scheduler import Reported, check_health
from gpulab.hami.server import UVICORN, StartError, listen, parse_bind, tune_gc

NOW = dt.datetime(2026, 11, 29, 9, 0, 0, tzinfo=dt.UTC)


def cluster(lock: str | None = None, pods: tuple[str, ...] = ()) -> FakeCluster:
    fc = FakeCluster()
    annos = {nodelock.NODE_LOCK_KEY: lock} if lock else {}
    fc.add_node({"metadata": {"name": "n1", "annotations": annos}})
    for p in pods:
        fc.add_pod({"metadata": {"name": p, "namespace": "default"}, "spec": {}})
    return fc


def lock_of(fc: FakeCluster) -> str | None:
    return fc.nodes["n1"]["metadata"].get("annotations", {}).get(nodelock.NODE_LOCK_KEY)


def take(fc: FakeCluster, pod: str, now: dt.datetime = NOW, **kw: object) -> None:
    nodelock.lock_node(fc, "n1", "default", pod, now=now, **kw)  # type: ignore[arg-type]


def test_lock_value_and_parse() -> None:
    value = nodelock.encode(NOW, "default", "p1")
    assert value == "2026-11-29T09:00:00Z,default,p1"
    assert ann.parse_node_lock(value) == (NOW, "default", "p1")
    # the legacy format: a timestamp only, owned by nobody
    assert ann.parse_node_lock("2026-11-29T09:00:00+08:00")[1:] == ("", "")
    for bad in ("garbage", "2026-11-29,default,p1", "2026-11-29T09:00:00Z,a,b,c", ""):
        with pytest.raises(ann.AnnotationError):
            ann.parse_node_lock(bad)


def test_second_pod_meets_contention_and_the_holder_counts_as_locked() -> None:
    fc = cluster(pods=("p1", "p2"))
    take(fc, "p1")
    assert lock_of(fc) == "2026-11-29T09:00:00Z,default,p1"
    with pytest.raises(nodelock.NodeLockContention) as contention:
        take(fc, "p2", NOW + dt.timedelta(seconds=1))
    # upstream's text, word for word: learners read it in the BindingFailed Event
    assert str(contention.value) == "node n1 has been locked within 5m0s: node lock contention"
    take(fc, "p1", NOW + dt.timedelta(seconds=2))  # this pod holds it already: taken
    assert not nodelock.release_node_lock(fc, "n1", "default", "p2")  # not the owner
    assert nodelock.release_node_lock(fc, "n1", "default", "p1")
    assert lock_of(fc) is None


def test_expired_and_dangling_locks_are_replaced() -> None:
    stale = nodelock.encode(NOW - dt.timedelta(minutes=6), "default", "old")
    fc = cluster(lock=stale, pods=("old", "p2"))
    take(fc, "p2")
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p2")

    fc = cluster(lock=nodelock.encode(NOW, "default", "gone"), pods=("p2",))
    take(fc, "p2")
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p2")


def test_expiry_follows_the_node_lock_timeout() -> None:
    fc = cluster(
        lock=nodelock.encode(NOW - dt.timedelta(seconds=90), "default", "old"), pods=("old", "p")
    )
    with pytest.raises(nodelock.NodeLockContention):
        take(fc, "p")  # 90s old: fresh under the default 5m
    take(fc, "p", timeout=parse_go_duration("1m", "--node-lock-timeout"))
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p")


def test_an_unreadable_lock_is_an_error_not_replaced() -> None:
    fc = cluster(lock="garbage", pods=("p2",))
    with pytest.raises(nodelock.NodeLockError, match=r"cannot read hami\.io/mutex\.lock"):
        take(fc, "p2")
    assert lock_of(fc) == "garbage"


def test_a_legacy_timestamp_lock_is_honoured_until_it_expires() -> None:
    fc = cluster(lock=ann.rfc3339(NOW - dt.timedelta(minutes=1)), pods=("p",))
    with pytest.raises(nodelock.NodeLockContention):
        take(fc, "p")
    fc = cluster(lock=ann.rfc3339(NOW - dt.timedelta(minutes=10)), pods=("p",))
    take(fc, "p")
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p")
    # releasing a legacy lock needs no owner
    fc = cluster(lock=ann.rfc3339(NOW), pods=("p",))
    assert nodelock.release_node_lock(fc, "n1", "default", "p")


def test_taking_is_a_compare_and_swap_retried_on_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    fc = cluster(pods=("p1",))
    real = fc.patch_node_annotations
    conflicts = iter([True, True])

    def flaky(name: str, annos: dict, resource_version: str | None = None) -> None:
        assert resource_version  # every lock write is conditional
        if next(conflicts, False):
            raise Conflict("node n1 changed meanwhile (409)")
        real(name, annos, resource_version)

    monkeypatch.setattr(fc, "patch_node_annotations", flaky)
    take(fc, "p1")
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p1")
    assert fc.calls.count("get node") == 5  # LockNode, SetNodeLock, then a read per try (3)


def test_health_follows_allocatable_and_the_requesting_stamp() -> None:
    now = dt.datetime(2026, 11, 29, 9, 0, 0)

    def node(gpus: int, handshake: str | None = None, register: str = "[]") -> dict:
        annos = {ann.NODE_REGISTER: register}
        if handshake is not None:
            annos[ann.NODE_HANDSHAKE] = handshake
        return {
            "metadata": {"annotations": annos},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
        }

    res = "nvidia.com/gpu"
    # first sight: stamp Requesting, register
    healthy, update, seen, stamp = check_health(node(80), Reported(), res, now)
    assert (healthy, update, seen) == (True, True, Reported(80, "[]"))
    assert stamp == "Requesting_2026-11-29 09:00:00"
    # nothing changed: no re-registration; a stale stamp does not matter while allocatable > 0
    old = "Requesting_2026-11-29 08:00:00"
    assert check_health(node(80, old), seen, res, now)[:2] == (True, False)
    # the register annotation changed: re-register
    assert check_health(node(80, old, "[{}]"), seen, res, now)[:2] == (True, True)
    # allocatable dropped to zero: unhealthy at once
    assert check_health(node(0, old), seen, res, now)[0] is False
    # no allocatable ever, stamp expired: dead; stamp fresh: alive
    assert check_health(node(0, old), Reported(), res, now)[:2] == (False, False)
    fresh = "Requesting_2026-11-29 08:59:30"
    assert check_health(node(0, fresh), Reported(), res, now)[:2] == (True, False)


def test_go_durations_and_string_maps() -> None:
    assert parse_go_duration("5m", "--x") == dt.timedelta(minutes=5)
    assert parse_go_duration("1h30m", "--x") == dt.timedelta(minutes=90)
    assert parse_go_duration("300ms", "--x") == dt.timedelta(milliseconds=300)
    assert parse_go_duration("0", "--x") == dt.timedelta(0)
    with pytest.raises(ConfigError, match="--node-lock-timeout '300': missing unit"):
        parse_go_duration("300", "--node-lock-timeout")
    for bad in ("5 m", "m", "1x", "", "1.5.3s"):
        with pytest.raises(ConfigError):
            parse_go_duration(bad, "--x")
    assert parse_string_to_string("gpu=on,zone=a", "--s") == {"gpu": "on", "zone": "a"}
    with pytest.raises(ConfigError):
        parse_string_to_string("gpu", "--s")


def test_the_listening_socket_is_tcp_so_asyncio_sets_nodelay() -> None:
    # asyncio only sets TCP_NODELAY on accepted sockets whose proto is IPPROTO_TCP; without
    # it every kept-alive request waits out a 40 ms delayed ACK
    sock = listen(("127.0.0.1", 0), "--http_bind")
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_idle_connections_outlive_go_clients_idle_timeout() -> None:
    # kube-scheduler and the API server (webhook) keep idle connections 90 s; a server that
    # closes them first races their next POST, which then fails with EOF (not retried)
    assert UVICORN["timeout_keep_alive"] > 90
    assert UVICORN["access_log"] is False


def test_tune_gc_freezes_what_is_alive() -> None:
    gc.unfreeze()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_bind_address_and_port_in_use() -> None:
    assert parse_bind("127.0.0.1:8080", "--http_bind") == ("127.0.0.1", 8080)
    assert parse_bind(":9395", "--metrics-bind-address") == ("0.0.0.0", 9395)
    with pytest.raises(StartError, match="HOST:PORT"):
        parse_bind("8080", "--http_bind")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(
            StartError, match=f"port {port} on 127.0.0.1 is already in use.*--http_bind"
        ):
            listen(("127.0.0.1", port), "--http_bind")
    finally:
        holder.close()
