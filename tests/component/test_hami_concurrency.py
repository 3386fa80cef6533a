"""50 vGPU pods filtered and bound at once over HTTP never overcommit a GPU."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from test_hami_extender import World, bind_args, filter_args, serve  # noqa: F401

from gpulab.hami import annotations as ann

PODS = 50
MEM, CORES = 7000, 15


def test_concurrent_filter_and_bind_never_exceed_a_gpu(serve: Any) -> None:  # noqa: F811
    world = World()
    http = serve(world.app)
    pods = [world.add_vgpu_pod(f"p{i:02d}", mem=MEM, cores=CORES) for i in range(PODS)]
    capacity = {
        c.id: (c.totalmem, c.totalcore) for cards in world.scheduler.usage().values() for c in cards
    }

    def schedule(pod: dict[str, Any]) -> tuple[int, int, dict[str, Any], dict[str, Any] | None]:
        f = http.post("/filter", json=filter_args(pod))
        result = f.json()
        if not result["NodeNames"]:
            return f.status_code, 0, result, None
        b = http.post("/bind", json=bind_args(pod, result["NodeNames"][0]))
        return f.status_code, b.status_code, result, b.json()

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(schedule, pods))

    assert all(fs == 200 for fs, *_ in outcomes)
    assert all(bs == 200 for _, bs, _, b in outcomes if b is not None)
    bound = {name for _, name, _ in world.cluster.bindings}
    # 4 cards: A100s take 5 pods of 7000 MiB each, H100s 6 by cores (15 % each): at most
    # 22 pods fit; the rest must be refused by Filter, never squeezed in.
    assert 16 <= len(bound) <= 22
    mem: dict[str, int] = defaultdict(int)
    cores: dict[str, int] = defaultdict(int)
    for name in bound:
        annos = world.cluster.pods[("default", name)]["metadata"]["annotations"]
        for ctr in ann.decode_pod_devices(annos[ann.DEVICES_TO_ALLOCATE]):
            for d in ctr:
                mem[d.uuid] += d.usedmem
                cores[d.uuid] += d.usedcores
    for uuid, used in mem.items():
        assert used <= capacity[uuid][0], f"{uuid}: {used} MiB > {capacity[uuid][0]}"
        assert cores[uuid] <= capacity[uuid][1], f"{uuid}: {cores[uuid]} % cores"
    # The extender's own view agrees with what the bound pods carry.
    for cards in world.scheduler.usage().values():
        for c in cards:
            assert c.usedmem <= c.totalmem and c.usedcores <= c.totalcore
    refused = [r for _, _, r, b in outcomes if b is None]
    assert all(r["FailedNodes"] and not r["Error"] for r in refused)
