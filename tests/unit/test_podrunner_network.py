"""harness/podrunner/network.py and proxy.backends: the local backend's pod network."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.podrunner import network
from harness.podrunner.proxy import backends


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_each_cluster_gets_its_own_block_and_keeps_it(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "cluster.json").write_text("{}")
    ka, kb = network.acquire_block(a), network.acquire_block(b)
    assert ka != kb
    assert network.acquire_block(a) == ka
    network.release_block(a)
    assert network.acquire_block(b) == kb


def test_a_block_of_a_stopped_cluster_is_taken_over(tmp_path: Path) -> None:
    gone, new = tmp_path / "gone", tmp_path / "new"
    gone.mkdir()
    (gone / "cluster.json").write_text("{}")
    k = network.acquire_block(gone)
    (gone / "cluster.json").unlink()  # that cluster died without `down`
    new.mkdir()
    assert network.acquire_block(new) == k


def _acquire_in_a_process(owner: str, cache: str) -> int:
    import os

    os.environ["XDG_CACHE_HOME"] = cache
    (Path(owner) / "cluster.json").write_text("{}")
    return network.acquire_block(Path(owner))


def test_clusters_starting_at_once_never_share_a_block(tmp_path: Path) -> None:
    """Parallel test workers bring clusters up at the same moment, some over stale
    entries of clusters that died: each new cluster gets a block of its own."""
    import multiprocessing

    for i in range(4):  # four blocks whose clusters died without `down`
        dead = tmp_path / f"dead-{i}"
        dead.mkdir()
        (dead / "cluster.json").write_text("{}")
        network.acquire_block(dead)
        (dead / "cluster.json").unlink()
    owners = [tmp_path / f"new-{i}" for i in range(8)]
    for d in owners:
        d.mkdir()
    cache = str(tmp_path / "cache")
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        blocks = pool.starmap(_acquire_in_a_process, [(str(d), cache) for d in owners])
    assert len(set(blocks)) == len(owners), blocks


def test_service_addresses_mirror_the_cluster_ip() -> None:
    assert network.service_address(42, "10.96.12.34") == "127.42.12.34"
    assert network.service_address(42, "None") is None
    assert network.service_address(42, "10.97.0.1") is None


def test_pod_ips_skip_network_and_broadcast_addresses_and_reuse_released_ones() -> None:
    ips = network.PodIPs(42)
    ips.reserve("127.42.128.1")
    got = [ips.allocate() for _ in range(3)]
    assert got == ["127.42.128.2", "127.42.128.3", "127.42.128.4"]
    assert all(network.is_pod_address(42, ip) for ip in got)
    assert not network.is_pod_address(42, "127.42.3.4")  # a Service address


def test_backends_are_the_ready_selected_pods_with_the_target_port() -> None:
    svc = {"spec": {"selector": {"app": "x"}}}
    port = {"port": 443, "targetPort": "https"}

    def pod(ip: str, labels: dict, ready: bool) -> dict:
        return {
            "metadata": {"labels": labels},
            "spec": {
                "containers": [{"name": "c", "ports": [{"name": "https", "containerPort": 9443}]}]
            },
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": str(ready)}]},
        }

    pods = [
        pod("127.42.128.5", {"app": "x"}, True),
        pod("127.42.128.6", {"app": "x"}, False),  # not Ready
        pod("127.42.128.7", {"app": "y"}, True),  # not selected
        pod("10.0.0.3", {"app": "x"}, True),  # a kwok pod: nothing listens there
    ]
    assert backends(svc, port, pods, 42) == [("127.42.128.5", 9443)]
