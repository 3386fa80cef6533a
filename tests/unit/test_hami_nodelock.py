"""Node lock (gpulab.hami.nodelock), handshake health and start-up helpers."""

from __future__ import annotations

import datetime as dt
import socket

import pytest

from gpulab.hami import nodelock
from gpulab.hami.fake import FakeCluster
from gpulab.hami.scheduler import check_health
from gpulab.hami.server import StartError, listen, parse_bind

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


def test_encode_parse_expiry_owner() -> None:
    value = nodelock.encode(NOW, "default", "p1")
    assert value == "2026-11-29T09:00:00Z,default,p1"
    lock = nodelock.parse(value)
    assert (lock.time, lock.namespace, lock.pod) == (NOW, "default", "p1")
    assert not nodelock.expired(lock, NOW + dt.timedelta(minutes=5), nodelock.DEFAULT_TIMEOUT)
    assert nodelock.expired(lock, NOW + dt.timedelta(minutes=6), nodelock.DEFAULT_TIMEOUT)
    assert nodelock.owned_by(value, "default", "p1")
    assert not nodelock.owned_by(value, "default", "p")


def test_lock_then_second_pod_is_refused_then_release() -> None:
    fc = cluster(pods=("p1", "p2"))
    nodelock.lock_node(fc, "n1", "default", "p1", now=NOW)
    assert lock_of(fc) == "2026-11-29T09:00:00Z,default,p1"
    with pytest.raises(nodelock.NodeLocked, match="locked by default/p1"):
        nodelock.lock_node(fc, "n1", "default", "p2", now=NOW + dt.timedelta(seconds=1))
    assert not nodelock.release_node_lock(fc, "n1", "default", "p2")  # not the owner
    assert lock_of(fc) is not None
    assert nodelock.release_node_lock(fc, "n1", "default", "p1")
    assert lock_of(fc) is None


def test_stale_dangling_and_garbled_locks_are_replaced() -> None:
    stale = nodelock.encode(NOW - dt.timedelta(minutes=10), "default", "old")
    fc = cluster(lock=stale, pods=("old", "p2"))
    nodelock.lock_node(fc, "n1", "default", "p2", now=NOW)
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p2")

    dangling = nodelock.encode(NOW, "default", "gone")
    fc = cluster(lock=dangling, pods=("p2",))
    nodelock.lock_node(fc, "n1", "default", "p2", now=NOW)
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p2")

    fc = cluster(lock="garbage", pods=("p2",))
    nodelock.lock_node(fc, "n1", "default", "p2", now=NOW)
    assert nodelock.owned_by(lock_of(fc) or "", "default", "p2")


def test_lock_uses_compare_and_swap() -> None:
    fc = cluster(pods=("p1",))
    stale_rv = fc.nodes["n1"]["metadata"]["resourceVersion"]
    fc.patch_node_annotations("n1", {"other": "x"})
    with pytest.raises(nodelock.Conflict):
        fc.patch_node_annotations("n1", {nodelock.NODE_LOCK_KEY: "v"}, resource_version=stale_rv)
    nodelock.lock_node(fc, "n1", "default", "p1", now=NOW)  # re-reads, so it succeeds
    assert lock_of(fc) is not None


def test_handshake_health() -> None:
    now = dt.datetime(2026, 11, 29, 9, 0, 0)
    assert check_health("Reported 2026-11-29 08:00:00 +0000 UTC", now) == (True, True)
    assert check_health("", now) == (True, True)
    assert check_health("Requesting_2026-11-29 08:59:30", now) == (True, False)
    assert check_health("Requesting_2026-11-29 08:58:00", now) == (False, False)
    assert check_health("Deleted_2026-11-29 08:00:00", now) == (True, False)


def test_bind_address_and_port_in_use() -> None:
    assert parse_bind("127.0.0.1:8080", "--http-bind") == ("127.0.0.1", 8080)
    with pytest.raises(StartError, match="HOST:PORT"):
        parse_bind("8080", "--http-bind")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        with pytest.raises(
            StartError, match=f"port {port} on 127.0.0.1 is already in use.*--http-bind"
        ):
            listen(("127.0.0.1", port), "--http-bind")
    finally:
        holder.close()
