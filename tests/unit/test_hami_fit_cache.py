"""The scheduler's books stay exact while Filters reserve, pods go and quotas bite.

Each node keeps its cards' usage, charged and credited incrementally, and reuses Fit
results per request shape until its usage changes (``nodes.py``). Upstream rebuilds every
node's usage from every pod on each Filter; this test does exactly that beside the
scheduler, after every step of a random run, and asserts both agree: the usage, and the
node each Filter picks. A drift in the accounting or a stale cached Fit fails it."""

from __future__ import annotations

import random

import pytest

from demos import hami as demo
from gpulab.deviceplugin.hami import node_devices as plugin_devices
from gpulab.deviceplugin.rm import GPUInfo
from gpulab.hami import annotations as ha
from gpulab.hami import filter as filter_mod
from gpulab.hami.device import annotations, container_lists, pod_requests
from gpulab.hami.fake import FakeCluster
from gpulab.hami.nodes import cards_of
from gpulab.hami.pods import collapse_init_usage
from gpulab.hami.scheduler import Scheduler, SchedulerConfig, node_devices
from gpulab.hami.score import GPU_POLICY_ANNOTATION, NODE_POLICY_ANNOTATION, fit_node, options_for
from gpulab.hami.score import pick_node as pick

NODES = 6


def _world() -> tuple[FakeCluster, Scheduler]:
    cluster = FakeCluster()
    for i in range(NODES):
        gpus = [
            GPUInfo(g, f"GPU-{i}-{g}", "NVIDIA A100", 4000 + 2000 * (g % 2), (8, 0), g, 0)
            for g in range(1 + i % 3)
        ]
        devices = plugin_devices(gpus, lambda _u: True, 4)
        cluster.add_node(
            {
                "metadata": {
                    "name": f"node-{i}",
                    "annotations": {ha.NODE_REGISTER: ha.encode_node_devices(devices)},
                },
                "status": {"allocatable": {"nvidia.com/gpu": str(4 * len(gpus))}},
            }
        )
    cluster.add_quota(
        {
            "metadata": {"name": "q", "namespace": "quota"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "9000"}},
        }
    )
    scheduler = Scheduler(cluster, SchedulerConfig())
    cluster.connect(scheduler)
    scheduler.register()
    return cluster, scheduler


def _from_scratch(s: Scheduler, cluster: FakeCluster) -> dict[str, list]:
    """Every node's card usage rebuilt from every pod the scheduler holds (getNodesUsage)."""
    usage = {}
    for name in s.nodes.names():
        cards = cards_of(node_devices(cluster.nodes[name])[0])
        by_id = {c.id: c for c in cards}
        for info in s.pods.all():
            if info.node != name:
                continue
            for share in info.shares:
                card = by_id[share.uuid]
                card.used += share.slots
                card.usedmem += share.usedmem
                card.usedcores += share.usedcores
        usage[name] = cards
    return usage


def _quota_used(s: Scheduler, namespace: str) -> int:
    return sum(
        share.usedmem
        for info in s.pods.all()
        if info.namespace == namespace
        for share in info.shares
    )


@pytest.mark.parametrize("seed", range(12))
def test_incremental_usage_and_cached_fits_match_a_rebuild_from_every_pod(seed: int) -> None:
    rng = random.Random(seed)
    cluster, s = _world()
    names = s.nodes.names()
    live: list[tuple[str, str]] = []
    for step in range(120):
        if live and rng.random() < 0.3:  # a pod goes: its shares are credited back
            ns, name = live.pop(rng.randrange(len(live)))
            cluster.delete_pod(ns, name)
        else:
            ns = rng.choice(["default", "quota"])
            pod = demo.vgpu_pod(f"p{step}", rng.choice([500, 1000, 3000]), rng.choice([0, 10, 50]))
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(
                rng.choice([1, 1, 2])
            )
            pod["metadata"]["namespace"] = ns
            pod["metadata"]["annotations"].update(
                {
                    NODE_POLICY_ANNOTATION: rng.choice(["binpack", "spread"]),
                    GPU_POLICY_ANNOTATION: rng.choice(["binpack", "spread"]),
                }
            )
            pod = cluster.add_pod(pod)
            # what upstream would decide, from usage rebuilt from scratch
            reqs = pod_requests(pod, s.cfg.nvidia)
            opts = options_for(annotations(pod), s.cfg.node_policy, s.cfg.gpu_policy)
            n_init = len(container_lists(pod)[0])
            scratch = _from_scratch(s, cluster)
            used = _quota_used(s, ns)

            def quota(mem: int, _cores: int, ns: str = ns, used: int = used) -> bool:
                return ns != "quota" or used + mem <= 9000

            expected = pick(
                [
                    fit_node(n, scratch[n], reqs, n_init, opts, s.nodes.get(n).extras, quota)
                    for n in names
                ],
                opts.node_policy,
            )
            got = filter_mod.filter(s, {"Pod": pod, "NodeNames": names})
            assert got["Error"] == ""
            if expected is None:
                assert got["NodeNames"] is None, step
            else:
                assert got["NodeNames"] == [expected.node], step
                shares = collapse_init_usage(expected.devices, n_init)
                assert s.pods.get(pod["metadata"]["uid"]).shares == shares
                live.append((ns, pod["metadata"]["name"]))
        scratch = _from_scratch(s, cluster)
        for name in names:
            held = [(c.id, c.used, c.usedmem, c.usedcores) for c in s.nodes.get(name).cards]
            assert held == [(c.id, c.used, c.usedmem, c.usedcores) for c in scratch[name]], step
