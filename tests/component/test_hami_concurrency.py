"""50 vGPU pods filtered, bound and allocated at once over HTTP never overcommit a GPU, and
the node lock lets one pod at a time through Bind → Allocate on a node."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from test_hami_extender import World, bind_args, filter_args, serve  # noqa: F401

from gpulab.hami import annotations as ann

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
