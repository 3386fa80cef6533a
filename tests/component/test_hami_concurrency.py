"""50 vGPU pods filtered, bound and allocated at once over HTTP never overcommit a GPU, the
node lock lets one pod at a time through Bind → Allocate on a node, and Binds waiting for
a lock never keep Filter from answering."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from test_hami_extender import World, bind_args, filter_args, serve  # noqa: F401

from gpulab.hami import annotations as ann
from gpulab.hami.scheduler import SchedulerConfig
from gpulab.wait import wait_for

PODS = 50
MEM, CORES = 7000, 15
TRIES = 40  # kube-scheduler retries a pod whose Bind failed


def test_concurrent_filter_bind_allocate_never_exceed_a_gpu(serve: Any) -> None:  # noqa: F811
    world = World()
    http = serve(world.app)
    pods = [world.add_vgpu_pod(f"p{i:02d}", mem=MEM, cores=CORES) for i in range(PODS)]
    capacity = {
        c.id: (c.totalmem, c.totalcore) for cards in world.scheduler.usage().values() for c in cards
    }
    contention = 0

    def schedule(pod: dict[str, Any]) -> str:
        nonlocal contention
        name = pod["metadata"]["name"]
        for _ in range(TRIES):
            result = http.post("/filter", json=filter_args(world.pod(name))).json()
            assert not result["Error"], result
            if not result["NodeNames"]:
                return "refused"
            node = result["NodeNames"][0]
            bound = http.post("/bind", json=bind_args(pod, node))
            assert bound.status_code == 200
            if not bound.json()["Error"]:
                world.allocate(node)  # the device plugin releases the node lock
                return "bound"
            assert "locked" in bound.json()["Error"], bound.json()
            contention += 1
        return "gave up"

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(schedule, pods))

    bound = {name for _, name, _ in world.cluster.bindings}
    # 4 cards: A100s take 5 pods of 7000 MiB each, H100s 6 by cores (15 % each): at most
    # 22 pods fit; the rest must be refused by Filter, never squeezed in.
    assert outcomes.count("gave up") == 0
    assert 16 <= len(bound) == outcomes.count("bound") <= 22
    assert contention > 0  # the lock really serialised some Binds
    mem: dict[str, int] = defaultdict(int)
    cores: dict[str, int] = defaultdict(int)
    for name in bound:
        for ctr in ann.decode_pod_devices(world.annotations(name)[ann.DEVICES_ALLOCATED]):
            for d in ctr:
                mem[d.uuid] += d.usedmem
                cores[d.uuid] += d.usedcores
    for uuid, used in mem.items():
        assert used <= capacity[uuid][0], f"{uuid}: {used} MiB > {capacity[uuid][0]}"
        assert cores[uuid] <= capacity[uuid][1], f"{uuid}: {cores[uuid]} % cores"
    for cards in world.scheduler.usage().values():
        for c in cards:
            assert c.usedmem <= c.totalmem and c.usedcores <= c.totalcore
    assert all(world.node_lock(n) is None for n in ("gpu-node-1", "gpu-node-2"))


def test_binds_waiting_for_a_lock_do_not_starve_filter(serve: Any) -> None:  # noqa: F811
    world = World(SchedulerConfig(node_lock_retry_timeout=dt.timedelta(seconds=20)))
    node = world.cluster.nodes["gpu-node-1"]["metadata"]["annotations"]
    many = [replace(d, count=50) for d in ann.decode_node_devices(node[ann.NODE_REGISTER])]
    world.cluster.patch_node_annotations(
        "gpu-node-1", {ann.NODE_REGISTER: ann.encode_node_devices(many)}
    )
    world.scheduler.register()  # 100 shares on gpu-node-1
    http = serve(world.app)
    holder = world.add_vgpu_pod("holder", mem=1000, cores=1)
    http.post("/filter", json=filter_args(holder, ["gpu-node-1"]))
    assert http.post("/bind", json=bind_args(holder, "gpu-node-1")).json() == {"Error": ""}
    gang = [
        world.add_vgpu_pod(
            f"g{i}", mem=1000, cores=1, labels={"scheduling.x-k8s.io/pod-group": "g"}
        )
        for i in range(45)  # more than Python's default thread pool (40)
    ]
    for pod in gang:
        http.post("/filter", json=filter_args(pod, ["gpu-node-1"]))
    with ThreadPoolExecutor(max_workers=len(gang)) as pool:
        waiting = [pool.submit(http.post, "/bind", json=bind_args(p, "gpu-node-1")) for p in gang]
        wait_for(
            lambda: world.cluster.calls.count("get node") >= 3 * len(gang), 20, "the Binds to wait"
        )
        other = world.add_vgpu_pod("other", mem=1000, cores=1)
        assert http.post("/filter", json=filter_args(other, ["gpu-node-2"])).json()[
            "NodeNames"
        ] == ["gpu-node-2"]
        assert not any(f.done() for f in waiting)  # Filter was answered while all 45 waited
        world.allocate()  # the device plugin releases the lock: the gang binds one by one
        for _ in gang:
            wait_for(lambda: world.node_lock() is not None, 20, "the next member to take the lock")
            world.allocate()
        assert all(f.result().json() == {"Error": ""} for f in waiting)
